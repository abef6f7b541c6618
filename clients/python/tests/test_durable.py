"""``durable=n``: a grant counts once n replicas acknowledged it (WAIT on the same connection)."""

import asyncio
import signal
import threading
import time

import pytest
from redis.exceptions import LockError

from conftest import Server, wait_until
from redislock_native import AsyncLock, Lock, MultiLock, NotDurableError, Semaphore

# durable_timeout of the grants that must be acknowledged: the replica is up, so only a stalled
# machine takes long; the default 1 s ran out under make test-servers' load (CI run 35).
OK = 10


@pytest.fixture(scope="module")
def pair():
    primary = Server()
    replica = Server("--replica-of", str(primary.port))
    c = replica.client()
    wait_until("the replica's link", lambda: c.info("replication")["master_link_status"] == "up")
    c.close()
    # The primary counts the replica for WAIT once it sees it online; until then (and under
    # make test-servers' load, CI run 35) a first durable grant can time out.
    p = primary.client()
    wait_until("the primary's replica", lambda: p.execute_command("WAIT", 1, 100) == 1)
    p.close()
    yield primary, replica
    replica.stop()
    primary.stop()


def fence(client, key):
    return client.execute_command("LOCK.FENCE", key)


def test_durable_grant_is_on_the_replica_when_acquire_returns(pair, key):
    primary, replica = pair
    p, r = primary.client(), replica.client()
    lock = Lock(p, key, 10, durable=1, durable_timeout=OK)
    assert lock.acquire(blocking=False) is True
    assert fence(r, key) == lock.token  # WAIT 1 returned 1: the replica has it
    other = Lock(p, key, 10, durable=1)
    assert other.acquire(blocking=False) is False  # busy is still False, not an error
    # A blocking waiter: granted on release, and that grant is acknowledged too.
    waiter = Lock(p, key, 10, durable=1, durable_timeout=OK)
    result = {}
    t = threading.Thread(target=lambda: result.setdefault("ok", waiter.acquire(timeout=10)))
    t.start()
    wait_until("the waiter", lambda: p.info("clients")["blocked_clients"] == 1)
    first = lock.token
    assert lock.release()
    t.join()
    assert result["ok"] is True and fence(r, key) == waiter.token > first
    assert waiter.release()


def test_semaphore_and_multilock_take_durable(pair, key):
    primary, replica = pair
    p, r = primary.client(), replica.client()
    sem = Semaphore(p, key, 2, 10, durable=1, durable_timeout=OK)
    assert sem.acquire(blocking=False)
    assert r.execute_command("LOCK.FENCE", key, sem.token) == 1
    assert sem.release()
    keys = [f"{{{key}}}:a", f"{{{key}}}:b"]
    multi = MultiLock(p, keys, 10, durable=1, durable_timeout=OK)
    assert multi.acquire(blocking=False)
    assert [fence(r, k) for k in keys] == multi.tokens
    assert multi.release()


def test_too_few_replicas_release_the_grant_and_raise_not_durable(pair, key):
    primary, replica = pair
    p = primary.client()
    replica.proc.send_signal(signal.SIGSTOP)
    try:
        lock = Lock(p, key, 10, durable=1, durable_timeout=0.3)
        started = time.monotonic()
        with pytest.raises(NotDurableError) as caught:
            lock.acquire(blocking=False)
        assert time.monotonic() - started >= 0.3  # WAIT waited its timeout
        e = caught.value
        assert (e.acknowledged, e.wanted, e.released, e.held) == (0, 1, True, False)
        assert "0 of 1 replicas" in str(e) and "the grant was released" in str(e)
        assert fence(p, key) is None and p.exists(key) == 0  # no grant left behind
        assert lock.token is None

        # An idempotent retry by the holder: its earlier hold is never given back.
        plain = Lock(p, key, 10, owner="same")
        assert plain.acquire(blocking=False)
        retry = Lock(p, key, 10, owner="same", durable=2, durable_timeout=0.2)
        retry._token = plain.token  # this object held it before the call
        with pytest.raises(NotDurableError) as caught:
            retry.acquire(blocking=False)
        assert (caught.value.released, caught.value.held) == (False, True)
        assert "stays held" in str(caught.value)
        assert fence(p, key) == plain.token
        assert plain.release()
    finally:
        replica.proc.send_signal(signal.SIGCONT)


def test_async_durable(pair, key):
    primary, replica = pair
    r = replica.client()

    async def main():
        ap = primary.aclient()
        lock = AsyncLock(ap, key, 10, durable=1, durable_timeout=OK)
        assert await lock.acquire(blocking=False)
        assert fence(r, key) == lock.token
        assert await lock.release()
        replica.proc.send_signal(signal.SIGSTOP)
        try:
            lost = AsyncLock(ap, key, 10, durable=1, durable_timeout=0.2)
            with pytest.raises(NotDurableError) as caught:
                await lost.acquire(blocking=False)
            assert caught.value.released is True
            assert await ap.exists(key) == 0
        finally:
            replica.proc.send_signal(signal.SIGCONT)
        await ap.aclose()

    asyncio.run(main())


def test_durable_is_refused_below_7_0_12(server, key, monkeypatch):
    from redislock_native import _wire

    monkeypatch.setattr(_wire, "DURABLE_MIN_VERSION", (99, 0, 0))
    lock = Lock(server.client(), key, 10, durable=1)
    with pytest.raises(LockError, match="^durable grants need Redis 7.0.12 or later"):
        lock.acquire(blocking=False)
    assert server.client().exists(key) == 0
    with pytest.raises(ValueError):
        Lock(server.client(), key, 10, durable=-1)
