"""kill -9 of a holder process to the next holder's grant, with the Python client's defaults.

    python3 bench/default_session_takeover.py [RUNS]      (from clients/python; default 20 runs)

Starts one server with the module through the workspace's harness (as the tests do: HARNESS,
REDIS_SERVER, REDIS_LOCK_MODULE), then for each run starts a holder process
(``tests/default_holder.py``) that takes its lock as a README shows, queues a waiter here
(``LOCK.ACQUIRE ... BLOCK``, ``session=None``), SIGKILLs the holder and times, on this process's
monotonic clock, from the kill to the waiter's ``acquire()`` returning True. Rows:

- ``Lock(r, name, ttl=30)``: clients/python/README.md's first example (the default session).
- ``Lock(r, name, ttl=5, watchdog=True)``: the example issue 29 timed at 3.5-4.6 s before.
- ``Lock(r, name, ttl=5, watchdog=True, session=None)``: the ttl alone, for reference (3 runs).

Prints p50, p99 (of 20 runs the largest but one is p95; p99 is the largest) and the largest.
"""

import signal
import statistics
import sys
import threading
import time
import uuid
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))
sys.path.insert(0, str(HERE.parent))

from redis.backoff import NoBackoff  # noqa: E402
from redis.retry import Retry  # noqa: E402

from conftest import Server, wait_waiters  # noqa: E402
from redislock_native import Lock  # noqa: E402
from test_default_session import spawn_holder  # noqa: E402


def one_run(server, r, ttl, mode):
    key = f"bench:{uuid.uuid4().hex[:12]}"
    child, _token = spawn_holder(server, key, ttl, mode)
    try:
        waiter = Lock(r, key, 30, session=None)
        result = {}
        thread = threading.Thread(target=lambda: result.update(ok=waiter.acquire(timeout=60), at=time.monotonic()))
        thread.start()
        wait_waiters(r, key, 1)
        killed = time.monotonic()
        child.send_signal(signal.SIGKILL)
        thread.join(70)
        assert result.get("ok") is True, "the waiter was not granted"
        waiter.release()
        return result["at"] - killed
    finally:
        child.kill()
        child.wait()


def percentile(values, p):
    """The nearest-rank percentile."""
    ordered = sorted(values)
    return ordered[max(0, -(-len(ordered) * p // 100) - 1)]


def main():
    runs = int(sys.argv[1]) if len(sys.argv) > 1 else 20
    server = Server()
    r = server.client(retry=Retry(NoBackoff(), 0))
    rows = [("Lock(r, name, ttl=30)", 30, "default", runs),
            ("Lock(r, name, ttl=5, watchdog=True)", 5, "watchdog", runs),
            ("Lock(r, name, ttl=5, watchdog=True, session=None)", 5, "none-watchdog", 3)]
    try:
        print(f"{'holder made as':52} {'runs':>4} {'p50 ms':>9} {'p99 ms':>9} {'max ms':>9}")
        for label, ttl, mode, n in rows:
            took = [one_run(server, r, ttl, mode) * 1000 for _ in range(n)]
            print(f"{label:52} {n:>4} {statistics.median(took):9.1f} {percentile(took, 99):9.1f} {max(took):9.1f}", flush=True)
    finally:
        r.close()
        server.stop()


if __name__ == "__main__":
    main()
