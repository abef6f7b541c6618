"""A holder process for test_default_session.py and bench/default_session_takeover.py: a lock
taken as the README's first example takes it, then waits to be killed.

    default_holder.py PORT KEY TTL_SECONDS [default|none|watchdog|none-watchdog] [CLIENT_NAME]

``default`` (the default): ``Lock(r, KEY, ttl=TTL)``, no ``session=``: the client's default
session. ``watchdog``: the same with ``watchdog=True``. ``none``: ``session=None``, the ttl
alone; ``none-watchdog``: that with ``watchdog=True``. ``CLIENT_NAME`` names the client's pooled connections (``client_name=``). Prints ``held
TOKEN``, then exits 1 after 60 s if nobody killed it.
"""

import sys
import time

import redis

from redislock_native import Lock

port, key, ttl = int(sys.argv[1]), sys.argv[2], float(sys.argv[3])
mode = sys.argv[4] if len(sys.argv) > 4 else "default"
name = sys.argv[5] if len(sys.argv) > 5 else None
r = redis.Redis(port=port, client_name=name)
if mode == "none":
    lock = Lock(r, key, ttl=ttl, session=None)
elif mode == "none-watchdog":
    lock = Lock(r, key, ttl=ttl, watchdog=True, session=None)
elif mode == "watchdog":
    lock = Lock(r, key, ttl=ttl, watchdog=True)
else:
    lock = Lock(r, key, ttl=ttl)
assert lock.acquire(timeout=30)
print("held", lock.token, flush=True)
time.sleep(60)
sys.exit(1)
