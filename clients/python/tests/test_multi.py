"""MultiLock / AsyncMultiLock against a real server with LOCK.MACQUIRE / LOCK.MRELEASE."""

import asyncio
import threading
import time

import pytest
from redis.exceptions import ResponseError

from conftest import await_until, command_calls, wait_until, wait_waiters, waiters
from redislock_native import AsyncMultiLock, Lock, LockLostError, MultiLock
from test_lock import info


def test_all_or_none(r, key):
    names = [f"{key}:a", f"{key}:b", f"{key}:c"]
    m = MultiLock(r, names, 10)
    assert not m.locked() and not m.owned()
    assert m.acquire(blocking=False)
    assert [info(r, n)["token"] for n in names] == m.tokens and m.owned() and m.locked()
    assert 9000 < r.pttl(names[2]) <= 10000
    other = MultiLock(r, [f"{key}:c", f"{key}:d"], 10)
    assert other.acquire(blocking=False) is False and r.exists(f"{key}:d") == 0
    assert m.extend(30) and 29000 < r.pttl(names[1]) <= 30000
    with pytest.raises(ResponseError, match="duplicate key"):
        MultiLock(r, [key, key], 10).acquire(blocking=False)
    assert m.release() is True and r.exists(*names) == 0
    assert m.release() is False
    with pytest.raises(LockLostError):  # a key of the set lost: the with block says so
        with MultiLock(r, names, 10) as held:
            r.delete(names[0])
            assert not held.owned() and held.extend() is False


@pytest.mark.own_server
def test_wait_for_every_key_with_one_command_past_the_socket_timeout(server, key):
    r = server.client(socket_timeout=1)
    a, b = Lock(r, f"{key}:a", 30), Lock(r, f"{key}:b", 30)
    assert a.acquire() and b.acquire()
    m = MultiLock(r, [f"{key}:a", f"{key}:b"], 30)
    r.config_resetstat()

    def free_both():
        wait_waiters(r, f"{key}:a", 1)
        a.release()
        time.sleep(1.2)  # the free key stays free for the multi-key waiter
        assert Lock(r, f"{key}:a", 30).acquire(blocking=False) is False
        b.release()

    threading.Thread(target=free_both).start()
    assert m.acquire(timeout=20)
    assert command_calls(r, "lock.macquire") == 1 and m.owned()
    m.release()


@pytest.mark.own_server
def test_watchdog_renews_every_key_and_reports_a_loss(r, key):
    seen = threading.Event()
    m = MultiLock(r, [f"{key}:a", f"{key}:b"], 1.2, watchdog=True, on_lost=lambda lk: seen.set(), feed=False)
    assert m.acquire()
    r.config_resetstat()
    wait_until("two renewals", lambda: command_calls(r, "eval") >= 2)
    assert m.owned()
    r.delete(f"{key}:b")
    assert seen.wait(5) and m.lost_reason == "not held"
    assert m.release() is False


def test_async_multi_lock_and_cancellation(server, r, key):
    async def main():
        ar = server.aclient(socket_timeout=1)
        names = [f"{key}:a", f"{key}:b"]
        holder = Lock(r, names[1], 30)
        assert holder.acquire()
        m = AsyncMultiLock(ar, names, 30)
        task = asyncio.ensure_future(m.acquire())
        await await_until("the set queued", lambda: waiters(r, names[1]) == 1)
        holder.release()  # granted to the waiter, which is cancelled before it reads the reply
        task.cancel()
        try:
            got = await task
        except asyncio.CancelledError:
            got = "cancelled"
        if got == "cancelled":
            assert r.exists(*names) == 0  # the grant was given back
        else:
            # The grant reached the caller despite the cancel (seen twice in CI runs 36 and 41,
            # redis-py 8, not reproduced alone in 30+ runs; the cause is not found, see the
            # session note): then it is a whole, live hold of this object, never a grant left
            # behind.
            assert got is True and await m.owned()
            assert await m.release()
        assert await m.acquire(timeout=1) and await m.owned() and await m.locked()
        assert await m.extend() and await m.release()
        await ar.aclose()

    asyncio.run(main())
