"""AsyncLock against a real server: every method, waits beyond the socket timeout,
cancellation (also racing a grant), the watchdog task and its loss reports."""

import asyncio
import threading
import time

import pytest
from redis.exceptions import LockError, NoPermissionError, ResponseError

from conftest import await_until, command_calls, wait_waiters, waiters
from redislock_native import AsyncLock, Lock, LockLostError, StaleTokenError
from test_lock import info


def run(coro):
    return asyncio.run(coro)


async def await_waiters(ar, key, n, timeout=10.0):
    deadline = time.monotonic() + timeout
    while True:
        reply = await ar.execute_command("LOCK.INFO", key)
        got = 0 if reply is None else (reply if isinstance(reply, dict) else dict(zip(reply[::2], reply[1::2])))[b"waiters"]
        if got == n:
            return
        assert time.monotonic() < deadline, f"timed out waiting for {n} waiter(s)"
        await asyncio.sleep(0.005)


def test_every_method(server, r, key):
    async def main():
        ar = server.aclient()
        a, b = AsyncLock(ar, key, 10), AsyncLock(ar, key, 10)
        assert not await a.locked() and not await a.owned()
        assert await a.acquire(blocking=False)
        assert info(r, key)["token"] == a.token and await a.locked() and await a.owned()
        assert not await b.acquire(blocking=False) and not await b.owned()
        assert await a.extend(60) and 59000 < r.pttl(key) <= 60000
        assert await a.fenced("SET", f"{key}:v", "x") == b"OK"
        token = a.token
        assert await a.release() is True and not await a.locked()
        assert await a.release() is False
        b._token = token
        with pytest.raises(StaleTokenError):
            await b.fenced("SET", f"{key}:v", "y")
        async with AsyncLock(ar, key, 10) as c:
            assert await c.owned()
        assert r.exists(key) == 0
        with pytest.raises(LockLostError):
            async with AsyncLock(ar, key, 10):
                await ar.delete(key)
        r.set(key, "string")
        with pytest.raises(ResponseError, match="WRONGTYPE"):
            await AsyncLock(ar, key, 1).acquire(timeout=1)
        await ar.aclose()

    run(main())


@pytest.mark.own_server
def test_blocking_wait_outlasts_the_socket_timeout_with_one_command(server, r, key):
    async def main():
        ar = server.aclient(socket_timeout=1)
        holder, waiter = AsyncLock(ar, key, 30), AsyncLock(ar, key, 30)
        assert await holder.acquire()
        await ar.config_resetstat()

        async def release_later():
            await await_waiters(ar, key, 1)
            await asyncio.sleep(1.5)
            await holder.release()

        later = asyncio.ensure_future(release_later())
        start = time.monotonic()
        assert await waiter.acquire(timeout=20)
        assert time.monotonic() - start >= 1.5
        await later
        assert command_calls(r, "lock.acquire") == 1
        assert info(r, key)["owner"] == waiter.owner.encode()
        assert await waiter.release()
        # Waits without limit too, and one that runs out says False.
        assert await holder.acquire()
        assert await AsyncLock(ar, key, 30).acquire(timeout=0.5) is False
        assert await AsyncLock(ar, key, 30).acquire(timeout=0) is False
        assert waiters(r, key) == 0
        await ar.aclose()

    run(main())


def test_cancelled_wait_leaves_no_waiter_and_no_grant(server, r, key):
    async def main():
        ar = server.aclient(socket_timeout=1)
        holder, waiter = AsyncLock(ar, key, 30), AsyncLock(ar, key, 30)
        assert await holder.acquire()
        task = asyncio.ensure_future(waiter.acquire())
        await await_waiters(ar, key, 1)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert waiters(r, key) == 0 and waiter.token is None
        assert await holder.release()
        assert r.exists(key) == 0
        # A timeout around acquire is a cancellation too.
        assert await holder.acquire()
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(waiter.acquire(), 0.3)
        assert waiters(r, key) == 0
        await holder.release()
        assert r.exists(key) == 0
        await ar.aclose()

    run(main())


@pytest.mark.parametrize("protocol", [2, 3])
def test_cancellation_racing_the_grant_gives_the_grant_back(server, r, key, protocol):
    # The holder releases and the waiter is cancelled in the same step: the server grants
    # the lock to the waiter and sends the token, but the task is already cancelled. The
    # grant must be released, not left to expire.
    async def main():
        ar = server.aclient(protocol=protocol)
        for i in range(20):
            holder, waiter = Lock(r, key, 30), AsyncLock(ar, key, 30)
            assert holder.acquire()
            task = asyncio.ensure_future(waiter.acquire())
            await await_waiters(ar, key, 1)
            holder.release()  # sync: the grant to the waiter is made before cancel()
            if i % 2:
                await asyncio.sleep(0)
            task.cancel()
            try:
                await task
                assert await waiter.release()  # the reply won the race: a normal grant
            except asyncio.CancelledError:
                pass
            assert r.exists(key) == 0, f"round {i}: a grant was left behind: {info(r, key)}"
        await ar.aclose()

    run(main())


@pytest.mark.own_server
def test_watchdog_keeps_renewing_and_stops_on_release(server, r, key):
    async def main():
        ar = server.aclient()
        lock = AsyncLock(ar, key, 1.2, watchdog=True)
        assert await lock.acquire()
        r.config_resetstat()
        await await_until("four renewals", lambda: command_calls(r, "lock.extend") >= 4)
        assert await lock.owned() and not lock.lost
        dog = lock._dog
        assert await lock.release()
        assert dog.done()
        renewals = command_calls(r, "lock.extend")
        await asyncio.sleep(0.9)  # more than two periods
        assert command_calls(r, "lock.extend") == renewals and r.exists(key) == 0
        await ar.aclose()

    run(main())


def test_watchdog_reports_a_deleted_key(server, r, key):
    async def main():
        ar = server.aclient()
        seen = asyncio.Event()

        async def on_lost(lock):
            seen.set()

        lock = AsyncLock(ar, key, 1.2, watchdog=True, on_lost=on_lost, feed=False)
        assert await lock.acquire()
        r.delete(key)
        await asyncio.wait_for(seen.wait(), 5)
        assert lock.lost_reason == "not held" and r.exists(key) == 0
        assert await lock.release() is False
        await ar.aclose()

    run(main())


def test_watchdog_of_a_stalled_event_loop_reports_the_loss(server, r, key):
    # The event loop is blocked (a sync call in a coroutine) past the ttl: the watchdog task
    # cannot run, a waiter in another thread gets the lock; when the loop runs again, the
    # watchdog finds it gone and does not extend it back.
    async def main():
        ar = server.aclient()
        lost = []
        lock = AsyncLock(ar, key, 0.9, watchdog=True, on_lost=lost.append, feed=False)
        assert await lock.acquire()
        other = Lock(r, key, 30)
        got = []
        t = threading.Thread(target=lambda: got.append(other.acquire(timeout=10)))
        t.start()
        wait_waiters(r, key, 1)
        time.sleep(1.5)  # blocks the loop: no renewal can run
        t.join(10)
        assert got == [True]
        await await_until("the loss reported", lambda: lost)
        assert lost == [lock] and lock.lost_reason == "not held"
        assert other.owned() and info(r, key)["owner"] == other.owner.encode()
        other.release()
        await ar.aclose()

    run(main())


def test_async_with_gives_up_after_blocking_timeout(server, r, key):
    async def main():
        ar = server.aclient()
        holder = AsyncLock(ar, key, 10)
        assert await holder.acquire()
        with pytest.raises(LockError, match="could not acquire"):
            async with AsyncLock(ar, key, 10, blocking_timeout=0.2):
                pass
        await holder.release()
        await ar.aclose()

    run(main())


@pytest.mark.own_server
def test_cancellation_without_client_unblock_permission(server, r, key):
    # A user without @admin cannot CLIENT UNBLOCK: the waiting connection is closed instead
    # (which takes the waiter out of the queue) and a grant that raced it is released.
    r.execute_command("ACL", "SETUSER", "no-admin", "on", "nopass", "~*", "&*", "+@all", "-@admin")

    async def main():
        ar = server.aclient(username="no-admin", password="")
        with pytest.raises(NoPermissionError, match="no permissions"):
            await ar.execute_command("CLIENT", "UNBLOCK", 1)
        holder = Lock(r, key, 30)
        for race in (False, True):
            waiter = AsyncLock(ar, key, 30)
            assert holder.acquire()
            task = asyncio.ensure_future(waiter.acquire())
            await await_waiters(ar, key, 1)
            if race:
                holder.release()  # granted to the waiter before it is cancelled
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            if not race:
                wait_until_no_waiters = time.monotonic() + 5
                while waiters(r, key) and time.monotonic() < wait_until_no_waiters:
                    await asyncio.sleep(0.005)
                assert waiters(r, key) == 0
                holder.release()
            assert r.exists(key) == 0, f"race={race}: {info(r, key)}"
        assert await ar.ping()
        await ar.aclose()

    run(main())
