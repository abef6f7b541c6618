"""Redlock / AsyncRedlock over three independent servers with the module."""

import asyncio

import pytest

from redis.backoff import NoBackoff
from redis.retry import Retry

from conftest import Server
from test_lock import info
from redislock_native import AsyncRedlock, Redlock, RedlockError


@pytest.fixture
def masters():
    servers = [Server() for _ in range(3)]
    yield servers
    for s in servers:
        if s._harness.poll() is None:
            s.stop()


def clients(servers):
    # No retries: a master that is down must cost one failed attempt, not redis-py 8's ten.
    return [s.client(socket_timeout=0.5, socket_connect_timeout=0.5, retry=Retry(NoBackoff(), 0)) for s in servers]


def fence(client, key):
    return client.execute_command("LOCK.FENCE", key)


def test_granted_by_every_master_with_a_token_each(masters, key):
    cs = clients(masters)
    lock = Redlock(cs, key, 10)
    assert lock.quorum == 2
    assert lock.acquire() is True
    assert lock.tokens == [fence(c, key) for c in cs]
    assert all(isinstance(t, int) for t in lock.tokens)
    assert 9.5 < lock.validity <= 10 - 10 / 100
    assert lock.release() == 3
    assert [c.exists(key) for c in cs] == [0, 0, 0]
    assert lock.validity is None and lock.tokens is None


def test_contended_when_another_owner_holds_a_majority_and_the_grant_is_undone(masters, key):
    cs = clients(masters)
    for c in cs[:2]:
        assert c.execute_command("LOCK.ACQUIRE", key, "other", 10000) is not None
    lock = Redlock(cs, key, 10)
    with pytest.raises(RedlockError) as caught:
        lock.acquire()
    e = caught.value
    assert (e.reason, e.granted, e.answered, e.needed, e.errors) == ("contended", 1, 3, 2, {})
    assert cs[2].exists(key) == 0  # its one grant was given back
    assert [info(c, key)["owner"] for c in cs[:2]] == [b"other", b"other"]


def test_one_master_down_still_grants_two_down_is_unavailable(masters, key):
    cs = clients(masters)
    masters[0].stop()
    lock = Redlock(cs, key, 10)
    assert lock.acquire() is True
    assert lock.tokens[0] is None and all(isinstance(t, int) for t in lock.tokens[1:])
    assert lock.release() == 2
    masters[1].stop()
    lock = Redlock(cs, key, 10)
    with pytest.raises(RedlockError) as caught:
        lock.acquire()
    e = caught.value
    assert (e.reason, e.granted, e.answered, sorted(e.errors)) == ("unavailable", 1, 1, [0, 1])
    assert cs[2].exists(key) == 0


def test_expired_when_no_validity_is_left_and_every_grant_is_undone(masters, key):
    cs = clients(masters)
    lock = Redlock(cs, key, 0.001)  # 1 ms: less than the drift alone
    with pytest.raises(RedlockError) as caught:
        lock.acquire()
    assert (caught.value.reason, caught.value.granted) == ("expired", 3)
    assert [fence(c, key) for c in cs] == [None, None, None]


def test_async_redlock(masters, key):
    async def main():
        acs = [s.aclient(socket_timeout=0.5) for s in masters]
        lock = AsyncRedlock(acs, key, 10)
        async with lock:
            assert lock.tokens == [fence(s.client(), key) for s in masters]
        assert [s.client().exists(key) for s in masters] == [0, 0, 0]
        await acs[0].execute_command("LOCK.ACQUIRE", key, "other", 10000)
        await acs[1].execute_command("LOCK.ACQUIRE", key, "other", 10000)
        with pytest.raises(RedlockError) as caught:
            await AsyncRedlock(acs, key, 10).acquire()
        assert (caught.value.reason, caught.value.granted) == ("contended", 1)
        assert masters[2].client().exists(key) == 0
        for c in acs:
            await c.aclose()

    asyncio.run(main())
