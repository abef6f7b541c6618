"""``redislock``, the operator's command (issue 32), against a real server: ``info``,
``sessions``, ``kill-session``, ``waiting`` and ``top`` (``--once``, and the live view read back
from a terminal under tmux). Run as ``python -m redislock_native.cli``, the module the
``redislock`` console entry point calls."""

import os
import re
import shutil
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest
from redis.backoff import NoBackoff
from redis.retry import Retry

from conftest import wait_until

PACKAGE = Path(__file__).resolve().parents[1]


def redislock(server, *args, check=True):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(PACKAGE), os.environ.get("PYTHONPATH", "")]))
    done = subprocess.run([sys.executable, "-m", "redislock_native.cli",
                           "--url", f"redis://127.0.0.1:{server.port}", *map(str, args)],
                          capture_output=True, text=True, env=env, timeout=30)
    if check:
        assert done.returncode == 0, done.stderr
    return done


def block_on(server, key, owner, timeout_ms):
    """A waiter on its own connection; returns once the server counts it blocked."""
    r = server.client()
    before = r.info("clients")["blocked_clients"]
    c = server.client(retry=Retry(NoBackoff(), 0), socket_timeout=None, single_connection_client=True)
    client_id = c.client_id()  # of the one connection the wait is sent on
    t = threading.Thread(target=lambda: c.execute_command("LOCK.ACQUIRE", key, owner, 5000, "BLOCK", timeout_ms),
                         daemon=True)
    t.start()
    wait_until("the waiter to block", lambda: r.info("clients")["blocked_clients"] == before + 1)
    return client_id, t


def test_the_console_entry_point_is_the_cli():
    tomllib = pytest.importorskip("tomllib")
    project = tomllib.loads((PACKAGE / "pyproject.toml").read_text())
    assert project["project"]["scripts"] == {"redislock": "redislock_native.cli:main"}


@pytest.mark.own_server
def test_info_names_the_session_and_each_waiter(server):
    r = server.client()
    key = f"cli:{uuid.uuid4().hex[:8]}"
    sid = r.execute_command("LOCK.SESSION", "OPEN", 30000)
    token = r.execute_command("LOCK.ACQUIRE", key, "holder", 0, "SESSION", sid)
    first, t1 = block_on(server, key, "w1", 0)
    second, t2 = block_on(server, key, "w2", 20000)
    (_, [entry]) = r.execute_command("LOCK.SESSION", "LIST")
    fields = entry if isinstance(entry, dict) else dict(zip(entry[::2], entry[1::2]))
    serial = fields[b"serial"]
    out = redislock(server, "info", key).stdout.splitlines()
    assert out[0] == f"{key}: exclusive, token {token}, ttl -1 ms, 2 waiting"
    assert out[1] == "holders:"
    assert out[2].split() == ["owner", "token", "ttl-ms", "session"]
    assert out[3].split() == ["holder", str(token), "-1", str(serial)]
    assert out[4] == "waiters (queue order):"
    assert out[5].split() == ["owner", "mode", "client-id", "waited-ms", "left-ms"]
    w1, w2 = out[6].split(), out[7].split()
    assert (w1[:3], w1[4]) == (["w1", "exclusive", str(first)], "none")
    assert w2[:3] == ["w2", "exclusive", str(second)]
    assert 0 < int(w2[4]) <= 20000
    assert sid.decode() not in "\n".join(out)
    assert redislock(server, "info", "cli:free").stdout == "cli:free: free\n"
    r.execute_command("LOCK.SESSION", "CLOSE", sid)
    t1.join()
    r.execute_command("LOCK.RELEASE", key, "w1")
    t2.join()


@pytest.mark.own_server
def test_sessions_and_kill_session(server):
    r = server.client()
    sid = r.execute_command("LOCK.SESSION", "OPEN", 30000, "LOCKDELAY", 100)
    r.execute_command("LOCK.ACQUIRE", "cli:k", "me", 0, "SESSION", sid)
    out = redislock(server, "sessions").stdout.splitlines()
    assert out[0].split() == ["serial", "user", "bound-client", "ttl-ms", "lockdelay-ms", "holds"]
    row = out[1].split()
    assert (row[1], row[2], row[4], row[5]) == ("default", "nil", "100", "1")
    assert out[2] == "1 session(s)"
    serial = row[0]
    assert redislock(server, "kill-session", serial).stdout == \
        f"session {serial} ended: 1 hold(s) lost (lock-delay applies)\n"
    assert redislock(server, "kill-session", serial).stdout == f"no session {serial} on this server\n"
    assert redislock(server, "sessions").stdout.splitlines()[1:] == ["0 session(s)"]
    assert r.execute_command("LOCK.SESSION", "KEEPALIVE", sid) is None
    # A user that is no administrator is told so, with the exit status 1.
    r.acl_setuser("app", enabled=True, passwords=["+pw"], keys=["*"], commands=["+@all", "-@admin"])
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(PACKAGE), os.environ.get("PYTHONPATH", "")]))
    refused = subprocess.run([sys.executable, "-m", "redislock_native.cli",
                              "--url", f"redis://app:pw@127.0.0.1:{server.port}", "sessions"],
                             capture_output=True, text=True, env=env, timeout=30)
    assert refused.returncode == 1
    # The server's refusal where module commands have ACL categories, the module's on Redis 7.0.
    assert refused.stderr.startswith("redislock: ") and (
        "'lock.session|list'" in refused.stderr
        or "LOCK.SESSION LIST is for administrators" in refused.stderr), refused.stderr


@pytest.mark.own_server
def test_waiting_lists_the_contended_keys(server):
    r = server.client()
    assert redislock(server, "waiting").stdout == "nobody waits\n"
    r.execute_command("LOCK.ACQUIRE", "cli:busy", "h", 60000)
    r.execute_command("LOCK.ACQUIRE", "cli:calm", "h", 60000)
    threads = [block_on(server, "cli:busy", f"b{i}", 0)[1] for i in range(2)]
    threads.append(block_on(server, "cli:calm", "c", 0)[1])
    out = redislock(server, "waiting").stdout.splitlines()
    assert out[0].split() == ["db", "key", "waiters", "oldest-wait-ms"]
    assert [line.split()[:3] for line in out[1:]] == [["0", "cli:busy", "2"], ["0", "cli:calm", "1"]]
    r.delete("cli:busy", "cli:calm")
    # b0 has cli:busy now; its release hands it to b1 (no wait for b0's ttl).
    wait_until("b0 to release", lambda: r.execute_command("LOCK.RELEASE", "cli:busy", "b0") == 1)
    for t in threads:
        t.join()


@pytest.mark.own_server
def test_top_once_prints_one_frame(server):
    r = server.client()
    r.execute_command("LOCK.ACQUIRE", "cli:top", "h", 60000)
    _, t = block_on(server, "cli:top", "w", 0)
    r.execute_command("LOCK.SESSION", "OPEN", 30000)
    out = redislock(server, "top", "--once", "--interval", "0.2").stdout.splitlines()
    assert out[0].startswith(f"redislock top - redis://127.0.0.1:{server.port} - ")
    assert out[1].split() == ["locks", "1", "waiters", "1", "on", "1", "keys", "sessions", "1",
                              "keys", "in", "lock-delay", "0"]
    assert re.fullmatch(r"grants/s \d+\.\d   handoffs/s \d+\.\d   releases/s \d+\.\d   "
                        r"expiries/s \d+\.\d   timeouts/s \d+\.\d", out[2]), out[2]
    assert out[4] == "most contended keys:"
    assert out[6].split()[:3] == ["0", "cli:top", "1"]
    r.delete("cli:top")
    t.join()


@pytest.mark.own_server
@pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed: the live view is not driven")
def test_top_live_view_in_a_terminal(server):
    r = server.client()
    r.execute_command("LOCK.ACQUIRE", "cli:live", "h", 60000)
    _, t = block_on(server, "cli:live", "w", 0)
    name = f"redislock-top-{uuid.uuid4().hex[:8]}"
    env_path = os.pathsep.join([str(PACKAGE), os.environ.get("PYTHONPATH", "")])
    command = (f"PYTHONPATH={env_path} {sys.executable} -m redislock_native.cli "
               f"--url redis://127.0.0.1:{server.port} top --interval 0.2")
    subprocess.run(["tmux", "new-session", "-d", "-s", name, "-x", "120", "-y", "30", command], check=True)
    try:
        def screen():
            return subprocess.run(["tmux", "capture-pane", "-p", "-t", name],
                                  capture_output=True, text=True).stdout
        wait_until("a frame with the contended key", lambda: "cli:live" in screen())
        frame = screen()
        assert "locks 1   waiters 1 on 1 keys" in frame, frame
        # Grants show up in a later frame: a grant per acquire, counted per second.
        for i in range(20):
            r.execute_command("LOCK.ACQUIRE", f"cli:g{i}", "h", 60000)
        wait_until("grants/s above zero", lambda: re.search(r"grants/s [1-9]", screen()) is not None)
        # One frame on the screen at a time: the view clears before it draws.
        assert screen().count("redislock top -") == 1
    finally:
        subprocess.run(["tmux", "kill-session", "-t", name])
    r.delete("cli:live")
    t.join()


@pytest.mark.own_server
def test_a_bound_sessions_connection_is_named_after_its_serial(server):
    from redislock_native import Session

    r = server.client()
    with Session(r, 30.0, bound=True) as s:
        (_, [entry]) = r.execute_command("LOCK.SESSION", "LIST")
        fields = entry if isinstance(entry, dict) else dict(zip(entry[::2], entry[1::2]))
        serial, bound = fields[b"serial"], fields[b"bound"]
        assert s.serial == serial
        line = next(c for c in r.client_list() if int(c["id"]) == bound)
        assert line["name"] == f"redislock-session-{serial}"
        assert s._id not in str(r.client_list())


@pytest.mark.own_server
def test_an_async_bound_sessions_connection_is_named_too(server):
    import asyncio

    from redislock_native import AsyncSession

    async def main():
        a = server.aclient()
        async with AsyncSession(a, 30.0, bound=True) as s:
            names = [c["name"] for c in server.client().client_list()]
            assert f"redislock-session-{s.serial}" in names
            assert s.serial is not None
        await a.aclose() if hasattr(a, "aclose") else await a.close()

    asyncio.run(main())
