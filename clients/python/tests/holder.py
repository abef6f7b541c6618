"""A holder process for test_lock.py: hold a lock with a watchdog, report a loss.

    holder.py PORT KEY TTL_SECONDS

Prints ``held TOKEN`` once granted, then ``lost <reason>`` when the watchdog reports the
loss, and exits 0; exits 1 if nothing is lost within 30 s.
"""

import sys
import threading

import redis

from redislock_native import Lock

port, key, ttl = int(sys.argv[1]), sys.argv[2], float(sys.argv[3])
lost = threading.Event()
lock = Lock(redis.Redis(port=port), key, ttl, watchdog=True, on_lost=lambda lk: lost.set(), feed=False)
assert lock.acquire(timeout=10)
print("held", lock.token, flush=True)
if not lost.wait(30):
    sys.exit(1)
print("lost", lock.lost_reason, flush=True)
