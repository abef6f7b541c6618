"""A holder process for test_session.py: a bound session holding two locks and a permit.

    session_holder.py PORT KEY_A KEY_B SEMAPHORE LIMIT

Opens a ``bound=True`` session with a 30 s ttl, takes ``KEY_A`` and ``KEY_B`` (exclusive, no
deadline of their own) and one permit of ``SEMAPHORE`` in it, prints ``held``, then waits to be
killed (exits 1 after 60 s).
"""

import sys
import time

import redis

from redislock_native import Lock, Semaphore, Session

port, key_a, key_b, sem, limit = int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5])
r = redis.Redis(port=port)
session = Session(r, 30, bound=True).open()
assert Lock(r, key_a, 0, session=session).acquire(blocking=False)
assert Lock(r, key_b, 0, session=session).acquire(blocking=False)
assert Semaphore(r, sem, limit, 0, session=session).acquire(blocking=False)
print("held", flush=True)
time.sleep(60)
sys.exit(1)
