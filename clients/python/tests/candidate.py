"""A candidate process for test_election.py: campaign, lead, write fenced, report a loss.

    candidate.py PORT NAME VALUE TTL_SECONDS [bound|default]

With ``bound`` the leadership is held in a bound session (ttl 30 s: only the process's death ends
it); with ``default`` it is made without ``session=`` (the client's default session: a lock of
TTL_SECONDS renewed by its watchdog, also ended by the process's death); else (``session=None``)
it is a lock of TTL_SECONDS renewed by its watchdog alone. Prints ``leader TERM`` once it
leads, then writes ``VALUE`` to ``NAME:data`` fenced by its term every 20 ms; prints ``lost
REASON`` when the leadership is reported lost and ``refused TERM`` when a fenced write is refused,
then exits 0. Exits 1 if it never leads within 60 s.
"""

import sys
import threading
import time

import redis

from redislock_native import Election, Session, StaleTokenError

port, name, value, ttl = int(sys.argv[1]), sys.argv[2], sys.argv[3], float(sys.argv[4])
bound = sys.argv[5:] == ["bound"]
r = redis.Redis(port=port)
if sys.argv[5:] == ["default"]:
    election = Election(r, name, ttl)
else:
    session = Session(r, 30, bound=True).open() if bound else None
    election = Election(r, name, None if bound else ttl, session=session)
lost = threading.Event()
leadership = election.campaign(value, timeout=60, on_lost=lambda ld: lost.set())
if leadership is None:
    sys.exit(1)
print("leader", leadership.term, flush=True)
while True:
    try:
        leadership.fenced("SET", f"{name}:data", value)
    except StaleTokenError:
        lost.wait(5)
        print("lost", leadership.lost_reason, flush=True)
        print("refused", leadership.term, flush=True)
        sys.exit(0)
    time.sleep(0.02)
