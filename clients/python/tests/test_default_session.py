"""The client's default session (``redislock_native.default_session``) against a real server.

A lock made without ``session=`` joins its client's one bound session: a holder *process* killed
with SIGKILL hands its lock on when the server sees its connection close, long before the hold's
ttl; ``session=None`` keeps the ttl-only hold; one session per client (and per cluster node)
whatever the number of locks; closing the client closes it; asyncio the same; an Election made
without a session elects the next leader when the leader's process is killed.

Whether a hold was handed on by the session or by its ttl is read from the server's clock
(``TIME``) and the old hold's ttl (``LOCK.INFO``), never from how long the test waited.
"""

import asyncio
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from redis.backoff import NoBackoff
from redis.retry import Retry

from conftest import await_until, command_calls, wait_until, wait_waiters
from redislock_native import (
    AsyncElection, AsyncLock, AsyncMultiLock, AsyncReadWriteLock, AsyncSemaphore, Election, Lock,
    MultiLock, ReadWriteLock, Semaphore, default_session, lock_info,
)
from redislock_native.session import _fields

HERE = Path(__file__).resolve().parent
HOLDER = HERE / "default_holder.py"


def no_retry_client(server, **kwargs):
    return server.client(retry=Retry(NoBackoff(), 0), **kwargs)


def spawn_holder(server, key, ttl, mode="default", name=""):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(HERE.parent), os.environ.get("PYTHONPATH", "")]))
    args = [sys.executable, str(HOLDER), str(server.port), key, str(ttl), mode] + ([name] if name else [])
    child = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    line = child.stdout.readline().split()
    assert line[:1] == ["held"], f"holder: {line} {child.stderr.read() if child.poll() is not None else ''}"
    return child, int(line[1])


def server_ms(client):
    """The server's clock in ms (``TIME``)."""
    seconds, micros = client.time()
    return seconds * 1000 + micros // 1000


def holder_ttl(client, key):
    """The ttl in ms left of ``key``'s exclusive hold (``LOCK.INFO``)."""
    return lock_info(client, key)["ttl"]


def waiting(lock, timeout=20):
    result = {}
    thread = threading.Thread(target=lambda: result.update(granted=lock.acquire(timeout=timeout)))
    thread.start()
    return thread, result


def session_info(client, sid):
    """``LOCK.SESSION INFO`` as a dict (str keys), whatever the reply's shape."""
    return _fields(client.execute_command("LOCK.SESSION", "INFO", sid))


def sessions(client):
    return client.info("lock")["lock_sessions"]


def session_list(client):
    """``LOCK.SESSION LIST``: every session on the node, all pages."""
    cursor, found = "0", []
    while True:
        cursor, page = client.execute_command("LOCK.SESSION", "LIST", cursor, "COUNT", 1000)
        found += page
        cursor = cursor.decode() if isinstance(cursor, bytes) else cursor
        if cursor == "0":
            return found


def serials(client):
    return {dict(zip(e[::2], e[1::2]))[b"serial"] if isinstance(e, list) else e[b"serial"] for e in session_list(client)}


# --- a process killed ----------------------------------------------------------------------


def test_killed_holder_process_is_handed_on_long_before_its_ttl(server, key):
    # The README's first example in a process of its own: Lock(r, name, ttl=30), no session=.
    # SIGKILL: the waiter is granted while the dead hold still had more than 20 of its 30 s.
    r = no_retry_client(server)
    child, token = spawn_holder(server, key, 30)
    try:
        assert lock_info(r, key)["token"] == token
        waiter = Lock(r, key, 30, session=None)
        thread, result = waiting(waiter)
        wait_waiters(r, key, 1)
        left_ms, at_ms = holder_ttl(r, key), server_ms(r)
        ended = ended_uncleanly(r)
        child.send_signal(signal.SIGKILL)
        thread.join(25)
        granted_at = server_ms(r)
        assert result["granted"] is True
        assert waiter.token > token
        # The old hold's ttl left at the grant, by the server's clock: far from run out.
        assert left_ms - (granted_at - at_ms) > 20_000, (left_ms, granted_at - at_ms)
        assert ended_uncleanly(r) == ended + 1
        assert waiter.release()
    finally:
        child.kill()
        child.wait()
        r.close()


@pytest.mark.parametrize("mode", ["default", "watchdog"])
def test_hold_keeps_its_own_ttl_in_the_default_session(r, key, mode):
    # The hold's deadline is its ttl (PTTL), the session's serial is on it, and a watchdog or
    # extend() renews it as without a session.
    lock = Lock(r, key, 5, watchdog=(mode == "watchdog"), watchdog_period=0.2)
    assert lock.acquire()
    assert isinstance(lock.session, default_session.DefaultSession)
    holder = lock_info(r, key)["holders"][0]
    assert holder["session"] == lock.session.serial
    assert 4000 < r.pttl(key) <= 5000
    assert lock.extend(20)
    assert 19000 < r.pttl(key) <= 20000
    assert lock.release()
    assert lock_info(r, key) is None


def test_session_none_keeps_the_ttl_behaviour(server, key):
    # session=None: the holder's death frees nothing; the hold lives out its ttl.
    r = no_retry_client(server)
    name = f"holder-{key.split(':')[1]}"
    child, token = spawn_holder(server, key, 30, "none", name)
    try:
        assert "session" not in lock_info(r, key)["holders"][0]
        child.send_signal(signal.SIGKILL)
        child.wait()
        # The server has seen every connection of the holder close.
        wait_until("the holder's connections closed",
                   lambda: all(c.get("name") != name for c in r.client_list()))
        assert lock_info(r, key)["token"] == token and holder_ttl(r, key) > 20_000
        waiter = Lock(r, key, 30, session=None)
        assert waiter.acquire(blocking=False) is False
        assert waiter.session is None
    finally:
        child.kill()
        child.wait()
        r.delete(key)
        r.close()


def test_lock_delay_means_no_default_session(r, key):
    lock = Lock(r, key, 5, lock_delay=0.1)
    assert lock.acquire()
    assert lock.session is None and "session" not in lock_info(r, key)["holders"][0]
    assert lock.release()


# --- one per client ------------------------------------------------------------------------


@pytest.mark.own_server  # counts every session on the server
def test_one_default_session_per_client_closed_with_the_client(server, key):
    r = no_retry_client(server)
    other = no_retry_client(server)
    before = sessions(r)
    closed = r.info("lock")["lock_sessions_closed"]
    locks = [
        Lock(r, f"{key}:a", 5),
        Lock(r, f"{key}:b", 5, watchdog=True),
        Semaphore(r, f"{key}:sem", 2, 5),
        ReadWriteLock(r, f"{key}:rw", 5).read,
        MultiLock(r, [f"{key}:m1", f"{key}:m2"], 5),
    ]
    for lock in locks:
        assert lock.acquire(blocking=False)
    leader = Election(r, f"{key}:e").campaign("me", timeout=5)
    assert leader is not None
    # One session for all six holds of the client; another client has its own.
    assert sessions(r) == before + 1
    session = locks[0].session
    assert all(lock.session is session for lock in locks) and leader.lock.session is session
    assert session.serial in serials(r)
    assert session_info(r, session.id)["holds"] == 7  # holds: 5 locks, 2 keys of MultiLock
    named = [c for c in r.client_list() if c.get("name") == f"redislock-session-{session.serial}"]
    assert len(named) == 1
    theirs = Lock(other, f"{key}:c", 5)
    assert theirs.acquire(blocking=False)
    assert sessions(r) == before + 2 and theirs.session is not session
    # Closing the client closes its default session: every hold released at once.
    r.close()
    assert session.closed
    assert sessions(other) == before + 1
    assert other.info("lock")["lock_sessions_closed"] == closed + 1
    for name in (f"{key}:a", f"{key}:b", f"{key}:sem", f"{key}:rw", f"{key}:m1", f"{key}:e"):
        assert other.execute_command("LOCK.INFO", name) is None, name
    assert all(lock.token is None for lock in locks)
    # The client used again: a new default session.
    again = Lock(r, f"{key}:a", 5)
    assert again.acquire(blocking=False)
    assert again.session is not session and sessions(other) == before + 2
    other.close()
    r.close()
    assert sessions(server.client()) == before


def test_default_session_connection_killed_without_grace_reports_the_loss(server, key, monkeypatch):
    monkeypatch.setattr(default_session, "DEFAULT_GRACE", 0)  # a module without GRACE
    # Today's module has no GRACE: the default session ends with its bound connection, and every
    # hold reports it as an explicit session's would; the next acquire opens a new session.
    r = no_retry_client(server)
    lost = []
    lock = Lock(r, key, 30, on_lost=lost.append, feed=False)
    assert lock.acquire()
    session = lock.session
    assert session._grace_ms is None
    assert r.client_kill_filter(_id=session_info(r, session.id)["bound"]) == 1
    wait_until("the loss reported", lambda: lost == [lock])
    assert lock.lost_reason.startswith("session lost: connection lost")
    assert lock_info(r, key) is None  # the session ended: its hold with it
    assert lock.acquire(blocking=False)
    assert lock.session is not session and lock.session.id != session.id
    assert lock.release()
    r.close()


def test_waiter_whose_default_session_ends_queues_again_in_a_new_one(server, key, monkeypatch):
    monkeypatch.setattr(default_session, "DEFAULT_GRACE", 0)  # a module without GRACE
    # Without GRACE, the waiter's session ends with its connection and the server answers the
    # waiter "the session ended while the client waited": the acquire queues again in a new
    # default session (at the back) and is granted when the holder releases.
    r = no_retry_client(server)
    check = no_retry_client(server)
    holder = Lock(check, key, 30, session=None)
    assert holder.acquire()
    waiter = Lock(r, key, 30)
    waiter.session = default_session.session_for(r, key)  # opened before the wait, to kill it
    old = waiter.session
    assert old._grace_ms is None
    ended = check.info("lock")["lock_sessions_disconnected"]
    thread, result = waiting(waiter)
    wait_waiters(check, key, 1)
    assert check.client_kill_filter(_id=session_info(check, old.id)["bound"]) == 1
    wait_until("the session ended", lambda: check.info("lock")["lock_sessions_disconnected"] == ended + 1)
    wait_until("the waiter queued again", lambda: waiter.session is not old)
    wait_waiters(check, key, 1)
    first = holder.token
    assert holder.release()
    thread.join(10)
    assert result["granted"] is True and waiter.token > first
    assert lock_info(check, key)["holders"][0]["session"] == waiter.session.serial
    assert waiter.release()
    r.close()
    check.close()


def test_default_session_survives_a_blip_with_grace(server, key):
    r = no_retry_client(server)
    lost = []
    lock = Lock(r, key, 30, on_lost=lost.append, feed=False)
    assert lock.acquire()
    session = lock.session
    assert session._grace_ms == 500
    old = session_info(r, session.id)["bound"]
    assert r.client_kill_filter(_id=old) == 1
    wait_until("re-attached", lambda: session_info(r, session.id)["bound"] not in (None, old))
    assert lost == [] and not session.lost
    assert lock_info(r, key)["token"] == lock.token
    assert lock.release()
    r.close()


def test_reattach_after_a_blip_finds_the_session_ended_without_grace(server, key, monkeypatch):
    monkeypatch.setattr(default_session, "DEFAULT_GRACE", 0)  # a module without GRACE
    # The re-ATTACH path a blip takes once the server keeps a grace, run against today's module
    # by telling the session it has one: after the CLIENT KILL the keepalive sends ATTACH on a new
    # connection at once; the server (no grace) ended the session, answers nil, and the loss is
    # reported as "ended".
    r = no_retry_client(server)
    check = no_retry_client(server)
    lost = []
    lock = Lock(r, key, 30, on_lost=lost.append, feed=False)
    assert lock.acquire()
    session = lock.session
    assert session._grace_ms is None
    session._grace_ms = 500
    attaches = command_calls(check, "lock.session|attach")
    assert check.client_kill_filter(_id=session_info(check, session.id)["bound"]) == 1
    wait_until("the loss reported", lambda: lost == [lock])
    assert lock.lost_reason == "session lost: ended"
    assert command_calls(check, "lock.session|attach") == attaches + 1
    r.close()
    check.close()


def test_async_reattach_after_a_blip_finds_the_session_ended_without_grace(server, key, monkeypatch):
    monkeypatch.setattr(default_session, "DEFAULT_GRACE", 0)  # a module without GRACE
    async def main():
        r = server.aclient(retry=Retry(NoBackoff(), 0))
        check = no_retry_client(server)
        lost = []
        lock = AsyncLock(r, key, 30, on_lost=lost.append, feed=False)
        assert await lock.acquire()
        session = lock.session
        assert session._grace_ms is None
        session._grace_ms = 500
        attaches = command_calls(check, "lock.session|attach")
        assert check.client_kill_filter(_id=session_info(check, session.id)["bound"]) == 1
        await await_until("the loss reported", lambda: lost == [lock])
        assert lock.lost_reason == "session lost: ended"
        assert command_calls(check, "lock.session|attach") == attaches + 1
        await r.aclose()
        check.close()

    asyncio.run(main())


def test_forked_child_opens_its_own_default_session(server, key):
    r = no_retry_client(server)
    parent = Lock(r, f"{key}:p", 30)
    assert parent.acquire()
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: its own session, then exit at once (no cleanup of the parent's)
        try:
            child = Lock(r, f"{key}:c", 30)
            ok = child.acquire(blocking=False) and child.session is not parent.session
            os.write(write, b"1" if ok else b"0")
        finally:
            os._exit(0)
    os.close(write)
    assert os.read(read, 1) == b"1"
    os.close(read)
    os.waitpid(pid, 0)
    # The child's session ended with the child; the parent's and its hold are intact.
    wait_until("the child's hold freed", lambda: r.execute_command("LOCK.INFO", f"{key}:c") is None)
    assert not parent.session.lost and parent.owned()
    assert parent.release()
    r.close()


# --- elections ----------------------------------------------------------------------------


def test_election_without_a_session_elects_the_next_promptly_after_a_kill(server, r, key):
    from test_election import read_line, spawn_candidate

    candidates = []
    try:
        candidates.append(spawn_candidate(server, key, "c1", 30, "default"))
        assert read_line(candidates[0])[0] == "leader"
        candidates.append(spawn_candidate(server, key, "c2", 30, "default"))
        wait_waiters(r, key, 1)
        left_ms, at_ms = holder_ttl(r, key), server_ms(r)
        candidates[0].send_signal(signal.SIGKILL)
        line = read_line(candidates[1])
        assert line[0] == "leader"
        # c2 leads while c1's 30 s leadership still had more than 20 s (watchdog renewed).
        assert left_ms - (server_ms(r) - at_ms) > 20_000
        assert Election(r, key).leader().value == "c2"
    finally:
        for proc in candidates:
            proc.kill()
            proc.wait()


# --- asyncio ------------------------------------------------------------------------------


@pytest.mark.own_server  # counts every session on the server
def test_async_one_default_session_per_client_closed_by_aclose(server, key):
    async def main():
        r = server.aclient(retry=Retry(NoBackoff(), 0))
        check = server.client()
        before = sessions(check)
        locks = [
            AsyncLock(r, f"{key}:a", 5),
            AsyncLock(r, f"{key}:b", 5, watchdog=True),
            AsyncSemaphore(r, f"{key}:sem", 2, 5),
            AsyncReadWriteLock(r, f"{key}:rw", 5).write,
            AsyncMultiLock(r, [f"{key}:m1", f"{key}:m2"], 5),
        ]
        granted = await asyncio.gather(*(lock.acquire(blocking=False) for lock in locks))
        assert granted == [True] * 5
        leader = await AsyncElection(r, f"{key}:e").campaign("me", timeout=5)
        session = locks[0].session
        assert isinstance(session, default_session.AsyncDefaultSession)
        assert all(lock.session is session for lock in locks) and leader.lock.session is session
        assert sessions(check) == before + 1
        assert lock_info(check, f"{key}:a")["holders"][0]["session"] == session.serial
        plain = AsyncLock(r, f"{key}:n", 5, session=None)
        assert await plain.acquire(blocking=False) and plain.session is None
        assert await plain.release()
        await r.aclose()
        assert session.closed and sessions(check) == before
        for name in (f"{key}:a", f"{key}:sem", f"{key}:rw", f"{key}:m2", f"{key}:e"):
            assert check.execute_command("LOCK.INFO", name) is None, name
        check.close()

    asyncio.run(main())


def test_async_default_session_loss_without_grace_is_reported(server, key, monkeypatch):
    monkeypatch.setattr(default_session, "DEFAULT_GRACE", 0)  # a module without GRACE
    async def main():
        r = server.aclient(retry=Retry(NoBackoff(), 0))
        check = server.client()
        lost = []
        lock = AsyncLock(r, key, 30, on_lost=lost.append, feed=False)
        assert await lock.acquire()
        session = lock.session
        assert session._grace_ms is None
        assert check.client_kill_filter(_id=session_info(check, session.id)["bound"]) == 1
        await await_until("the loss reported", lambda: lost == [lock])
        assert lock.lost_reason.startswith("session lost: connection lost")
        assert await lock.acquire(blocking=False) and lock.session is not session
        assert await lock.release()
        await r.aclose()
        check.close()

    asyncio.run(main())


def ended_uncleanly(r):
    """Sessions ended by their connection's close: at once (no grace), or when the grace ran out."""
    info = r.info("lock")
    return info["lock_sessions_disconnected"] + info.get("lock_sessions_grace_expired", 0)


# --- cluster ------------------------------------------------------------------------------


def test_cluster_one_default_session_per_node(cluster):
    import redis

    rc = cluster.client()
    nodes = {}
    try:
        keys = {}
        for i in range(500):  # two keys on each of the three masters
            k = f"ds:{i}"
            keys.setdefault(rc.get_node_from_key(k).name, []).append(k)
            if len(keys) == 3 and all(len(v) >= 2 for v in keys.values()):
                break
        nodes = {node.name: redis.Redis(host=node.host, port=node.port) for node in rc.get_primaries()}
        node_of = {k: name for name, ks in keys.items() for k in ks[:2]}
        locks = [Lock(rc, k, 5) for k in node_of]
        for lock in locks:
            assert lock.acquire(blocking=False)
        # One session for each node, shared by that node's two locks, listed on that node alone
        # (the shared cluster may list other tests' sessions: only these serials are looked at).
        by_node = {}
        for lock in locks:
            by_node.setdefault(node_of[lock.name], set()).add(lock.session)
        assert sorted(len(s) for s in by_node.values()) == [1, 1, 1]
        mine = {name: next(iter(s)).serial for name, s in by_node.items()}
        assert len(set(mine.values())) == 3
        listed = {name: serials(c) & set(mine.values()) for name, c in nodes.items()}
        assert listed == {name: {serial} for name, serial in mine.items()}
        for lock in locks:
            assert lock_info(nodes[node_of[lock.name]], lock.name)["holders"][0]["session"] == lock.session.serial
        rc.close()
        assert all(not (serials(c) & set(mine.values())) for c in nodes.values())
        for lock in locks:
            assert nodes[node_of[lock.name]].execute_command("LOCK.INFO", lock.name) is None
    finally:  # a failure above must leave no default session open on the shared cluster
        rc.close()
        for c in nodes.values():
            c.close()
