"""The lock classes through redis-py's cluster clients (``RedisCluster``, sync and asyncio):
every command about a key goes straight to the node that serves it (``_wire.route``), and
refused acquires hammered from many threads leave no grant behind (issue 28)."""

import asyncio
import random
import threading
import uuid

import redis

from redislock_native import AsyncLock, AsyncMultiLock, Election, Lock, MultiLock, RedisPyLock


def stats(cluster):
    """Per node port: LOCK.* calls, and COMMAND GETKEYS calls (redis-py asking a node where a
    command's keys are)."""
    out = {}
    for port in cluster.ports:
        s = redis.Redis(port=port).info("commandstats")
        lock_calls = sum(v["calls"] for k, v in s.items() if k.startswith("cmdstat_lock."))
        out[port] = (lock_calls, s.get("cmdstat_command|getkeys", {}).get("calls", 0))
    return out


def reset_stats(cluster):
    for port in cluster.ports:
        redis.Redis(port=port).config_resetstat()


def held_keys(rc, keys):
    """The keys of ``keys`` that LOCK.INFO on their own node shows held (or waited on)."""
    return [k for k in keys if rc.execute_command("LOCK.INFO", k, target_nodes=rc.get_node_from_key(k)) is not None]


def test_cluster_commands_go_straight_to_the_keys_node(cluster):
    rc = cluster.client()
    try:
        for key in ["{a}lock", "{b}lock", "{c}lock"]:
            port = rc.get_node_from_key(key).port
            reset_stats(cluster)
            lock = Lock(rc, key, 10)
            assert lock.acquire(blocking=False) and lock.owned() and lock.locked() and lock.extend()
            assert lock.release()
            multi = MultiLock(rc, [key, key + ":2"], 10)
            assert multi.acquire(blocking=False) and multi.owned() and multi.extend()
            assert multi.release()
            compat = rc.lock(key, timeout=10, lock_class=RedisPyLock)
            assert compat.acquire(blocking=False) and compat.owned()
            compat.extend(5)
            compat.release()
            calls = stats(cluster)
            # LOCK.* on the key's node only (LOCK.MACQUIRE/MRELEASE included), and no
            # COMMAND GETKEYS anywhere: redis-py did not have to ask where the keys are.
            assert calls[port][0] >= 9, calls
            assert all(c == (0, 0) for p, c in calls.items() if p != port), calls
            assert calls[port][1] == 0, calls
    finally:
        rc.close()


def test_cluster_refused_acquires_hammered_leave_no_grant_behind(cluster):
    rc = cluster.client()
    keys = [f"hammer:{i}" for i in range(6)] + ["{h}a", "{h}b"]
    assert len({rc.get_node_from_key(k).port for k in keys}) == 3
    counts = {"granted": 0, "refused": 0}
    mutex = threading.Lock()
    errors = []

    def worker(n):
        try:
            for i in range(120):
                kind = (n + i) % 4
                if kind == 0:
                    lock = Lock(rc, random.choice(keys), 60)
                    got = lock.acquire(timeout=0.003)  # a short wait in the queue
                elif kind == 1:
                    lock = Lock(rc, random.choice(keys), 60)
                    got = lock.acquire(blocking=False)
                elif kind == 2:
                    lock = MultiLock(rc, ["{h}a", "{h}b"], 60)
                    got = lock.acquire(blocking=False)
                else:
                    lock = rc.lock(random.choice(keys), timeout=60, lock_class=RedisPyLock)
                    got = lock.acquire(blocking_timeout=0.003)
                with mutex:
                    counts["granted" if got else "refused"] += 1
                if got:
                    assert lock.release() is not False
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    try:
        threads = [threading.Thread(target=worker, args=(n,)) for n in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        assert errors == [] and not any(t.is_alive() for t in threads)
        assert counts["granted"] + counts["refused"] == 6 * 120 and counts["refused"] > 0, counts
        assert held_keys(rc, keys) == [], counts  # no grant outlived its release
    finally:
        rc.close()


def test_async_cluster_refused_acquires_hammered_leave_no_grant_behind(cluster):
    keys = [f"ahammer:{i}" for i in range(6)] + ["{ah}a", "{ah}b"]

    async def main():
        arc = cluster.aclient()
        await arc.initialize()
        counts = {"granted": 0, "refused": 0}

        async def worker(n):
            for i in range(100):
                if (n + i) % 3 == 2:
                    lock = AsyncMultiLock(arc, ["{ah}a", "{ah}b"], 60)
                else:
                    lock = AsyncLock(arc, random.choice(keys), 60)
                got = await lock.acquire(blocking=False)  # asyncio's cluster client: no waits
                counts["granted" if got else "refused"] += 1
                if got:
                    await asyncio.sleep(0)
                    assert await lock.release() is True

        await asyncio.gather(*(worker(n) for n in range(6)))
        await arc.aclose()
        return counts

    counts = asyncio.run(main())
    assert counts["granted"] + counts["refused"] == 600 and counts["refused"] > 0, counts
    rc = cluster.client()
    try:
        assert held_keys(rc, keys) == [], counts
    finally:
        rc.close()


def test_an_observer_outlives_the_node_client_the_cluster_client_replaces(cluster):
    # RedisCluster drops a node's redis.Redis after a connection error there and makes a new one
    # on next use; the feed built on the old one closed with it, and its observers (and holds)
    # silently saw nothing more (under load after a planned failover, CI). They now move to the
    # feed of the key's master, as after a failover.
    import gc

    rc = cluster.client()
    key = f"{{drop-{uuid.uuid4().hex[:8]}}}leader"
    election = Election(rc, key, 5)
    first = election.campaign("alpha")
    observation = election.observe()
    change = observation.get(timeout=10)
    assert change.leader.value == "alpha" and change.leader.term == first.term
    node = rc.get_node_from_key(key)
    node.redis_connection = None  # what redis-py's cluster client does after a connection error
    gc.collect()
    change = observation.get(timeout=10)  # the resync from the node's new feed
    assert change.resync and change.leader.value == "alpha" and change.leader.term == first.term
    assert first.resign()
    change = observation.get(timeout=10)
    assert change.leader is None
    observation.close()
    rc.close()
