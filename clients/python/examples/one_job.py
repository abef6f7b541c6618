#!/usr/bin/env python3
"""A job that exactly one of N workers runs, with redis-lock and its Python package.

Every worker races for the lock `job:<name>` with a non-blocking
`lock.acquire(blocking=False)` (one `LOCK.ACQUIRE`). A worker that is refused skips: someone else is running the job,
and waiting for it (BLOCK) would only make it run the job a second time
afterwards. The winner checks the `job:<name>:done` marker (a worker that
arrives after the winner has finished and released must skip too), runs the
job, extends its hold while it works, marks the job done and releases.

The job here appends the worker's id to the list `job:<name>:runs`, fenced by
the lock's token (`lock.fenced("RPUSH", ...)`: the push happens only while the
token is the live hold), so the run can be checked afterwards: the list must
hold exactly one id.

    pip install ./clients/python        # the redislock_native package, from the repository root
    python3 clients/python/examples/one_job.py --port 6379 --workers 5

prints one line such as

    job=nightly-3f2a9c01 workers=5 ran=1 runner=worker-2@host:4242 skipped=4 busy=4 done=0 lost=0 errors=0 extends=0

and exits 0 only if exactly one worker ran the job. A job name runs once: run
again with the same `--job` and every worker skips (exit 1).
"""

import argparse
import collections
import multiprocessing
import os
import socket
import sys
import time
import uuid

import redis
from redislock_native import Lock, StaleTokenError


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=6379)
    p.add_argument("--workers", type=int, default=5, help="worker processes (default 5)")
    p.add_argument("--job", default=None, help="job name (default: a new one per run)")
    p.add_argument("--ttl-ms", type=int, default=2000, help="lock hold, renewed every ttl/3")
    p.add_argument("--work-ms", type=int, default=500, help="how long the job takes")
    args = p.parse_args()
    if args.workers < 1 or args.ttl_ms < 3 or args.work_ms < 0:
        p.error("need --workers >= 1, --ttl-ms >= 3, --work-ms >= 0")
    if args.job is None:
        args.job = "nightly-" + uuid.uuid4().hex[:8]
    return args


def worker(index, args, start, results):
    """One worker process: race for the lock, run the job if won, report."""
    # The owner must be unique per holder across every machine that runs workers.
    me = f"worker-{index}@{socket.gethostname()}:{os.getpid()}"
    try:
        run_worker(me, args, start, results)
    except Exception as e:  # report it: the parent waits for one result per worker
        print(f"{me}: {e!r}", file=sys.stderr)
        start.abort()
        results.put((me, "error", 0))


def run_worker(me, args, start, results):
    runs, done = f"job:{args.job}:runs", f"job:{args.job}:done"
    r = redis.Redis(host=args.host, port=args.port)
    lock = Lock(r, f"job:{args.job}", args.ttl_ms / 1000, owner=me)
    r.ping()  # connect before the race, so every worker starts from the same line
    start.wait(timeout=10)

    if not lock.acquire(blocking=False):
        results.put((me, "busy", 0))
        return
    if r.exists(done):
        lock.release()
        results.put((me, "done", 0))
        return

    # The job. It takes longer than one ttl may, so the hold is extended every
    # ttl/3: a worker that stalls for 2/3 of a ttl loses the lock and stops.
    # (Lock(..., watchdog=True) would renew it from a thread instead.)
    try:
        lock.fenced("RPUSH", runs, me)
    except StaleTokenError:
        results.put((me, "lost", 0))
        return
    extends = 0
    finish = time.monotonic() + args.work_ms / 1000
    step = args.ttl_ms / 3000
    while (left := finish - time.monotonic()) > 0:
        time.sleep(min(step, left))
        if time.monotonic() >= finish:
            break
        if not lock.extend():
            results.put((me, "lost", extends))
            return
        extends += 1

    r.set(done, me)
    lock.release()
    results.put((me, "ran", extends))


def main():
    args = parse_args()
    start = multiprocessing.Barrier(args.workers)
    results = multiprocessing.Queue()
    procs = [
        multiprocessing.Process(target=worker, args=(i, args, start, results))
        for i in range(1, args.workers + 1)
    ]
    for p in procs:
        p.start()
    outcomes = [results.get(timeout=30) for _ in procs]
    for p in procs:
        p.join()

    ran = [me for me, what, _ in outcomes if what == "ran"]
    count = collections.Counter(what for _, what, _ in outcomes)
    r = redis.Redis(host=args.host, port=args.port, decode_responses=True)
    runs = r.lrange(f"job:{args.job}:runs", 0, -1)  # the job's own record of who ran it
    ok = len(ran) == 1 and runs == ran and count["lost"] == count["error"] == 0
    print(
        f"job={args.job} workers={args.workers} ran={len(ran)} runner={ran[0] if ran else '-'} "
        f"skipped={count['busy'] + count['done']} busy={count['busy']} done={count['done']} "
        f"lost={count['lost']} errors={count['error']} extends={sum(e for _, _, e in outcomes)}"
        + ("" if ok else f" FAILED runs={runs}")
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
