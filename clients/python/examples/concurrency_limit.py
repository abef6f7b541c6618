#!/usr/bin/env python3
"""At most N concurrent calls to a rate-limited API, across processes, with redis-lock.

A counting semaphore is a shared lock with a limit: every call takes one of `--limit` permits
with `Semaphore(r, "limit:<api>", n, ttl).acquire(timeout=...)` from the redislock_native
package, which is one `LOCK.ACQUIRE limit:<api> <owner> <ttl> SHARED LIMIT <n> BLOCK <ms>`,
makes the call and releases the permit. Callers beyond the limit wait in the server's FIFO queue (no polling) and
get a permit the moment one is released or its holder's ttl runs out (a crashed caller's permit
comes back by itself).

Each worker process makes `--calls` calls of `--work-ms` each and reports when each call ran;
the script then computes how many calls were ever in flight at once.

    pip install ./clients/python        # the redislock_native package, from the repository root
    python3 clients/python/examples/concurrency_limit.py --port 6379 --limit 4 --workers 16 --calls 5

prints one line such as

    api=payments-093def25 limit=4 workers=16 calls=80 max_in_flight=4 wait_p50_ms=37.0 wait_p99_ms=139.5 errors=0

and exits 0 only if every call ran and never more than `--limit` at once.
"""

import argparse
import multiprocessing
import os
import socket
import sys
import time
import uuid

import redis
from redislock_native import Semaphore


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=6379)
    p.add_argument("--limit", type=int, default=4, help="permits: calls allowed at once")
    p.add_argument("--workers", type=int, default=16, help="worker processes")
    p.add_argument("--calls", type=int, default=5, help="calls per worker")
    p.add_argument("--work-ms", type=int, default=20, help="how long one call takes")
    p.add_argument("--ttl-ms", type=int, default=10000, help="permit ttl: a crashed caller's permit returns after it")
    p.add_argument("--wait-ms", type=int, default=30000, help="longest wait for a permit")
    p.add_argument("--api", default=None, help="semaphore name (default: a new one per run)")
    args = p.parse_args()
    if min(args.limit, args.workers, args.calls) < 1 or args.work_ms < 0:
        p.error("need --limit, --workers, --calls >= 1 and --work-ms >= 0")
    if args.api is None:
        args.api = "payments-" + uuid.uuid4().hex[:8]
    return args


def worker(index, args, results):
    me = f"caller-{index}@{socket.gethostname()}:{os.getpid()}"
    # redis-py's default client is fine: the wait is one LOCK.ACQUIRE ... BLOCK, sent by the
    # package on a pooled connection whose socket timeout covers the wait, with no retry (a
    # plain execute_command would be cut after redis-py 8's 5 s timeout and re-sent to the
    # back of the queue).
    r = redis.Redis(host=args.host, port=args.port)
    sem = Semaphore(r, f"limit:{args.api}", args.limit, args.ttl_ms / 1000, owner=me)
    try:
        for _ in range(args.calls):
            asked = time.time()
            if not sem.acquire(timeout=args.wait_ms / 1000):
                results.put((me, "timeout", asked, time.time(), time.time()))
                continue
            started = time.time()
            time.sleep(args.work_ms / 1000)  # the API call
            ended = time.time()
            sem.release()
            results.put((me, "ok", asked, started, ended))
    except Exception as e:  # report it: the parent counts one result per call
        print(f"{me}: {e!r}", file=sys.stderr)
        results.put((me, "error", 0.0, 0.0, 0.0))


def max_in_flight(intervals):
    """The largest number of (start, end) intervals open at one moment."""
    events = sorted([(s, 1) for s, _ in intervals] + [(e, -1) for _, e in intervals],
                    key=lambda ev: (ev[0], ev[1]))
    now = most = 0
    for _, step in events:
        now += step
        most = max(most, now)
    return most


def percentile(values, p):
    if not values:
        return 0.0
    values = sorted(values)
    return values[min(len(values) - 1, int(round(p / 100 * (len(values) - 1))))]


def main():
    args = parse_args()
    redis.Redis(host=args.host, port=args.port).ping()  # fail early if no server
    results = multiprocessing.Queue()
    procs = [multiprocessing.Process(target=worker, args=(i, args, results))
             for i in range(args.workers)]
    for p in procs:
        p.start()
    rows = []
    for _ in range(args.workers * args.calls):
        try:
            rows.append(results.get(timeout=args.wait_ms / 1000 + 30))
        except Exception:
            break
    for p in procs:
        p.join(timeout=10)
    ok = [r for r in rows if r[1] == "ok"]
    errors = len(rows) - len(ok)
    missing = args.workers * args.calls - len(rows)
    most = max_in_flight([(r[3], r[4]) for r in ok])
    waits = [(r[3] - r[2]) * 1000 for r in ok]
    print(f"api={args.api} limit={args.limit} workers={args.workers} calls={len(ok)} "
          f"max_in_flight={most} wait_p50_ms={percentile(waits, 50):.1f} "
          f"wait_p99_ms={percentile(waits, 99):.1f} errors={errors + missing}")
    return 0 if errors == 0 and missing == 0 and 1 <= most <= args.limit else 1


if __name__ == "__main__":
    sys.exit(main())
