"""How long the Python client takes to follow a planned ``CLUSTER FAILOVER`` (issue 34).

On a 3-master, 3-replica cluster started by the harness: one session (ttl 3 s, a keepalive every
``KEEPALIVE`` s) holding a lock, and an election observer on a key of the same shard. Each round
sends ``CLUSTER FAILOVER`` to the shard's replica (rounds alternate between the two nodes) and
measures, from the moment that command answered:

- ``promoted``: the replica's ``ROLE`` says master (polled every 2 ms);
- ``keepalive``: the session's first keepalive answered by the new master;
- ``observer``: the observer's first change read from the new master.

It also checks that no hold was lost. A measurement, not a test: run with ``make bench-failover``,
which runs the other clients' programs after it and writes their tables, this one's first, to
benches/results/failover.md (or target/bench/ with QUICK=1). Prints each round on stderr and the
table on stdout.
"""

import json
import os
import pathlib
import random
import statistics
import subprocess
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "clients" / "python"))

import redis  # noqa: E402

from redislock_native import Election, Lock, Session, lock_info  # noqa: E402

QUICK = os.environ.get("QUICK") == "1"
ROUNDS = 1 if QUICK else 4
#: Redis spaces the failovers of one shard: a master votes for one failover of a given master
#: per ``cluster-node-timeout`` x 2, and a replica that ran an election waits x 4 before its next
#: (the harness's timeout is 5 s). Rounds closer than this are refused ("Waiting for votes, but
#: majority still not reached", "Failover attempt expired") while the old master stays paused.
VOTE_SPACING = 21.0
KEEPALIVE = 0.2
PATIENCE = 30.0


def role(port):
    try:
        return redis.Redis(port=port, socket_timeout=2).execute_command("ROLE")
    except redis.ConnectionError:
        return None


def until(what, predicate, every=0.002):
    deadline = time.monotonic() + PATIENCE
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out waiting for {what}")
        time.sleep(every)


class TimedSession(Session):
    """A Session that records when each keepalive succeeded and which node answered it."""

    answered = []
    failed = []

    def _keepalive(self):
        node = self.client.get_node_from_key(self._id).port
        try:
            remaining = super()._keepalive()
        except Exception as e:
            self.failed.append((round(time.monotonic() % 1000, 3), node, repr(e)[:60]))
            raise
        if remaining is not None:
            self.answered.append((time.monotonic(), node))
        return remaining


def main():
    harness = ROOT / "target" / "debug" / "harness"
    proc = subprocess.Popen([str(harness), "cluster", "--masters", "3", "--replicas", "1"],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    nodes = json.loads(proc.stdout.readline())["nodes"]
    ports = [n["port"] for n in nodes]
    dirs = {n["port"]: n["dir"] for n in nodes}
    rows = []
    try:
        rc = redis.RedisCluster(host="127.0.0.1", port=ports[0])
        tag = "{bench-failover}"
        session = TimedSession(rc, 3, key=tag, keepalive_period=KEEPALIVE).open()
        lock = Lock(rc, tag + "held", 0, session=session)
        assert lock.acquire(blocking=False)
        leader = Election(rc, tag + "leader", 3).campaign("bench")
        observation = Election(rc, tag + "leader", 3).observe()
        observation.get(timeout=10)
        last = {}
        for _ in range(ROUNDS):
            old = rc.get_node_from_key(tag).port
            new = next(p for p in ports if (role(p) or [b""])[0] == b"slave" and role(p)[2] == old)
            wait = max(last.get(old, -1e9), last.get(new, -1e9)) + VOTE_SPACING - time.monotonic()
            if wait > 0:
                time.sleep(wait)  # Redis's own vote spacing, not a wait for state (see VOTE_SPACING)
            # A random part of a keepalive period, so that the rounds do not all fall on one phase
            # of the session's keepalive (the spacing is a whole number of periods).
            time.sleep(random.uniform(0, KEEPALIVE))
            new = next(p for p in ports if (role(p) or [b""])[0] == b"slave" and role(p)[2] == old)
            until("a replica in sync", lambda: redis.Redis(port=old).execute_command("WAIT", 1, 1000) == 1)
            assert redis.Redis(port=new).execute_command("CLUSTER", "FAILOVER") == b"OK"
            t0 = time.monotonic()
            last[old] = last[new] = t0
            def log_tail():
                return (pathlib.Path(dirs[new]) / "logfile").read_text()[-1500:]
            try:
                promoted = until("the promotion", lambda: (role(new) or [b""])[0] == b"master" and time.monotonic())
            except TimeoutError:
                print(log_tail())
                raise
            try:
                kept = until("a keepalive on the new master",
                             lambda: next((t for t, n in session.answered if t > t0 and n == new), None))
            except TimeoutError:
                print("failed:", session.failed[-3:], "t0", round(t0 % 1000, 3))
                slot = rc.keyslot(tag)
                for p in ports:
                    try:
                        r = redis.Redis(port=p, socket_timeout=1)
                        owner = [x[2][1] for x in r.execute_command("CLUSTER", "SLOTS") if x[0] <= slot <= x[1]]
                        print(p, r.execute_command("ROLE")[0], "says slot owner", owner)
                    except Exception as e:
                        print(p, repr(e))
                print("startup order", [n.port for n in rc.nodes_manager.startup_nodes.values()])
                print("session:", session.lost_reason, "answered by", session.answered[-3:], "new", new, "old", old)
                raise
            try:
                change = observation.get(timeout=PATIENCE)
            except TimeoutError:
                obs = observation._observer
                f = obs.feed
                print("observer on feed of", f._connection_class and f._kwargs.get("port"), "done", obs.done,
                      "thread", f._thread, "subs", {k: len(v) for k, v in f._core.subs.items()},
                      "watched", f._core.watched, "unchecked", len(f._core.unchecked), "seq", f._core.seq)
                raise
            observed = time.monotonic()
            assert change.leader is not None and change.leader.term == leader.term, change
            holders = lock_info(redis.Redis(port=new), lock.name)["holders"]
            assert [h["token"] for h in holders] == [lock.token], holders
            assert not session.lost and not leader.lost
            rows.append(((promoted - t0) * 1000, (kept - t0) * 1000, (observed - t0) * 1000))
            until("the old master a replica", lambda: (role(old) or [b""])[0] == b"slave")
            # The next round's replica must be in sync, or its CLUSTER FAILOVER times out.
            until("its link up", lambda: redis.Redis(port=old).info("replication").get("master_link_status") == "up")
            # ... and known as a replica to its new master (MFSTART from a node the master does
            # not count as its replica is ignored: the failover would time out).
            def known(master=new, replica=old):
                view = redis.Redis(port=master).execute_command("CLUSTER", "NODES")
                view = view.decode() if isinstance(view, bytes) else view
                me = next(l.split()[0] for l in view.splitlines() if "myself" in l.split()[2])
                return any(l.split()[1].startswith(f"127.0.0.1:{replica}@") and "slave" in l.split()[2]
                           and l.split()[3] == me for l in view.splitlines())
            until("the new master to know its replica", known)
            rc.nodes_manager.initialize()
            print(f"round {len(rows)}: {rows[-1][0]:.0f} / {rows[-1][1]:.0f} / {rows[-1][2]:.0f} ms",
                  file=sys.stderr, flush=True)
        observation.close()
        leader.resign()
        session.close()
        rc.close()
    finally:
        proc.stdin.close()
        proc.wait(timeout=60)

    def line(i, name):
        values = [r[i] for r in rows]
        return (f"| {name} | {statistics.median(values):.0f} | {min(values):.0f} | {max(values):.0f} |")

    server = subprocess.run([os.environ.get("REDIS_SERVER", "/usr/bin/redis-server"), "--version"],
                            capture_output=True, text=True).stdout.split()[2].removeprefix("v=")
    build = pathlib.Path(os.environ.get("REDIS_LOCK_MODULE", "target/debug/x")).parent.name
    text = "\n".join([
        f"Python client following a planned `CLUSTER FAILOVER` ({len(rows)} round{'' if len(rows) == 1 else 's'}, Redis {server}, "
        f"3 masters + 3 replicas on one 2-core machine, module {build} build, session ttl 3 s, "
        f"keepalive every {KEEPALIVE} s, each failover at a random point of that period; "
        "ms from the command's reply; no hold lost in any round). Keepalive: the session's own "
        "keepalive call returning with the new master's answer (a Session subclass records it). "
        "Observer: `Election.observe()`'s first change after the failover: this client reports the "
        "same leader again, read on the new master (`resync`).",
        "",
        "| from `CLUSTER FAILOVER` answered to | median ms | min | max |",
        "|---|---|---|---|",
        line(0, "the replica's `ROLE` is master"),
        line(1, "the session's first keepalive answered by the new master"),
        line(2, "the observer's first change read from the new master"),
    ])
    print(text)


if __name__ == "__main__":
    main()
