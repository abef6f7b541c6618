"""RedisPyLock / AsyncRedisPyLock through redis-py's own ``r.lock(..., lock_class=...)``."""

import asyncio
import threading
import time

import pytest
from redis.exceptions import LockError, LockNotOwnedError

from conftest import await_until, command_calls, wait_until, wait_waiters, waiters
from redislock_native import AsyncRedisPyLock, RedisPyLock, compat
from test_lock import info


def test_methods_and_errors_as_redis_py(r, key):
    lock = r.lock(key, timeout=10, lock_class=RedisPyLock)
    assert isinstance(lock, RedisPyLock)
    assert not lock.locked() and not lock.owned()
    with pytest.raises(LockError, match="Cannot release a lock that's not owned or is already unlocked"):
        lock.release()
    with pytest.raises(LockError, match="Cannot extend an unlocked lock"):
        lock.extend(1)
    with pytest.raises(LockError, match="Cannot reacquire an unlocked lock"):
        lock.reacquire()
    assert lock.acquire(blocking=False) is True
    assert lock.locked() and lock.owned()
    assert info(r, key)["owner"] == lock.local.token  # redis-py's token is the owner
    assert info(r, key)["token"] == lock.fencing_token
    other = r.lock(key, timeout=10, lock_class=RedisPyLock)
    assert other.acquire(blocking=False) is False and not other.owned() and other.locked()
    assert other.acquire(blocking_timeout=0.2) is False
    assert lock.extend(20) is True and 29000 < r.pttl(key) <= 30000  # added to what was left
    assert lock.extend(5, replace_ttl=True) is True and 4000 < r.pttl(key) <= 5000
    assert lock.reacquire() is True and 9000 < r.pttl(key) <= 10000
    lock.release()
    assert not lock.locked() and r.exists(key) == 0
    # Lost under the holder: LockNotOwnedError, as redis-py raises.
    assert lock.acquire(token="my-owner") and info(r, key)["owner"] == b"my-owner"
    r.delete(key)
    for call in (lambda: lock.extend(1), lock.reacquire, lambda: lock.extend(1, replace_ttl=True)):
        with pytest.raises(LockNotOwnedError):
            call()
    with pytest.raises(LockNotOwnedError):
        lock.release()


def test_context_manager_as_redis_py(r, key):
    with r.lock(key, timeout=10, lock_class=RedisPyLock) as lock:
        assert lock.owned()
    assert r.exists(key) == 0
    with pytest.raises(LockNotOwnedError):
        with r.lock(key, timeout=10, lock_class=RedisPyLock):
            r.delete(key)
    # (built directly: redis-py 5.0's r.lock() has no raise_on_release_error)
    with RedisPyLock(r, key, timeout=10, raise_on_release_error=False):
        r.delete(key)  # logged, not raised
    holder = r.lock(key, timeout=10, lock_class=RedisPyLock)
    assert holder.acquire()
    with pytest.raises(LockError, match="Unable to acquire lock"):
        with r.lock(key, timeout=10, blocking_timeout=0.2, lock_class=RedisPyLock):
            pass
    with pytest.raises(LockError, match="Unable to acquire lock"):
        with r.lock(key, timeout=10, blocking=False, lock_class=RedisPyLock):
            pass
    holder.release()


@pytest.mark.own_server
def test_blocking_timeout_beyond_socket_timeout_is_one_command(server, key):
    r = server.client(socket_timeout=1)
    holder = r.lock(key, timeout=30, thread_local=False, lock_class=RedisPyLock)
    waiter = r.lock(key, timeout=30, blocking_timeout=20, lock_class=RedisPyLock)
    assert holder.acquire()
    r.config_resetstat()
    threading.Thread(target=lambda: (wait_waiters(r, key, 1), time.sleep(1.5), holder.release())).start()
    assert waiter.acquire() is True
    assert command_calls(r, "lock.acquire") == 1
    waiter.release()


def test_thread_local_tokens(r, key):
    lock = r.lock(key, timeout=10, lock_class=RedisPyLock)
    assert lock.acquire()
    seen = []
    t = threading.Thread(target=lambda: seen.append((lock.owned(), getattr(lock.local, "token", None))))
    t.start()
    t.join()
    assert seen == [(False, None)]
    shared = r.lock(f"{key}:shared", timeout=10, thread_local=False, lock_class=RedisPyLock)
    assert shared.acquire()
    t = threading.Thread(target=shared.release)
    t.start()
    t.join()
    assert not shared.locked()
    lock.release()


@pytest.mark.own_server
def test_lock_without_timeout_is_renewed_until_released(r, key, monkeypatch):
    monkeypatch.setattr(compat, "NO_TIMEOUT_TTL", 1.2)
    lock = r.lock(key, lock_class=RedisPyLock)  # timeout=None: held until released
    assert lock.acquire()
    r.config_resetstat()
    wait_until("four renewals: 1.6 s, past the lease", lambda: command_calls(r, "lock.extend") >= 4)
    assert lock.owned()
    with pytest.raises(LockError, match="Cannot extend a lock with no timeout"):
        lock.extend(1)
    with pytest.raises(LockError, match="Cannot reacquire a lock with no timeout"):
        lock.reacquire()
    lock.release()
    assert r.exists(key) == 0


@pytest.mark.own_server
def test_async_drop_in(server, r, key, monkeypatch):
    async def main():
        ar = server.aclient(socket_timeout=1)
        lock = ar.lock(key, timeout=10, lock_class=AsyncRedisPyLock)
        with pytest.raises(LockError):
            await lock.release()
        with pytest.raises(LockError):
            lock.extend(1)  # raised at once, as redis-py's asyncio Lock does
        assert await lock.acquire(blocking=False)
        assert await lock.locked() and await lock.owned()
        assert info(r, key)["token"] == lock.fencing_token
        assert await lock.extend(20) and 29000 < r.pttl(key) <= 30000
        assert await lock.extend(5, replace_ttl=True) and 4000 < r.pttl(key) <= 5000
        assert await lock.reacquire() and 9000 < r.pttl(key) <= 10000

        # A waiter past the socket timeout: one command.
        waiter = ar.lock(key, timeout=10, blocking_timeout=20, lock_class=AsyncRedisPyLock)
        await ar.config_resetstat()
        task = asyncio.ensure_future(waiter.acquire())
        await await_until("the waiter queued", lambda: waiters(r, key) == 1)
        await asyncio.sleep(1.5)
        await lock.release()
        assert await task and command_calls(r, "lock.acquire") == 1
        await waiter.release()

        async with ar.lock(key, timeout=10, lock_class=AsyncRedisPyLock) as held:
            assert await held.owned()
        with pytest.raises(LockNotOwnedError):
            async with ar.lock(key, timeout=10, lock_class=AsyncRedisPyLock):
                await ar.delete(key)

        monkeypatch.setattr(compat, "NO_TIMEOUT_TTL", 1.2)
        forever = ar.lock(key, lock_class=AsyncRedisPyLock)
        assert await forever.acquire()
        await asyncio.sleep(1.6)  # past the lease: the watchdog task renewed it
        assert await forever.owned()
        await forever.release()
        assert r.exists(key) == 0
        await ar.aclose()

    asyncio.run(main())


# redis-py's own tests for a lock whose key another command overwrote (test_lock.py:
# test_releasing_lock_no_longer_owned_raises_error, test_extending_lock_no_longer_owned_raises_error,
# test_reacquiring_lock_no_longer_owned_raises_error): `SET` over the key, LockNotOwnedError.
@pytest.mark.parametrize("what", ["release", "extend", "extend_replace", "reacquire"])
def test_key_overwritten_by_set_is_not_owned_as_redis_py(r, key, what):
    lock = r.lock(key, timeout=10, lock_class=RedisPyLock)
    assert lock.acquire(blocking=False)
    r.set(key, "a")
    call = {
        "release": lock.release,
        "extend": lambda: lock.extend(10),
        "extend_replace": lambda: lock.extend(10, replace_ttl=True),
        "reacquire": lock.reacquire,
    }[what]
    with pytest.raises(LockNotOwnedError):
        call()
    if what == "release":
        assert lock.local.token is None  # cleared even though it raised, as in redis-py
    assert r.get(key) == b"a"  # the other command's value is untouched


def test_async_key_overwritten_by_set_is_not_owned_as_redis_py(server, r, key):
    async def main():
        ar = server.aclient(socket_timeout=1)
        lock = ar.lock(key, timeout=10, lock_class=AsyncRedisPyLock)
        assert await lock.acquire(blocking=False)
        await ar.set(key, "a")
        for call in (lambda: lock.extend(10), lambda: lock.extend(10, replace_ttl=True), lock.reacquire):
            with pytest.raises(LockNotOwnedError):
                await call()
        with pytest.raises(LockNotOwnedError):
            await lock.release()
        assert lock.local.token is None
        assert await ar.get(key) == b"a"
        await ar.aclose()

    asyncio.run(main())


# redis-py's own tests with a key that holds something else (test_lock.py v8.1.0,
# test_context_manager_raises_when_locked_not_acquired, sync and asyncio): such a key counts as
# held, so acquire answers False and the context manager raises LockError, not WRONGTYPE.
def test_key_of_another_type_counts_as_held_as_redis_py(r, key):
    r.set(key, "bar")
    with pytest.raises(LockError, match="^Unable to acquire lock within the time specified$"):
        with r.lock(key, blocking_timeout=0.1, lock_class=RedisPyLock):
            pass
    lock = r.lock(key, timeout=10, lock_class=RedisPyLock)
    assert lock.acquire(blocking=False) is False
    assert lock.locked() is True
    assert lock.owned() is False
    # Blocking: tried again every `sleep` s until blocking_timeout, as redis-py polls.
    start = time.monotonic()
    assert lock.acquire(sleep=0.05, blocking_timeout=0.4) is False
    assert 0.3 < time.monotonic() - start < 5
    assert r.get(key) == b"bar"  # untouched

    # The key deleted while a blocking acquire polls: that acquire gets the lock.
    lock = r.lock(key, timeout=10, thread_local=False, lock_class=RedisPyLock)
    result = []
    before = command_calls(r, "lock.acquire")
    t = threading.Thread(target=lambda: result.append(lock.acquire(sleep=0.05, blocking_timeout=20)))
    t.start()
    wait_until("a second try", lambda: command_calls(r, "lock.acquire") >= before + 2)
    r.delete(key)
    t.join(30)
    assert result == [True] and lock.owned()
    lock.release()


def test_async_key_of_another_type_counts_as_held_as_redis_py(server, r, key):
    async def main():
        ar = server.aclient()
        await ar.set(key, "bar")
        with pytest.raises(LockError, match="^Unable to acquire lock within the time specified$"):
            async with ar.lock(key, blocking_timeout=0.1, lock_class=AsyncRedisPyLock):
                pass
        lock = ar.lock(key, timeout=10, sleep=0.05, lock_class=AsyncRedisPyLock)
        assert await lock.acquire(blocking=False) is False
        assert await lock.locked() is True
        start = time.monotonic()
        assert await lock.acquire(blocking_timeout=0.4) is False
        assert 0.3 < time.monotonic() - start < 5
        assert await ar.get(key) == b"bar"
        await ar.aclose()

    asyncio.run(main())
