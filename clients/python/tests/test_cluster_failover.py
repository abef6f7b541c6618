"""The client follows a 3+3 cluster through failovers (issue 34): a planned ``CLUSTER FAILOVER``
and a killed master whose replica is promoted (``CLUSTER FAILOVER FORCE``).

What each test asserts: the holds are on the new master with their tokens, no loss is reported
(watchdog, session, feed), sessions (bound or not) keep being renewed there, a queued waiter is
granted without the caller sending anything again, an election's observer sees the new leader and
never two leaders at once; with ``durable=1`` a killed master loses no acknowledged grant.
Every wait is on observable state (ROLE, LOCK.INFO, command stats) with a deadline.
"""

import os
import signal
import threading
import time

import pytest
import redis

from conftest import Cluster, wait_until
from redislock_native import Election, Lock, Session, lock_info

#: How long the cluster may take to carry out a failover (seconds).
PATIENCE = 30.0
# The queued waiter's and candidate's own timeouts: longer than every wait of the test put
# together, so that on a loaded machine they are still queued when the failover is checked.
WAIT = 240.0


@pytest.fixture(scope="module")
def cluster6():
    """A cluster of 3 masters with a replica each, for this file's tests."""
    c = Cluster(masters=3, replicas=1)
    yield c
    c.stop()


def role(port):
    try:
        return redis.Redis(port=port, socket_timeout=2).execute_command("ROLE")
    except redis.ConnectionError:
        return None


def shard_of(cluster, rc, key):
    """``(master port, replica port)`` of the shard that serves ``key`` now."""
    master = rc.get_node_from_key(key).port
    for port in cluster.ports:
        r = role(port)
        if r is not None and r[0] == b"slave" and r[2] == master:
            return master, port
    raise AssertionError(f"no replica of {master} found")


def wait_promoted(new, old=None):
    """Until ``new`` reports itself master (and ``old``, if alive, a replica)."""
    wait_until("the replica to become master", lambda: (role(new) or [b""])[0] == b"master", PATIENCE)
    if old is not None:
        wait_until("the old master to become a replica", lambda: (role(old) or [b""])[0] == b"slave", PATIENCE)


def session_info(port, session_id):
    """``LOCK.SESSION INFO`` as a dict (redis-py 8 gives one, 5.0 the flat list)."""
    reply = redis.Redis(port=port).execute_command("LOCK.SESSION", "INFO", session_id)
    return dict(zip(reply[::2], reply[1::2])) if isinstance(reply, list) else reply


def calls(port, command):
    stats = redis.Redis(port=port).info("commandstats")
    return stats.get(f"cmdstat_{command}", {}).get("calls", 0)


def info(port, key):
    """LOCK.INFO on one node (a dict, ``lock_info``'s shape; an empty one for a free key)."""
    return lock_info(redis.Redis(port=port), key) or {"waiters": 0, "holders": []}


def tokens_on(port, key):
    return [h["token"] for h in info(port, key)["holders"]]


def test_planned_failover_keeps_holds_sessions_waiters_and_elections(cluster6):
    rc = cluster6.client()
    tag = "{fo-planned}"
    old, new = shard_of(cluster6, rc, tag)
    lost = []

    def report(what):
        return lambda obj: lost.append((what, getattr(obj, "lost_reason", None)))

    # A watchdog hold watched through the feed, an unbound and a bound session with a hold each.
    plain = Lock(rc, tag + "plain", 3, watchdog=True, on_lost=report("plain"))
    assert plain.acquire(blocking=False)
    unbound = Session(rc, 3, key=tag, on_lost=report("unbound session")).open()
    in_unbound = Lock(rc, tag + "s1", 0, session=unbound, on_lost=report("unbound hold"))
    assert in_unbound.acquire(blocking=False)
    bound = Session(rc, 3, key=tag, bound=True, on_lost=report("bound session")).open()
    in_bound = Lock(rc, tag + "s2", 0, session=bound, on_lost=report("bound hold"))
    assert in_bound.acquire(blocking=False)
    held = {plain.name: plain.token, in_unbound.name: in_unbound.token, in_bound.name: in_bound.token}

    # A queued waiter behind a holder.
    holder = Lock(rc, tag + "busy", 60)
    assert holder.acquire(blocking=False)
    waited = {}
    waiter = Lock(rc, tag + "busy", 60)
    t = threading.Thread(target=lambda: waited.setdefault("granted", waiter.acquire(timeout=WAIT)))
    t.start()

    # An election: a leader, a queued candidate, an observer.
    election = Election(rc, tag + "leader", 3)
    first = election.campaign("alpha", on_lost=report("alpha"))
    assert first is not None
    candidate = {}
    c = threading.Thread(target=lambda: candidate.setdefault("b", Election(rc, tag + "leader", 3).campaign("beta", timeout=WAIT)))
    c.start()
    observation = election.observe()
    change = observation.get(timeout=10)
    assert change.leader.value == "alpha" and change.leader.term == first.term
    wait_until("both waiters queued", lambda: info(old, tag + "busy")["waiters"] == 1
               and info(old, tag + "leader")["waiters"] == 1, 10)

    keepalives = calls(new, "lock.session|keepalive")
    assert redis.Redis(port=new).execute_command("CLUSTER", "FAILOVER") == b"OK"
    wait_promoted(new, old)

    # Both sessions renewed on the new master (a bound one re-attached there), the watchdog too.
    wait_until("keepalives on the new master", lambda: calls(new, "lock.session|keepalive") >= keepalives + 4, PATIENCE)
    wait_until("an extend on the new master", lambda: calls(new, "lock.extend") >= 2, PATIENCE)
    wait_until("the bound session attached there",
               lambda: session_info(new, bound.id)[b"bound"] is not None, PATIENCE)
    for name, token in held.items():
        assert tokens_on(new, name) == [token], name
    assert lost == []
    assert not unbound.lost and not bound.lost and not plain.lost

    # The waiter was answered UNBLOCKED by the old master and queued again on its own.
    wait_until("the waiter queued on the new master", lambda: info(new, tag + "busy")["waiters"] == 1, PATIENCE)
    wait_until("the candidate queued on the new master", lambda: info(new, tag + "leader")["waiters"] == 1, PATIENCE)
    assert holder.release()
    t.join(PATIENCE)
    assert waited == {"granted": True} and tokens_on(new, tag + "busy") == [waiter.token]

    # The observer follows the key to the new master: the leader there is still alpha.
    change = observation.get(timeout=PATIENCE)
    assert change.resync and change.leader.value == "alpha" and change.leader.term == first.term
    assert first.resign()
    c.join(PATIENCE)
    beta = candidate["b"]
    assert beta is not None and beta.term > first.term
    leaders = []
    while True:
        change = observation.get(timeout=PATIENCE)
        leaders.append(change.leader)
        if change.leader is not None and change.leader.value == "beta":
            break
    # Never two at once: alpha's end (None) or beta's grant follows alpha, nothing else.
    assert all(x is None or x.value == "beta" for x in leaders), leaders
    observation.close()
    assert lost == []

    for lock in (plain, in_unbound, in_bound, waiter):
        assert lock.release()
    assert unbound.close() == 0 and bound.close() == 0
    rc.close()


def test_killed_master_loses_no_durable_grant(cluster6):
    rc = cluster6.client()
    tag = "{fo-killed}"
    old, new = shard_of(cluster6, rc, tag)
    lost = []
    locks = [Lock(rc, f"{tag}d{i}", 60, durable=1) for i in range(20)]
    for lock in locks:
        assert lock.acquire(blocking=False)
    session = Session(rc, 30, key=tag, on_lost=lambda s: lost.append(s.lost_reason)).open()
    in_session = Lock(rc, tag + "s", 0, session=session, durable=1)
    assert in_session.acquire(blocking=False)
    dog = Lock(rc, tag + "dog", 30, watchdog=True, watchdog_period=1, durable=1,
               on_lost=lambda lock: lost.append(lock.lost_reason))
    assert dog.acquire(blocking=False)

    os.kill(cluster6.pids[old], signal.SIGKILL)
    wait_until("the master to die", lambda: role(old) is None, 10)
    # Promote its replica at once rather than after cluster-node-timeout.
    assert redis.Redis(port=new).execute_command("CLUSTER", "FAILOVER", "FORCE") == b"OK"
    wait_promoted(new)

    for lock in locks + [in_session, dog]:
        assert tokens_on(new, lock.name) == [lock.token], lock.name
    wait_until("the session renewed on the new master",
               lambda: calls(new, "lock.session|keepalive") >= 1, PATIENCE)
    wait_until("the watchdog renewed on the new master", lambda: calls(new, "lock.extend") >= 1, PATIENCE)
    assert lost == [] and not session.lost and not dog.lost
    # Closing goes to the new master, not to the dead node.
    dog.release()
    assert session.close() == 1
    for lock in locks:
        assert lock.release()
    rc.close()


def test_planned_failover_keeps_async_sessions(cluster6):
    import asyncio

    from redislock_native import AsyncLock, AsyncSession

    async def run():
        rc = cluster6.aclient()
        tag = "{fo-async}"
        await rc.initialize()
        old = rc.get_node_from_key(tag).port
        new = next(p for p in cluster6.ports if (role(p) or [b""])[0] == b"slave" and role(p)[2] == old)
        lost = []
        unbound = await AsyncSession(rc, 3, key=tag, on_lost=lambda s: lost.append(s.lost_reason)).open()
        bound = await AsyncSession(rc, 3, key=tag, bound=True, on_lost=lambda s: lost.append(s.lost_reason)).open()
        locks = [AsyncLock(rc, tag + "a", 0, session=unbound), AsyncLock(rc, tag + "b", 0, session=bound)]
        for lock in locks:
            assert await lock.acquire(blocking=False)
        keepalives = calls(new, "lock.session|keepalive")
        assert redis.Redis(port=new).execute_command("CLUSTER", "FAILOVER") == b"OK"
        deadline = time.monotonic() + PATIENCE
        while not (calls(new, "lock.session|keepalive") >= keepalives + 4
                   and session_info(new, bound.id)[b"bound"] is not None):
            assert time.monotonic() < deadline, "no keepalives of both sessions on the new master"
            await asyncio.sleep(0.05)
        assert (role(old) or [b""])[0] == b"slave"
        for lock in locks:
            assert tokens_on(new, lock.name) == [lock.token]
        assert lost == [] and not unbound.lost and not bound.lost
        assert await unbound.close() == 1 and await bound.close() == 1
        await rc.aclose()

    asyncio.run(run())
