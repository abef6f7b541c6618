#!/usr/bin/env python3
"""Leader election with redis-lock: three candidates, the leader is killed, the next one leads.

Each candidate is a process that opens a bound session (``Session(r, 30, bound=True)``: it ends
the moment the process's connection closes) and campaigns with ``Election(r, name,
session=...).campaign(value)``: one ``LOCK.ACQUIRE name value 0 SESSION id BLOCK 0``, a place in
the server's FIFO queue. The leader's term is its fencing token. This script starts the
candidates, observes the election (``Election.observe()``, the key's change feed) and prints every
change; it SIGKILLs each leader in turn, and asks the last one to resign (SIGTERM), so the
observer sees "no leader" at the end.

    pip install ./clients/python        # the redislock_native package, from the repository root
    python3 clients/python/examples/leader_election.py --port 6379

prints the changes as they come, such as

    change leader=cand-1 term=3678... resync=no
    killed cand-1 (SIGKILL)
    change leader=cand-2 term=3678... resync=no
    ...
    change leader=none resync=no

then one summary line

    election=leader-0c1f... candidates=3 leaders=cand-1,cand-2,cand-3 terms_increasing=yes no_leader_at_end=yes takeover_ms_max=4.1

and exits 0 only if every candidate led once, in queue order, with growing terms, and the
observer saw each change.
"""

import argparse
import os
import signal
import subprocess
import sys
import time
import uuid

import redis
from redislock_native import Election, Session


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=6379)
    p.add_argument("--candidates", type=int, default=3)
    p.add_argument("--name", default=None, help="election key (default: a new one per run)")
    p.add_argument("--candidate", default=None, help=argparse.SUPPRESS)  # run as one candidate
    args = p.parse_args()
    if args.candidates < 2:
        p.error("need --candidates >= 2")
    if args.name is None:
        args.name = "leader-" + uuid.uuid4().hex[:8]
    return args


def candidate(args):
    """One candidate: campaign in a bound session, lead until killed, resign on SIGTERM."""
    r = redis.Redis(host=args.host, port=args.port)
    session = Session(r, 30, bound=True).open()
    election = Election(r, args.name, session=session)
    leadership = election.campaign(args.candidate)

    def resign(*_):
        leadership.resign()
        session.close()
        sys.exit(0)

    signal.signal(signal.SIGTERM, resign)
    print(f"{args.candidate} leads term={leadership.term}", file=sys.stderr, flush=True)
    while True:
        time.sleep(1)  # a real leader works here, its writes fenced by leadership.term


def queued(r, name):
    info = r.execute_command("LOCK.INFO", name)
    if info is None:
        return 0
    fields = info if isinstance(info, dict) else dict(zip(info[::2], info[1::2]))
    return fields.get(b"waiters", fields.get("waiters", 0))


def main():
    args = parse_args()
    if args.candidate is not None:
        return candidate(args)
    r = redis.Redis(host=args.host, port=args.port)
    election = Election(r, args.name)
    values = [f"cand-{i + 1}" for i in range(args.candidates)]
    procs = {}
    failures = []
    leaders, terms, takeovers = [], [], []
    with election.observe() as changes:
        first = changes.get(10)
        if first.leader is not None:
            failures.append(f"{args.name} had a leader before the candidates started")
        try:
            # One at a time, so the queue order is known: cand-1 leads, cand-2 and cand-3 wait.
            for i, value in enumerate(values):
                procs[value] = subprocess.Popen([sys.executable, __file__, "--host", args.host, "--port",
                                                 str(args.port), "--name", args.name, "--candidate", value])
                deadline = time.monotonic() + 20
                while (queued(r, args.name) < i) if i else (election.leader() is None):
                    if time.monotonic() > deadline:
                        raise RuntimeError(f"{value} never campaigned")
                    time.sleep(0.005)
            killed_at = None
            while True:
                change = changes.get(20)
                leader = change.leader
                print(f"change leader={leader.value if leader else 'none'}"
                      + (f" term={leader.term}" if leader else "")
                      + f" resync={'yes' if change.resync else 'no'}", flush=True)
                if leader is None:
                    break
                if killed_at is not None:
                    takeovers.append((time.monotonic() - killed_at) * 1000)
                leaders.append(leader.value)
                terms.append(leader.term)
                proc = procs[leader.value]
                if len(leaders) < len(values):
                    proc.send_signal(signal.SIGKILL)
                    killed_at = time.monotonic()
                    print(f"killed {leader.value} (SIGKILL)", flush=True)
                else:
                    proc.send_signal(signal.SIGTERM)  # the last one resigns
                    killed_at = None
                    print(f"asked {leader.value} to resign (SIGTERM)", flush=True)
        finally:
            for proc in procs.values():
                if proc.poll() is None:
                    proc.kill()
                proc.wait()
    if leaders != values:
        failures.append(f"leaders {leaders}, expected {values} in queue order")
    increasing = all(a < b for a, b in zip(terms, terms[1:]))
    if not increasing:
        failures.append(f"terms not increasing: {terms}")
    print(f"election={args.name} candidates={len(values)} leaders={','.join(leaders)} "
          f"terms_increasing={'yes' if increasing else 'no'} no_leader_at_end=yes "
          f"takeover_ms_max={max(takeovers):.1f}", flush=True)
    for failure in failures:
        print(failure, file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
