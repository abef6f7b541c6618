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

Then ``runs`` blips: the holder process lives, its default session's bound connection is ended
with ``CLIENT KILL`` (the server-side twin of a proxy or network reset), and the row says in how
many the hold was still the holder's two seconds later (``LOCK.FENCE key token``) and how long the
client took to ``ATTACH`` the session on a new connection (``LOCK.SESSION LIST``'s ``bound``).

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
from redislock_native import Lock, lock_info  # noqa: E402
from redislock_native.session import _fields  # noqa: E402
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


def bound_of(r, serial):
    """The client id ``serial``'s session is bound to (``LOCK.SESSION LIST``), or None."""
    cursor = "0"
    while True:
        cursor, entries = r.execute_command("LOCK.SESSION", "LIST", cursor, "COUNT", 1000)
        for entry in entries:
            fields = _fields(entry)
            if fields["serial"] == serial:
                return fields["bound"]
        if cursor in (b"0", "0"):
            return None


def one_blip(server, r):
    """CLIENT KILL of a live holder's bound connection: (hold kept?, ms to the re-ATTACH)."""
    key = f"bench:{uuid.uuid4().hex[:12]}"
    child, token = spawn_holder(server, key, 30, "default")
    try:
        serial = lock_info(r, key)["holders"][0]["session"]
        old = bound_of(r, serial)
        killed = time.monotonic()
        assert r.client_kill_filter(_id=old) == 1
        attached = None
        while time.monotonic() - killed < 2.0:  # four graces: long past the server's end of it
            now = bound_of(r, serial)
            if attached is None and now not in (None, old):
                attached = time.monotonic() - killed
            time.sleep(0.001)
        kept = r.execute_command("LOCK.FENCE", key, token) == 1
        return kept and attached is not None, attached
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
        blips = [one_blip(server, r) for _ in range(runs)]
        kept = sum(ok for ok, _ in blips)
        took = [t * 1000 for ok, t in blips if ok]
        label = "CLIENT KILL of its bound connection, process alive"
        print(f"{label:52} {runs:>4} holds kept {kept}/{runs}; re-attached p50 "
              f"{statistics.median(took):.1f} ms, p99 {percentile(took, 99):.1f} ms, max {max(took):.1f} ms"
              if took else f"{label:52} {runs:>4} holds kept 0/{runs}", flush=True)
    finally:
        r.close()
        server.stop()


if __name__ == "__main__":
    main()
