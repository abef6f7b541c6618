#!/usr/bin/env python3
"""Server instructions per `LOCK.SESSION KEEPALIVE` of a session holding 1, 100 and 10,000 locks,
against `LOCK.EXTEND` of each of N plain locks (issue 19: "flat, within 10% from 1 to 10,000"),
counted by callgrind the way `make bench-instructions` counts (it reuses instructions.py beside
it: start-up, module load and shutdown cancel out in the difference of a long and a short run).

    python3 benches/instructions/instructions_sessions.py    # about 10 minutes on 2 busy cores

Each run starts `redis-server` under `valgrind --tool=callgrind` and sends, through one
`redis-cli --pipe`, the same setup (N `LOCK.ACQUIRE`s, in one session for the keepalive, plain
locks for the extends) and then the calls: SHORT or LONG keepalives, or SHORT // N or LONG // N
rounds of N extends (at least 1 and 2 rounds). A call's instructions are the difference of the
two totals divided by the difference of the calls, so the setup cancels out too. Every reply is
checked (`--pipe` counts errors) and every hold is asserted in place afterwards.

`make bench` runs this too (its `session_keepalive` scenario, which reads the JSON). Environment:
REDIS_SERVERS ("name=path ...", default Redis 7.0 from /usr/bin), REDIS_LOCK_MODULE, SETTINGS
(default "aof": keepalive is a write, so its propagation is counted), HOLDS (default "1 100
10000"), SHORT/LONG (default 5000/25000; QUICK=1: 1000/3000), OUT_DIR (where the table goes:
default benches/results/ for a full run, target/bench-instructions/sessions/ for a smoke run or a
subset). Callgrind files and per-function profiles stay under target/bench-instructions/sessions/.
"""

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import instructions as I  # noqa: E402

HOLDS = [int(n) for n in os.environ.get("HOLDS", "1 100 10000").split()]
SESSION_TTL = "600000"
CONTENDERS = {
    "keepalive": "LOCK.SESSION KEEPALIVE (one call)",
    "extend": "LOCK.EXTEND of each lock (N calls)",
}


def calls(contender, holds):
    """(short, long) calls of a run: keepalives, or rounds of `holds` extends."""
    if contender == "keepalive":
        return I.SHORT, I.LONG
    short = max(1, I.SHORT // holds)
    return short, max(short + 1, I.LONG // holds)


def run(server, module, setting, contender, holds, n, out_file):
    """One callgrind run: the setup for `holds` locks, then `n` calls. Its total instructions."""
    work = Path(tempfile.mkdtemp(prefix="redis-lock-instr-sess-"))
    try:
        port, proc = I.start(server, [module], I.SETTINGS[setting], out_file, work / "log", work)
        keys = [f"bench:sess:{i:06d}" for i in range(holds)]
        if contender == "keepalive":
            sid = I.cli(port, "LOCK.SESSION", "OPEN", SESSION_TTL)
            if not re.fullmatch(r"\{[^}]{1,4}\}[0-9a-f]{32}", sid):
                sys.exit(f"LOCK.SESSION OPEN answered {sid!r}")
            setup = [["LOCK.ACQUIRE", k, I.OWNER, "0", "SESSION", sid] for k in keys]
            work_cmds = [["LOCK.SESSION", "KEEPALIVE", sid]] * n
        else:
            setup = [["LOCK.ACQUIRE", k, I.OWNER, I.TTL] for k in keys]
            work_cmds = [["LOCK.EXTEND", k, I.OWNER, I.TTL] for _ in range(n) for k in keys]
        payload = b"".join(I.resp(c) for c in setup + work_cmds)
        res = subprocess.run(["redis-cli", "-p", str(port), "--pipe"], input=payload,
                             capture_output=True, timeout=1800)
        text = res.stdout.decode(errors="replace")
        m = re.search(r"errors: (\d+), replies: (\d+)", text)
        want = len(setup) + len(work_cmds)
        if not m or int(m.group(1)) != 0 or int(m.group(2)) != want:
            sys.exit(f"{contender} x{holds} on {server} ({setting}): bad replies: {text}")
        if I.cli(port, "DBSIZE") != str(holds):
            sys.exit(f"{contender} x{holds}: DBSIZE is not {holds} after the run")
        if contender == "keepalive":
            info = I.cli(port, "LOCK.SESSION", "INFO", sid).split("\n")
            if info[info.index("holds") + 1] != str(holds):
                sys.exit(f"keepalive x{holds}: LOCK.SESSION INFO says {info}")
        I.cli(port, "SHUTDOWN", "NOSAVE")
        proc.wait(timeout=300)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return I.total(out_file)


def out_dir():
    if os.environ.get("OUT_DIR"):
        return Path(os.environ["OUT_DIR"])
    partial = I.QUICK or any(os.environ.get(v) for v in
                             ("SETTINGS", "HOLDS", "SHORT", "LONG", "REDIS_SERVERS"))
    return I.OUT / "sessions" if partial else I.RESULTS


def main():
    work = I.OUT / "sessions"
    work.mkdir(parents=True, exist_ok=True)
    servers = [s.split("=", 1) for s in
               os.environ.get("REDIS_SERVERS", "redis-7.0=/usr/bin/redis-server").split()]
    module = Path(os.environ.get("REDIS_LOCK_MODULE", I.ROOT / "target/release/libredis_lock.so"))
    settings = os.environ.get("SETTINGS", "aof").split()
    results = []
    for name, path in servers:
        for setting in settings:
            for holds in HOLDS:
                row = {"server": f"{name} ({I.version(path)})", "setting": setting,
                       "holds": holds}
                for c in CONTENDERS:
                    t0 = time.time()
                    ns = calls(c, holds)
                    files = [work / f"callgrind.{name}.{setting}.{c}.{holds}.{n}" for n in ns]
                    short, long_ = (run(path, module, setting, c, holds, n, f)
                                    for n, f in zip(ns, files))
                    per = (long_ - short) / (ns[1] - ns[0])
                    I.profile(*files, ns[1] - ns[0],
                              work / f"profile-{name}-{setting}-{c}-{holds}.txt")
                    row[c] = round(per)
                    print(f"{name:10} {setting:6} {holds:6} holds {c:9} {per:12.0f} "
                          f"instructions/call ({ns[1] - ns[0]} calls difference, "
                          f"{time.time() - t0:.0f} s)", flush=True)
                results.append(row)
    write(results)


def write(results):
    commit = subprocess.run(["git", "-C", str(I.ROOT), "describe", "--always", "--dirty"],
                            capture_output=True, text=True).stdout.strip()
    lines = [
        f"Measured by `python3 benches/instructions/instructions_sessions.py` at {commit} on "
        f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}: server instructions per call "
        f"under `valgrind --tool=callgrind` (the difference of a long and a short run, "
        f"{I.LONG} and {I.SHORT} keepalives; for the extends, rounds of N, at least 1 and 2), "
        f"fed by `redis-cli --pipe`. `aof` is `appendonly yes` + `appendfsync everysec`.",
        "",
        "| server | setting | locks held (N) | " + " | ".join(CONTENDERS.values())
        + " | extends / keepalive | keepalive / keepalive at N = "
        + f"{min(r['holds'] for r in results)} |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in results:
        base = next(b for b in results if b["server"] == r["server"]
                    and b["setting"] == r["setting"] and b["holds"] == min(HOLDS))
        lines.append(
            f"| {r['server']} | {r['setting']} | {r['holds']:,} | {r['keepalive']:,} | "
            f"{r['extend']:,} | {r['extend'] / r['keepalive']:.2f}x | "
            f"{r['keepalive'] / base['keepalive']:.2f}x |")
    out = out_dir()
    out.mkdir(parents=True, exist_ok=True)
    (out / "instructions_sessions.md").write_text("\n".join(lines) + "\n")
    (out / "instructions_sessions.json").write_text(json.dumps(
        {"commit": commit, "short": I.SHORT, "long": I.LONG, "results": results}, indent=2) + "\n")
    print("\n".join(lines))
    # For `make bench`'s session_keepalive scenario, which reads these lines.
    for r in results:
        print("RESULT\t" + "\t".join(str(r[k]) for k in
                                      ("server", "setting", "holds", "keepalive", "extend")))
    print(f"wrote {out / 'instructions_sessions.md'} and instructions_sessions.json")


if __name__ == "__main__":
    main()
