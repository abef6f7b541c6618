"""Session and AsyncSession against a real server (LOCK.SESSION): one keepalive for many holds,
close, losses reported once (ended, bound connection killed, holder process killed), lock delay,
``session=`` on every lock kind, and routing in a Redis Cluster."""

import asyncio
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from redis.backoff import NoBackoff
from redis.exceptions import LockError, ResponseError
from redis.retry import Retry

from conftest import await_until, command_calls, wait_until, wait_waiters, waiters
from redislock_native import _wire
from redislock_native import (
    AsyncLock,
    AsyncMultiLock,
    AsyncReadWriteLock,
    AsyncSemaphore,
    AsyncSession,
    Lock,
    MultiLock,
    ReadWriteLock,
    Semaphore,
    Session,
)
from test_lock import info

ID = re.compile(r"\{[^{}]{1,4}\}[0-9a-f]{32}")


def run(coro):
    return asyncio.run(coro)


def session_threads():
    return [t for t in threading.enumerate() if t.name.startswith("redislock-session:")]


def watchdog_threads():
    return [t for t in threading.enumerate() if t.name.startswith("redislock-watchdog:")]


class Losses:
    """An ``on_lost`` callback that records what it was called with."""

    def __init__(self):
        self.calls = []

    def __call__(self, what):
        self.calls.append(what)


def waiting(client, lock, timeout=20):
    """``lock.acquire(timeout)`` in a thread; ``result["granted"]`` and ``result["at"]`` once done."""
    result = {}

    def wait():
        result["granted"] = lock.acquire(timeout=timeout)
        result["at"] = time.monotonic()

    thread = threading.Thread(target=wait)
    thread.start()
    return thread, result


def no_retry_client(server):
    return server.client(retry=Retry(NoBackoff(), 0))


# --- sync -------------------------------------------------------------------------------


def test_open_info_close(r, key):
    s = Session(r, 10)
    assert s.id is None and not s.lost and not s.closed
    with pytest.raises(LockError, match="not open"):
        Lock(r, key, 0, session=s).acquire()
    assert s.open() is s
    assert ID.fullmatch(s.id), s.id
    fields = s.info()
    assert set(fields) == {"ttl", "bound", "lockdelay", "holds", "serial", "grace", "detached"}
    assert 9000 < fields["ttl"] <= 10000
    assert fields["bound"] is None and fields["lockdelay"] == 0 and fields["holds"] == 0
    assert fields["grace"] == 0 and fields["detached"] is None
    lock = Lock(r, key, 0, session=s)
    assert lock.acquire(blocking=False)
    assert r.pttl(key) == -1  # ttl 0 in a session: no deadline of its own
    assert s.info()["holds"] == 1
    assert s.close() == 1
    assert s.closed and not s.lost and lock.token is None
    assert r.exists(key) == 0
    assert r.execute_command("LOCK.SESSION", "INFO", s.id) is None
    assert s.close() is None
    with pytest.raises(LockError, match="closed"):
        lock.acquire()
    assert session_threads() == []


def test_with_block_opens_and_closes(r, key):
    with Session(r, 10) as s:
        with Lock(r, key, 0, session=s) as lock:
            assert lock.owned()
        assert s.info()["holds"] == 0
        assert Lock(r, key, 0, session=s).acquire()
    assert s.closed and r.exists(key) == 0


@pytest.mark.own_server
def test_one_keepalive_keeps_many_holds_past_the_session_ttl(r, key):
    # 20 holds with no deadline of their own in a 0.3 s session: held at every check for over
    # 1 s (more than 3 ttls), by one thread and its keepalives, with no LOCK.EXTEND at all.
    with Session(r, 0.3) as s:
        locks = [Lock(r, f"{key}:{i}", 0, session=s) for i in range(20)]
        assert all(lock.acquire(blocking=False) for lock in locks)
        r.config_resetstat()
        assert len(session_threads()) == 1 and watchdog_threads() == []
        start = time.monotonic()
        while time.monotonic() - start < 1.0:
            assert r.execute_command("LOCK.FENCE", locks[0].name, locks[0].token) == 1
            assert not s.lost
            time.sleep(0.05)
        assert all(lock.owned() for lock in locks)
        assert command_calls(r, "lock.extend") == 0
        assert len(session_threads()) == 1
        assert s.info()["holds"] == 20
    assert all(r.exists(lock.name) == 0 for lock in locks)


def test_close_releases_to_a_waiter_at_once(server, key):
    r = no_retry_client(server)
    s = Session(r, 30, lock_delay=5).open()
    assert Lock(r, key, 0, session=s).acquire()
    waiter = Lock(r, key, 30)
    thread, result = waiting(r, waiter)
    wait_waiters(r, key, 1)
    closed = time.monotonic()
    assert s.close() == 1
    thread.join(10)
    assert result["granted"] is True
    assert result["at"] - closed < 1.0  # CLOSE has no lock delay (5 s asked)
    assert info(r, key)["owner"] == waiter.owner.encode()
    assert waiter.release()


def test_closed_from_elsewhere_is_lost_once_with_its_holds(r, key):
    on_lost, lock_lost = Losses(), Losses()
    s = Session(r, 0.6, on_lost=on_lost).open()
    a = Lock(r, f"{key}:a", 0, session=s, on_lost=lock_lost, feed=False)
    b = Semaphore(r, f"{key}:b", 3, 0, session=s, on_lost=lock_lost, feed=False)
    assert a.acquire() and b.acquire()
    assert r.execute_command("LOCK.SESSION", "CLOSE", s.id) == 2
    wait_until("the session lost", lambda: s.lost)
    wait_until("the keepalive thread gone", lambda: session_threads() == [])
    assert s.lost_reason == "ended"
    assert on_lost.calls == [s]
    assert sorted(lock_lost.calls, key=id) == sorted([a, b], key=id)
    assert a.lost and a.lost_reason == "session lost: ended"
    assert b.lost and b.lost_reason == "session lost: ended"
    assert r.exists(a.name) == 0 and r.exists(b.name) == 0
    with pytest.raises(LockError, match="lost"):
        Lock(r, key, 0, session=s).acquire()
    assert a.release() is False
    assert s.close() is None  # the server has no such session
    assert on_lost.calls == [s] and len(lock_lost.calls) == 2


@pytest.mark.own_server
def test_bound_connection_killed_is_lost_at_once(server, key):
    r = no_retry_client(server)
    on_lost, lock_lost = Losses(), Losses()
    # A keepalive period of 20 s: the loss must be seen from the connection, not a keepalive.
    s = Session(r, 30, bound=True, on_lost=on_lost, keepalive_period=20).open()
    lock = Lock(r, key, 0, session=s, on_lost=lock_lost, feed=False)
    assert lock.acquire()
    bound = s.info()["bound"]
    assert isinstance(bound, int)
    waiter = Lock(r, key, 30)
    thread, result = waiting(r, waiter)
    wait_waiters(r, key, 1)
    disconnected = r.info("lock")["lock_sessions_disconnected"]
    assert r.client_kill_filter(_id=bound) == 1
    # Seen within 5 s, where the next keepalive is 20 s away: from the connection.
    wait_until("the session lost", lambda: s.lost, timeout=5)
    thread.join(10)
    # Granted within the waiter's wait, where the session's ttl is 30 s: the server ended the
    # session because its connection closed.
    assert result["granted"] is True
    assert r.info("lock")["lock_sessions_disconnected"] == disconnected + 1
    assert s.lost_reason.startswith("connection lost: "), s.lost_reason
    wait_until("the keepalive thread gone", lambda: session_threads() == [])
    assert on_lost.calls == [s] and lock_lost.calls == [lock]
    assert lock.lost_reason == f"session lost: {s.lost_reason}"
    assert s.info() is None  # the server has no such session
    assert waiter.release()


def test_bound_session_keeps_its_connection_out_of_the_pool(r, key):
    with Session(r, 10, bound=True) as s:
        bound = s.info()["bound"]
        pooled = {conn for conn in r.connection_pool._available_connections}
        assert s._conn not in pooled
        r.connection_pool.disconnect()  # the client's own connections: not the session's
        assert s.info()["bound"] == bound and not s.lost
    assert s.closed and not s.lost


@pytest.mark.own_server
def test_bound_keepalives_outlast_the_servers_idle_timeout(server, key):
    # `timeout 1`: the server closes connections idle for over 1 s. A bound session's
    # keepalives (every 0.4 s, on its own connection) keep it alive for 2.5 s; one with a
    # keepalive every 20 s is ended by the server's timeout and reported lost.
    r = no_retry_client(server)
    r.config_set("timeout", 1)
    try:
        lost = Losses()
        busy = Session(r, 30, bound=True, keepalive_period=0.4).open()
        idle = Session(r, 30, bound=True, keepalive_period=20, on_lost=lost).open()
        start = time.monotonic()
        while time.monotonic() - start < 2.5:
            assert not busy.lost
            time.sleep(0.05)
        wait_until("the idle session's loss reported", lambda: lost.calls == [idle], timeout=10)
        assert idle.lost_reason.startswith("connection lost: "), idle.lost_reason
        assert busy.info()["bound"] is not None and not busy.lost
        assert busy.close() == 0
    finally:
        r.config_set("timeout", 0)


HOLDER = Path(__file__).with_name("session_holder.py")


def test_holder_killed_hands_every_hold_on_at_once(server, key):
    # A holder process in a bound session (30 s ttl) holds two locks and the one permit of a
    # semaphore; waiters queue on each (two on the first). kill -9: every waiter is granted
    # at once, in order, with no wait for any ttl.
    a, b, sem = f"{key}:a", f"{key}:b", f"{key}:sem"
    child = subprocess.Popen(
        [sys.executable, str(HOLDER), str(server.port), a, b, sem, "1"],
        stdout=subprocess.PIPE, text=True,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )
    r = no_retry_client(server)
    try:
        assert child.stdout.readline().split() == ["held"]
        first, second = Lock(r, a, 30), Lock(r, a, 30)
        other, permit = Lock(r, b, 30), Semaphore(r, sem, 1, 30)
        threads = {}
        for name, lock in (("first", first), ("second", second)):
            threads[name] = waiting(r, lock)
            wait_waiters(r, a, len(threads))
        threads["other"] = waiting(r, other)
        wait_waiters(r, b, 1)
        threads["permit"] = waiting(r, permit)
        wait_waiters(r, sem, 1)
        killed = time.monotonic()
        child.send_signal(signal.SIGKILL)
        for name in ("first", "other", "permit"):
            thread, result = threads[name]
            thread.join(10)
            assert result["granted"] is True, name
            assert result["at"] - killed < 1.0, (name, result["at"] - killed)
        print(f"kill -9 to grants: {max(threads[n][1]['at'] for n in ('first', 'other', 'permit')) - killed:.4f} s")
        assert info(r, a)["owner"] == first.owner.encode() and waiters(r, a) == 1
        assert first.release()
        threads["second"][0].join(10)
        assert threads["second"][1]["granted"] is True
        assert second.release() and other.release() and permit.release()
    finally:
        child.kill()
        child.wait()


def test_lock_delay_after_an_unclean_loss(server, key):
    r = no_retry_client(server)
    s = Session(r, 30, bound=True, lock_delay=0.5, keepalive_period=20).open()
    assert s.lock_delay == 0.5 and s.info()["lockdelay"] == 500
    assert Lock(r, key, 0, session=s).acquire()
    waiter = Lock(r, key, 30)
    thread, result = waiting(r, waiter)
    wait_waiters(r, key, 1)
    killed = time.monotonic()
    assert r.client_kill_filter(_id=s.info()["bound"]) == 1
    wait_until("the key delayed", lambda: (info(r, key) or {}).get("delayed", 0) > 0)
    assert 0 < info(r, key)["delayed"] <= 500
    assert r.execute_command("LOCK.FENCE", key) is None and waiters(r, key) == 1
    thread.join(10)
    assert result["granted"] is True
    assert 0.5 <= result["at"] - killed < 1.5
    assert waiter.release()


def test_session_on_every_lock_kind(r, key):
    with Session(r, 10) as s:
        kinds = [
            Lock(r, f"{key}:lock", 0, session=s),
            Semaphore(r, f"{key}:sem", 2, 0, session=s),
            ReadWriteLock(r, f"{key}:rw1", 0, session=s).read,
            ReadWriteLock(r, f"{key}:rw2", 0, session=s).write,
            MultiLock(r, [f"{{{key}}}:m1", f"{{{key}}}:m2"], 0, session=s),
        ]
        for lock in kinds:
            assert lock.acquire(blocking=False), lock
            assert lock.token is not None
        keys = [f"{key}:lock", f"{key}:sem", f"{key}:rw1", f"{key}:rw2", f"{{{key}}}:m1", f"{{{key}}}:m2"]
        assert [r.pttl(k) for k in keys] == [-1] * 6
        assert s.info()["holds"] == 6
        assert kinds[0].extend(5) and 4000 < r.pttl(keys[0]) <= 5000  # a deadline of its own
        assert kinds[0].extend(0) and r.pttl(keys[0]) == -1  # none again
        assert kinds[4].extend(0) and kinds[4].owned()
        assert kinds[2].release() and s.info()["holds"] == 5
        # A blocking acquire in a session (one LOCK.ACQUIRE ... BLOCK ... SESSION id).
        assert kinds[2].acquire(timeout=5) and s.info()["holds"] == 6
        assert watchdog_threads() == []
    assert all(r.exists(k) == 0 for k in keys)
    assert all(lock.token is None for lock in kinds)


def test_arguments_refused_before_sending(r, key):
    with pytest.raises(ValueError):
        Lock(r, key, 0)  # ttl 0 only in a session
    s = Session(r, 10)
    with pytest.raises(ValueError, match="watchdog"):
        Lock(r, key, 10, session=s, watchdog=True)
    with pytest.raises(ValueError, match="lock_delay"):
        Lock(r, key, 10, session=s, lock_delay=1)
    with pytest.raises(ValueError):
        Session(r, 0)
    with pytest.raises(ValueError):
        Session(r, 10, lock_delay=61)
    with pytest.raises(ValueError):
        Session(r, 1, keepalive_period=1)


def test_server_errors_are_raised(r, key):
    with pytest.raises(ResponseError, match="no such session"):
        r.execute_command("LOCK.ACQUIRE", key, "me", 0, "SESSION", "{x}" + "0" * 32)
    with Session(r, 10) as s, Session(r, 10) as t:
        owner = "one-owner"
        assert Lock(r, key, 0, owner=owner, session=s).acquire(blocking=False)
        with pytest.raises(ResponseError, match="^owner holds this lock in another session"):
            Lock(r, key, 0, owner=owner, session=t).acquire(blocking=False)


def test_plain_lock_delay(server, key):
    r = no_retry_client(server)
    # A plain hold (no session) with a delay of its own: it expires after 0.2 s, and nobody
    # is granted the key for 0.4 s more.
    lock = Lock(r, key, 0.2, lock_delay=0.4)
    before = time.monotonic()
    assert lock.acquire()
    waiter = Lock(r, key, 30)
    thread, result = waiting(r, waiter)
    thread.join(10)
    assert result["granted"] is True and 0.6 <= result["at"] - before < 1.5
    assert waiter.release()


# --- asyncio ----------------------------------------------------------------------------


def test_async_open_info_close(server, r, key):
    async def main():
        ar = server.aclient()
        async with AsyncSession(ar, 10) as s:
            assert ID.fullmatch(s.id)
            assert (await s.info())["holds"] == 0
            lock = AsyncLock(ar, key, 0, session=s)
            assert await lock.acquire(blocking=False)
            assert r.pttl(key) == -1 and (await s.info())["holds"] == 1
        assert s.closed and lock.token is None and r.exists(key) == 0
        assert await s.close() is None
        await ar.aclose()

    run(main())


@pytest.mark.own_server
def test_async_one_keepalive_task_keeps_holds(server, r, key):
    async def main():
        ar = server.aclient()
        async with AsyncSession(ar, 0.3) as s:
            locks = [AsyncLock(ar, f"{key}:{i}", 0, session=s) for i in range(10)]
            for lock in locks:
                assert await lock.acquire(blocking=False)
            r.config_resetstat()
            start = time.monotonic()
            while time.monotonic() - start < 1.0:
                assert await locks[0].owned() and not s.lost
                await asyncio.sleep(0.05)
            assert command_calls(r, "lock.extend") == 0
            assert (await s.info())["holds"] == 10
        assert all(r.exists(lock.name) == 0 for lock in locks)
        await ar.aclose()

    run(main())


def swallow_one_cancellation(monkeypatch, command):
    """Make the first ``_wire.acall_timed`` of ``command`` (``LOCK.SESSION KEEPALIVE``,
    ``LOCK.EXTEND``) drop the cancellation that lands in it and go on, as ``asyncio.wait_for``
    before Python 3.12 drops one that arrives in the instant its call completes (redis-py
    wraps its writes in it). The returned event is set once that call is waiting."""
    real = _wire.acall_timed
    inside = asyncio.Event()
    swallowed = []

    async def acall_timed(client, args, timeout):
        if " ".join(map(str, args)).startswith(command) and not swallowed:
            inside.set()
            try:
                await asyncio.sleep(3600)  # close() or release() cancels it here
            except asyncio.CancelledError:
                swallowed.append(True)  # dropped: the task goes on as if the reply had come
        return await real(client, args, timeout)

    monkeypatch.setattr(_wire, "acall_timed", acall_timed)
    return inside, swallowed


def test_async_close_returns_when_a_cancellation_was_swallowed(server, r, monkeypatch):
    """Issue 28's hang of test_async_one_keepalive_task_keeps_holds: close() cancelled the
    keepalive task once and awaited it; a swallowed cancellation left the task keeping the
    session alive and close() waiting for ever. Now the task is cancelled until it ends."""

    async def main():
        inside, swallowed = swallow_one_cancellation(monkeypatch, "LOCK.SESSION KEEPALIVE")
        ar = server.aclient()
        s = await AsyncSession(ar, 0.3).open()
        await asyncio.wait_for(inside.wait(), 10)
        assert await asyncio.wait_for(s.close(), 5) == 0
        assert swallowed == [True] and not s.lost
        assert r.execute_command("LOCK.SESSION", "INFO", s.id) is None
        await ar.aclose()

    run(main())


def test_async_watchdog_release_returns_when_a_cancellation_was_swallowed(server, r, key, monkeypatch):
    """The same for a lock's watchdog task, which release() stops before LOCK.RELEASE."""

    async def main():
        inside, swallowed = swallow_one_cancellation(monkeypatch, "LOCK.EXTEND")
        ar = server.aclient()
        lock = AsyncLock(ar, key, 0.6, watchdog=True, feed=False)
        assert await lock.acquire()
        await asyncio.wait_for(inside.wait(), 10)
        assert await asyncio.wait_for(lock.release(), 5) is True
        assert swallowed == [True]
        assert r.exists(key) == 0
        await ar.aclose()

    run(main())


def test_async_closed_from_elsewhere_is_lost_once(server, r, key):
    async def main():
        ar = server.aclient()
        lost = []

        async def on_lost(session):  # a coroutine function is awaited
            lost.append(session)

        lock_lost = Losses()
        s = await AsyncSession(ar, 0.6, on_lost=on_lost).open()
        a = AsyncLock(ar, f"{key}:a", 0, session=s, on_lost=lock_lost, feed=False)
        b = AsyncSemaphore(ar, f"{key}:b", 2, 0, session=s, on_lost=lock_lost, feed=False)
        assert await a.acquire() and await b.acquire()
        assert r.execute_command("LOCK.SESSION", "CLOSE", s.id) == 2
        await await_until("the session's end reported", lambda: s.lost)
        await s._task  # the keepalive task ends after reporting
        assert s.lost_reason == "ended" and lost == [s]
        assert sorted(lock_lost.calls, key=id) == sorted([a, b], key=id)
        assert a.lost_reason == b.lost_reason == "session lost: ended"
        with pytest.raises(LockError, match="lost"):
            await AsyncLock(ar, key, 0, session=s).acquire()
        assert await s.close() is None
        await ar.aclose()

    run(main())


@pytest.mark.own_server
def test_async_bound_connection_killed_is_lost_at_once(server, key):
    r = no_retry_client(server)

    async def main():
        ar = server.aclient(retry=Retry(NoBackoff(), 0))
        on_lost, lock_lost = Losses(), Losses()
        s = await AsyncSession(ar, 30, bound=True, on_lost=on_lost, keepalive_period=20).open()
        lock = AsyncLock(ar, key, 0, session=s, on_lost=lock_lost, feed=False)
        assert await lock.acquire()
        bound = (await s.info())["bound"]
        waiter = AsyncLock(ar, key, 30)
        wait = asyncio.ensure_future(waiter.acquire(timeout=20))
        await await_until("the waiter queued", lambda: waiters(r, key) == 1)
        disconnected = r.info("lock")["lock_sessions_disconnected"]
        assert r.client_kill_filter(_id=bound) == 1
        assert await wait is True  # within its 20 s, where the session's ttl is 30 s
        assert r.info("lock")["lock_sessions_disconnected"] == disconnected + 1
        deadline = time.monotonic() + 5
        while not s.lost:
            assert time.monotonic() < deadline, "the loss was not seen from the connection"
            await asyncio.sleep(0.005)
        await s._task  # the keepalive task ends after reporting
        assert s.lost_reason.startswith("connection lost: "), s.lost_reason
        assert on_lost.calls == [s] and lock_lost.calls == [lock]
        assert await waiter.release()
        await ar.aclose()

    run(main())


def test_async_session_on_every_lock_kind(server, r, key):
    async def main():
        ar = server.aclient()
        async with AsyncSession(ar, 10) as s:
            kinds = [
                AsyncLock(ar, f"{key}:lock", 0, session=s),
                AsyncSemaphore(ar, f"{key}:sem", 2, 0, session=s),
                AsyncReadWriteLock(ar, f"{key}:rw1", 0, session=s).read,
                AsyncReadWriteLock(ar, f"{key}:rw2", 0, session=s).write,
                AsyncMultiLock(ar, [f"{{{key}}}:m1", f"{{{key}}}:m2"], 0, session=s),
            ]
            for lock in kinds:
                assert await lock.acquire(timeout=5), lock
            assert (await s.info())["holds"] == 6
            assert await kinds[4].release() and (await s.info())["holds"] == 4
        assert all(lock.token is None for lock in kinds)
        await ar.aclose()

    run(main())


# --- cluster ----------------------------------------------------------------------------


def session_calls(cluster):
    """Per node port: (calls, rejected calls) of LOCK.SESSION, and COMMAND GETKEYS calls."""
    import redis

    out = {}
    for port in cluster.ports:
        stats = redis.Redis(port=port).info("commandstats")
        # Each subcommand has its own row (cmdstat_lock.session|keepalive, ...).
        rows = [row for name, row in stats.items() if name.startswith("cmdstat_lock.session|")]
        getkeys = stats.get("cmdstat_command|getkeys", {}).get("calls", 0)
        out[port] = (
            sum(row.get("calls", 0) for row in rows),
            sum(row.get("rejected_calls", 0) for row in rows),
            getkeys,
        )
    return out


def reset_stats(cluster):
    import redis

    for port in cluster.ports:
        redis.Redis(port=port).config_resetstat()


def test_cluster_session_lives_on_its_keys_node(cluster):
    rc = cluster.client()
    try:
        keys = ["{a}job", "{b}job", "{c}job"]
        for key in keys:
            node = rc.get_node_from_key(key)
            reset_stats(cluster)
            with Session(rc, 0.3, key=key) as s:  # a keepalive every 0.1 s
                assert ID.fullmatch(s.id)
                assert rc.get_node_from_key(s.id) == node  # the id's tag: a slot of that node
                lock = Lock(rc, key, 0, session=s)
                assert lock.acquire(timeout=5)  # blocking, on the node's own pool
                start = time.monotonic()
                while time.monotonic() - start < 0.8:  # keepalives routed by the id
                    assert lock.owned() and not s.lost
                    time.sleep(0.05)
                assert s.info()["holds"] == 1
            assert s.closed and not s.lost and rc.exists(key) == 0
            calls = session_calls(cluster)
            assert calls[node.port][0] >= 8, calls  # OPEN, keepalives, INFO, CLOSE
            # Never another node, no redirect, and no COMMAND GETKEYS to find the node.
            assert all(c == (0, 0, 0) for port, c in calls.items() if port != node.port), calls
            assert calls[node.port][1:] == (0, 0), calls
        # redis-py routes LOCK.SESSION by the id by itself too (the subcommand's key position in
        # COMMAND: the id is declared as a NOT_KEY key).
        with Session(rc, 10, key="{c}job") as s:
            assert rc.execute_command("LOCK.SESSION", "INFO", s.id) is not None
            assert rc.execute_command("LOCK.SESSION", "KEEPALIVE", s.id) == 10000
        # A key on another node than the session's: that node knows no such session.
        with Session(rc, 10, key="{a}job") as s:
            other = next(k for k in keys if rc.get_node_from_key(k) != rc.get_node_from_key("{a}job"))
            with pytest.raises(ResponseError, match="no such session"):
                Lock(rc, other, 0, session=s).acquire(blocking=False)
        with pytest.raises(ValueError, match="key="):
            Session(rc, 10)
    finally:
        rc.close()


def test_cluster_bound_session(cluster):
    import redis

    rc = cluster.client()
    try:
        key = "{b}bound"
        node = rc.get_node_from_key(key)
        lost = Losses()
        s = Session(rc, 30, bound=True, key=key, on_lost=lost, keepalive_period=20).open()
        lock = Lock(rc, key, 0, session=s)
        assert lock.acquire(blocking=False)
        bound = s.info()["bound"]
        direct = redis.Redis(port=node.port)
        assert direct.client_kill_filter(_id=bound) == 1
        wait_until("the session's loss reported", lambda: lost.calls == [s], timeout=5)
        assert rc.exists(key) == 0
        # In a cluster a dropped bound connection may be a failover: the client asks the slot's
        # master (LOCK.SESSION ATTACH) before it reports, and the server says the session ended.
        assert lock.lost_reason == "session lost: ended"
    finally:
        rc.close()


def test_async_cluster_session(cluster):
    async def main():
        rc = cluster.aclient()
        try:
            key = "{c}async"
            # 0.6 s: keepalives every 0.2 s must outlast a few ttls; 0.3 s was lost once on a
            # machine with a load average of 10 (a keepalive more than 0.3 s late).
            async with AsyncSession(rc, 0.6, key=key) as s:
                assert rc.get_node_from_key(s.id) == rc.get_node_from_key(key)
                lock = AsyncLock(rc, key, 0, session=s)
                assert await lock.acquire(blocking=False)
                start = time.monotonic()
                while time.monotonic() - start < 1.5:
                    assert await lock.owned() and not s.lost
                    await asyncio.sleep(0.05)
                assert (await s.info())["holds"] == 1
            assert s.closed and not s.lost and await rc.exists(key) == 0
            async with AsyncSession(rc, 30, bound=True, key=key) as s:
                assert isinstance((await s.info())["bound"], int)
                assert await AsyncLock(rc, key, 0, session=s).acquire(blocking=False)
            assert await rc.exists(key) == 0
        finally:
            await rc.aclose()

    run(main())
