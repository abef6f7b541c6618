"""Semaphore and ReadWriteLock (sync and asyncio) against a real server with SHARED / LIMIT."""

import asyncio
import threading
import time

import pytest
from redis.exceptions import ResponseError

from conftest import await_until, command_calls, wait_until, wait_waiters, waiters
from redislock_native import AsyncReadWriteLock, AsyncSemaphore, Lock, ReadWriteLock, Semaphore


def holders(r, key):
    """Owners of the live holds on ``key``, in grant order (LOCK.INFO's ``holders``)."""
    reply = r.execute_command("LOCK.INFO", key)
    if reply is None:
        return []
    if isinstance(reply, list):
        reply = dict(zip(reply[::2], reply[1::2]))
    out = []
    for h in reply[b"holders"]:
        h = h if isinstance(h, dict) else dict(zip(h[::2], h[1::2]))
        out.append(h[b"owner"].decode())
    return out


def test_semaphore_admits_limit_holders_then_queues(r, key):
    a, b, c = (Semaphore(r, key, 2, 10) for _ in range(3))
    assert a.acquire(blocking=False) and b.acquire(blocking=False)
    assert a.token != b.token and a.owned() and b.owned() and a.locked()
    assert holders(r, key) == [a.owner, b.owner]
    assert c.acquire(blocking=False) is False and not c.owned()
    with pytest.raises(ValueError):
        Semaphore(r, key, 0, 10)
    with pytest.raises(ResponseError, match="held SHARED with LIMIT 2"):
        Semaphore(r, key, 3, 10).acquire(blocking=False)
    with pytest.raises(ResponseError, match="owner holds this lock SHARED"):
        Lock(r, key, 10, owner=a.owner).acquire(blocking=False)  # no upgrade
    got = []
    t = threading.Thread(target=lambda: got.append(c.acquire(timeout=10)))
    t.start()
    wait_waiters(r, key, 1)
    assert a.release() is True
    t.join(10)
    assert got == [True] and c.token > b.token and holders(r, key) == [b.owner, c.owner]
    assert b.extend(30) is True and c.release() and b.release()
    assert r.exists(key) == 0


def test_semaphore_limit_is_never_exceeded(server, key):
    r = server.client()
    limit, in_flight, most, lock = 3, [0], [0], threading.Lock()

    def worker():
        sem = Semaphore(r, key, limit, 10)
        for _ in range(5):
            assert sem.acquire(timeout=10)
            with lock:
                in_flight[0] += 1
                most[0] = max(most[0], in_flight[0])
            assert len(holders(r, key)) <= limit
            time.sleep(0.005)
            with lock:
                in_flight[0] -= 1
            assert sem.release()

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert most[0] <= limit and r.exists(key) == 0


@pytest.mark.own_server
def test_semaphore_wait_outlasts_the_socket_timeout_with_one_command(server, key):
    r = server.client(socket_timeout=1)
    a, b = Semaphore(r, key, 1, 30), Semaphore(r, key, 1, 30)
    assert a.acquire()
    r.config_resetstat()
    threading.Thread(target=lambda: (wait_waiters(r, key, 1), time.sleep(1.5), a.release())).start()
    assert b.acquire(timeout=20) and command_calls(r, "lock.acquire") == 1
    b.release()


@pytest.mark.own_server
def test_semaphore_watchdog_reports_a_deleted_key(r, key):
    seen = threading.Event()
    sem = Semaphore(r, key, 2, 1.2, watchdog=True, on_lost=lambda s: seen.set(), feed=False)
    assert sem.acquire()
    r.config_resetstat()
    wait_until("a renewal", lambda: command_calls(r, "lock.extend") >= 2)
    assert sem.owned()
    r.delete(key)
    assert seen.wait(5) and sem.lost_reason == "not held"


def test_read_write_lock_readers_share_and_a_writer_is_not_overtaken(r, key):
    r1, r2, r3, w = (ReadWriteLock(r, key, 10) for _ in range(4))
    assert r1.read.acquire(blocking=False) and r2.read.acquire(blocking=False)
    assert w.write.acquire(blocking=False) is False
    got = []
    t = threading.Thread(target=lambda: got.append(w.write.acquire(timeout=10)))
    t.start()
    wait_waiters(r, key, 1)
    assert r3.read.acquire(blocking=False) is False  # queued writer first: no overtaking
    readers = threading.Thread(target=lambda: got.append(r3.read.acquire(timeout=10)))
    readers.start()
    wait_waiters(r, key, 2)
    assert r1.read.release() and got == []
    assert r2.read.release()
    t.join(10)
    assert got == [True] and holders(r, key) == [w.write.owner] and waiters(r, key) == 1
    assert w.write.release()
    readers.join(10)
    assert got == [True, True] and holders(r, key) == [r3.read.owner]
    r3.read.release()


def test_read_write_lock_sides_and_owners(r, key):
    rw = ReadWriteLock(r, key, 10, owner="svc")
    assert rw.read.owner == "svc:read" and rw.write.owner == "svc:write"
    with rw.write:
        assert rw.read.acquire(blocking=False) is False
    with rw.read:
        with ReadWriteLock(r, key, 10).read as other:
            assert holders(r, key) == [rw.read.owner, other.owner]
    assert r.exists(key) == 0


def test_async_semaphore_and_read_write_lock(server, r, key):
    async def main():
        ar = server.aclient(socket_timeout=1)
        a, b = AsyncSemaphore(ar, key, 1, 30), AsyncSemaphore(ar, key, 1, 30)
        assert await a.acquire()
        task = asyncio.ensure_future(b.acquire())
        await await_until("b queued", lambda: waiters(r, key) == 1)
        task.cancel()  # a cancelled shared waiter leaves nothing behind either
        with pytest.raises(asyncio.CancelledError):
            await task
        assert waiters(r, key) == 0
        assert await a.release() and r.exists(key) == 0

        r1, w = AsyncReadWriteLock(ar, f"{key}:rw", 30), AsyncReadWriteLock(ar, f"{key}:rw", 30)
        assert await r1.read.acquire()
        write = asyncio.ensure_future(w.write.acquire(timeout=20))
        await await_until("the writer queued", lambda: waiters(r, f"{key}:rw") == 1)
        await asyncio.sleep(1.2)  # past the socket timeout
        assert await r1.read.release()
        assert await write and await w.write.owned()
        await w.write.release()
        await ar.aclose()

    asyncio.run(main())
