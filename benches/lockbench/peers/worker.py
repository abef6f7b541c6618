"""One worker of the peers scenario (benches/lockbench/scenarios/peers.rs), Python libraries.

Each library is used as its README shows:
- `module`: redis-py sending `LOCK.ACQUIRE key owner ttl BLOCK ms` / `LOCK.RELEASE key owner`.
- `redis-py`: redis-py's own `Lock` (`r.lock(name, timeout=...)`, `with lock:`), default
  `sleep=0.1`.
- `python-redis-lock`: `redis_lock.Lock(conn, name, expire=...)`, `with lock:`.

Protocol with the benchmark: print `ready` once connected, wait for `go` on stdin, then:
- `contend`: until `--secs` have passed, want the lock, hold it `--hold-ms`, release; a wait
  still going `--grace` seconds after the end is given up (SIGALRM) and reported as unfinished.
- `hold-and-die`: take the lock with a `--ttl-ms` ttl, print `held`, and exit without releasing.
- `wait-once`: take the lock once (blocking), print the wall-clock ms of the grant, release;
  an exception from the library is reported as `{"error": name}`.
The last line on stdout is one JSON object.
"""

import argparse
import json
import os
import signal
import sys
import time
import uuid

import redis

p = argparse.ArgumentParser()
p.add_argument("--lib", required=True)
p.add_argument("--mode", required=True)
p.add_argument("--port", type=int, required=True)
p.add_argument("--key", required=True)
p.add_argument("--hold-ms", type=float, default=1.0)
p.add_argument("--ttl-ms", type=int, default=10_000)
p.add_argument("--secs", type=float, default=5.0)
p.add_argument("--grace", type=float, default=30.0)
a = p.parse_args()

r = redis.Redis(host="127.0.0.1", port=a.port)
r.ping()
owner = f"worker-{os.getpid()}-{uuid.uuid4()}"


def locker(ttl_ms):
    """A context manager that holds the lock, the library's way."""
    if a.lib == "module":
        class Native:
            def __enter__(self):
                while r.execute_command("LOCK.ACQUIRE", a.key, owner, ttl_ms, "BLOCK", 30000) is None:
                    pass

            def __exit__(self, *exc):
                r.execute_command("LOCK.RELEASE", a.key, owner)
        return Native()
    if a.lib == "redis-py":
        return r.lock(a.key, timeout=ttl_ms / 1000)
    if a.lib == "python-redis-lock":
        import redis_lock
        return redis_lock.Lock(r, a.key, expire=max(1, ttl_ms // 1000))
    sys.exit(f"unknown --lib {a.lib}")


print("ready", flush=True)
if sys.stdin.readline().strip() != "go":
    sys.exit("no go")

if a.mode == "hold-and-die":
    locker(a.ttl_ms).__enter__()
    print(json.dumps({"held_at_ms": time.time() * 1000}), flush=True)
    os._exit(0)

if a.mode == "wait-once":
    signal.alarm(90)  # a bound, should the library never answer
    lock = locker(a.ttl_ms)
    try:
        lock.__enter__()
    except Exception as e:  # reported as the finding it is
        print(json.dumps({"error": type(e).__name__}), flush=True)
        sys.exit(0)
    at = time.time() * 1000
    lock.__exit__(None, None, None)
    print(json.dumps({"granted_at_ms": at}), flush=True)
    sys.exit(0)

start = time.time()
stop = start + a.secs
log = {"grants": [], "unfinished_ms": None, "last_release": start}
want = start


def give_up(*_):
    log["unfinished_ms"] = (time.time() - want) * 1000
    print(json.dumps(log), flush=True)
    os._exit(0)


signal.signal(signal.SIGALRM, give_up)
signal.setitimer(signal.ITIMER_REAL, a.secs + a.grace)
while True:
    want = time.time()
    if want >= stop:
        break
    lock = locker(a.ttl_ms)
    lock.__enter__()
    got = time.time()
    log["grants"].append([got, (got - want) * 1000])
    time.sleep(a.hold_ms / 1000)
    lock.__exit__(None, None, None)
    log["last_release"] = time.time()
signal.setitimer(signal.ITIMER_REAL, 0)
print(json.dumps(log), flush=True)
