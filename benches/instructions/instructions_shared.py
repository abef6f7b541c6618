#!/usr/bin/env python3
"""Server instructions per operation of SHARED acquires against exclusive ones (issue 10's
"uncontended SHARED within 10% of exclusive"), counted by callgrind the way
`make bench-instructions` counts (it reuses instructions.py beside it: the difference of a LONG-
and a SHORT-operation `redis-cli --pipe` run, distinct keys, every reply checked).

    python3 benches/instructions/instructions_shared.py   # about 15 minutes on 2 busy cores

Writes benches/results/instructions_shared.md and keeps per-function profiles under
target/bench-instructions/shared/. Environment as for instructions.py: REDIS_SERVERS,
REDIS_LOCK_MODULE, SETTINGS (default "bare aof+replica"), SHORT/LONG, QUICK=1; a smoke run or
one with SETTINGS, SHORT or LONG set writes under target/bench-instructions/shared/ instead.
"""

import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import instructions as I  # noqa: E402

SHARED = {
    "cycle": I.CONTENDERS["cycle"],
    "shared_cycle": (
        "LOCK.ACQUIRE ... SHARED + LOCK.RELEASE",
        lambda k, sha: [["LOCK.ACQUIRE", k, I.OWNER, I.TTL, "SHARED"],
                        ["LOCK.RELEASE", k, I.OWNER]],
    ),
    "limit_cycle": (
        "LOCK.ACQUIRE ... SHARED LIMIT 4 + LOCK.RELEASE",
        lambda k, sha: [["LOCK.ACQUIRE", k, I.OWNER, I.TTL, "SHARED", "LIMIT", "4"],
                        ["LOCK.RELEASE", k, I.OWNER]],
    ),
    "acquire": I.CONTENDERS["acquire"],
    "shared_acquire": (
        "LOCK.ACQUIRE ... SHARED alone",
        lambda k, sha: [["LOCK.ACQUIRE", k, I.OWNER, I.TTL, "SHARED"]],
    ),
}


def main():
    I.CONTENDERS.update(SHARED)
    # Apart from make bench-instructions' files (its RECOMPUTE=1 rereads those).
    I.OUT = I.OUT / "shared"
    servers = [s.split("=", 1) for s in
               os.environ.get("REDIS_SERVERS", "redis-7.0=/usr/bin/redis-server").split()]
    module = Path(os.environ.get("REDIS_LOCK_MODULE", I.ROOT / "target/release/libredis_lock.so"))
    settings = (os.environ.get("SETTINGS") or ("aof" if I.QUICK else "bare aof+replica")).split()
    I.OUT.mkdir(parents=True, exist_ok=True)
    ops = I.LONG - I.SHORT
    lines = I.table_head(
        f"Server instructions per operation (difference of a {I.LONG}- and a {I.SHORT}-operation "
        f"run under callgrind), by `python3 benches/instructions/instructions_shared.py` on "
        f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}.",
        SHARED,
        ["SHARED / exclusive cycle", "SHARED / exclusive acquire"],
    )
    for name, path in servers:
        for setting in settings:
            r = {}
            for c in SHARED:
                files = [I.OUT / f"callgrind.{name}.{setting}.{c}.{n}" for n in (I.SHORT, I.LONG)]
                short, long_ = (I.one_run(path, module, setting, c, n, f)
                                for n, f in zip((I.SHORT, I.LONG), files))
                r[c] = (long_ - short) / ops
                I.profile(*files, ops, I.OUT / f"profile-{name}-{setting}-{c}.txt")
                print(f"{name:10} {setting:12} {c:15} {r[c]:9.0f} instructions/op", flush=True)
            lines.append(
                f"| {name} ({I.version(path)}) | {setting} | "
                + " | ".join(f"{r[c] / 1000:.1f}k" for c in SHARED)
                + f" | {r['shared_cycle'] / r['cycle']:.2f}x"
                + f" | {r['shared_acquire'] / r['acquire']:.2f}x |")
    # results_dir() is I.OUT (now .../shared) for a smoke run or a subset.
    out = I.results_dir() / "instructions_shared.md"
    out.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    print(f"wrote {out.relative_to(I.ROOT)}")


if __name__ == "__main__":
    main()
