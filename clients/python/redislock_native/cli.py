"""``redislock``: the operator's command for a server with the redis-lock module.

    redislock [--url redis://HOST:PORT/DB] info KEY        who holds KEY, who waits, how long
    redislock sessions                                      every session (LOCK.SESSION LIST)
    redislock kill-session SERIAL                           end one as an expiry would
    redislock waiting [--count N]                           the contended keys (LOCK.WAITING)
    redislock top [--once] [--interval S]                   a live view, refreshed every second

Each subcommand is one or a few module commands, printed as text a person reads; the commands
are in docs/commands.md, so everything here can also be done with ``redis-cli``. ``--url``
defaults to ``$REDIS_URL`` or ``redis://127.0.0.1:6379``. ``sessions`` and ``kill-session``
need an administrator (an ACL user that may run ``CLIENT KILL``).
"""

import argparse
import os
import sys
import time

import redis


def _text(value):
    if isinstance(value, bytes):
        return value.decode("utf-8", "backslashreplace")
    return "nil" if value is None else str(value)


def _fields(entry):
    """A map reply (RESP2 flat pairs or RESP3 dict) as a dict with str keys, in order."""
    if isinstance(entry, list):
        entry = dict(zip(entry[::2], entry[1::2]))
    return {_text(k): v for k, v in entry.items()}


def _table(rows, headers):
    rows = [[_text(c) for c in row] for row in rows]
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(headers)]
    line = lambda cells: "  ".join(c.ljust(w) for c, w in zip(cells, widths)).rstrip()
    return "\n".join([line(headers)] + [line(r) for r in rows])


def info(r, key):
    """``LOCK.INFO key`` for a person: mode, holders (with their session's serial), waiters."""
    reply = r.execute_command("LOCK.INFO", key)
    if reply is None:
        return f"{key}: free"
    f = _fields(reply)
    limit = "" if f.get("limit") is None else f" (limit {f['limit']})"
    out = [f"{key}: {_text(f['mode'])}{limit}, token {f['token']}, ttl {f['ttl']} ms, "
           f"{f['waiters']} waiting"]
    if f.get("delayed") is not None:
        out.append(f"in lock-delay for {f['delayed']} ms")
    holders = [_fields(h) for h in f.get("holders") or []]
    if holders:
        out.append("holders:")
        out.append(_table([[h["owner"], h["token"], h["ttl"], h.get("session", "-")] for h in holders],
                          ["owner", "token", "ttl-ms", "session"]))
    queue = [_fields(w) for w in f.get("queue") or []]
    if queue:
        out.append("waiters (queue order):")
        out.append(_table([[w["owner"], w["mode"], w["client"], w["waited"],
                            "none" if w["timeout"] == -1 else w["timeout"]] for w in queue],
                          ["owner", "mode", "client-id", "waited-ms", "left-ms"]))
    return "\n".join(out)


def sessions(r, count=1000):
    """Every session (``LOCK.SESSION LIST``, page by page), as a table."""
    rows, cursor = [], "0"
    while True:
        cursor, page = r.execute_command("LOCK.SESSION", "LIST", cursor, "COUNT", count)
        cursor = _text(cursor)
        for entry in page:
            s = _fields(entry)
            rows.append([s["serial"], s["user"], s["bound"], s["ttl"], s["lockdelay"], s["holds"]])
        if cursor == "0":
            break
    return _table(rows, ["serial", "user", "bound-client", "ttl-ms", "lockdelay-ms", "holds"]) + \
        f"\n{len(rows)} session(s)"


def kill_session(r, serial):
    released = r.execute_command("LOCK.SESSION", "KILL", serial)
    if released is None:
        return f"no session {serial} on this server"
    return f"session {serial} ended: {released} hold(s) lost (lock-delay applies)"


def _waiting_rows(r, count):
    return [_fields(e) for e in r.execute_command("LOCK.WAITING", "COUNT", count)]


def waiting(r, count=10):
    rows = _waiting_rows(r, count)
    if not rows:
        return "nobody waits"
    return _table([[w["db"], w["key"], w["waiters"], w["oldest"]] for w in rows],
                  ["db", "key", "waiters", "oldest-wait-ms"])


def _lock_info(r):
    return r.info("lock")


def frame(before, after, seconds, contended, server):
    """One screen of ``top``: two ``INFO lock`` samples ``seconds`` apart and the contended keys."""
    rate = lambda name: (after.get(name, 0) - before.get(name, 0)) / seconds if seconds > 0 else 0.0
    lines = [
        f"redislock top - {server} - {time.strftime('%H:%M:%S')}",
        f"locks {after.get('lock_locks', 0)}   waiters {after.get('lock_waiters', 0)} "
        f"on {after.get('lock_waiting_keys', 0)} keys   sessions {after.get('lock_sessions', 0)}   "
        f"keys in lock-delay {after.get('lock_keys_in_lock_delay', 0)}",
        f"grants/s {rate('lock_acquired'):.1f}   handoffs/s {rate('lock_handed_off'):.1f}   "
        f"releases/s {rate('lock_released'):.1f}   expiries/s {rate('lock_expired'):.1f}   "
        f"timeouts/s {rate('lock_timed_out'):.1f}",
        "",
        "most contended keys:",
    ]
    if contended:
        lines.append(_table([[w["db"], w["key"], w["waiters"], w["oldest"]] for w in contended],
                            ["db", "key", "waiters", "oldest-wait-ms"]))
    else:
        lines.append("(nobody waits)")
    return "\n".join(lines)


def top(r, once=False, interval=1.0, count=10, out=sys.stdout, server=""):
    """Refresh every ``interval`` seconds until interrupted; ``once``: one frame, then return."""
    before = _lock_info(r)
    while True:
        time.sleep(interval)
        after = _lock_info(r)
        text = frame(before, after, interval, _waiting_rows(r, count), server)
        if once:
            out.write(text + "\n")
            return
        # Clear the screen and go home, as `watch` does; then the frame.
        out.write("\x1b[H\x1b[2J" + text + "\n")
        out.flush()
        before = after


def main(argv=None):
    parser = argparse.ArgumentParser(prog="redislock", description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", default=os.environ.get("REDIS_URL", "redis://127.0.0.1:6379"),
                        help="the server (default $REDIS_URL or redis://127.0.0.1:6379)")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("info", help="who holds a key and who waits for it (LOCK.INFO)")
    p.add_argument("key")
    sub.add_parser("sessions", help="every session on the server (LOCK.SESSION LIST; administrators)")
    p = sub.add_parser("kill-session", help="end a session as an expiry would (LOCK.SESSION KILL)")
    p.add_argument("serial", type=int)
    p = sub.add_parser("waiting", help="the keys with waiters, most contended first (LOCK.WAITING)")
    p.add_argument("--count", type=int, default=10)
    p = sub.add_parser("top", help="a live view: locks, waiters, sessions, grants/s, contended keys")
    p.add_argument("--once", action="store_true", help="print one frame and exit")
    p.add_argument("--interval", type=float, default=1.0, help="seconds between frames (default 1)")
    p.add_argument("--count", type=int, default=10, help="contended keys shown (default 10)")
    args = parser.parse_args(argv)
    r = redis.Redis.from_url(args.url)
    try:
        if args.command == "info":
            print(info(r, args.key))
        elif args.command == "sessions":
            print(sessions(r))
        elif args.command == "kill-session":
            print(kill_session(r, args.serial))
        elif args.command == "waiting":
            print(waiting(r, args.count))
        elif args.command == "top":
            top(r, once=args.once, interval=args.interval, count=args.count, server=args.url)
    except redis.ResponseError as e:
        print(f"redislock: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
