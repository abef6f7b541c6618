"""A forged change feed: messages SPUBLISHed on a lock's channel by someone else than the server
(an ACL user with only ``&* +spublish``) fool no client, sync or asyncio. The leader's ``on_lost`` does not fire
and observers keep reporting the real leader, because a message that claims a change is
confirmed with ``LOCK.INFO`` first (``redislock_native.feed``); a real loss and a real new
leader still arrive, confirmed by one state read."""

import asyncio
import threading
import time

import pytest
import redis

from conftest import Server, command_calls, wait_until, wait_waiters, waiters
from redislock_native import AsyncElection, Election, Leader
from redislock_native import feed


@pytest.fixture
def own():
    """A server of this test's own: it adds an ACL user."""
    server = Server()
    yield server
    server.stop()


@pytest.fixture
def forger(own):
    """A connection of a user who may publish on every channel and do nothing else."""
    admin = own.client()
    admin.execute_command("ACL", "SETUSER", "forger", "on", ">pw", "resetkeys", "resetchannels", "&*", "-@all", "+spublish")
    admin.close()
    c = own.client(username="forger", password="pw")
    yield c
    c.close()


def info_seq(r, key):
    """LOCK.INFO's seq of a watched key."""
    return feed.parse_info(r.execute_command("LOCK.INFO", key)).seq


def channel_of(server, key):
    """The key's feed channel, from a watch of a connection that closes at once (the feed's own
    watch stays)."""
    c = server.client(single_connection_client=True)
    try:
        channel, _seq = c.execute_command("LOCK.WATCH", key)
    finally:
        c.close()
    return channel


def test_forged_messages_depose_nobody_and_real_changes_still_arrive(own, key, forger):
    r = own.client()
    losses = []
    lost_at = threading.Event()

    def on_lost(leadership):
        losses.append((leadership.lost_reason, time.monotonic()))
        lost_at.set()

    election = Election(r, key, ttl=60)  # its watchdog renews every 20 s: no message meanwhile
    with election.observe() as changes:
        assert changes.get(5).leader is None
        a = election.campaign("a", on_lost=on_lost)
        term = a.term
        assert changes.get(5).leader == Leader("a", term)
        wait_until("the leadership synced with the feed", lambda: a.lock._feed_sub is not None and a.lock._feed_sub.checked)
        channel = channel_of(own, key)
        seq = info_seq(r, key)
        reads = command_calls(r, "lock.info")

        # Each of these claims a change; each makes the feed read the state once.
        forged = [
            f"{seq + 1} handoff {term + 1000} 500 mallory",  # a new leader
            f"{seq + 1} released {term} 0 a",  # the leader's own release
            f"{seq + 1} extended {term} 500 a",  # claims nothing, takes seq + 1 ...
            f"{seq + 1} expired {term} 0 a",  # ... so that a second seq + 1 is a conflict
            f"{seq + 100} deleted 0 0 ",  # far ahead: read as a gap
            f"{seq + 1} demoted 0 0 ",  # the server answers as a primary
        ]
        for message in forged:
            assert forger.execute_command("SPUBLISH", channel, message) == 1
        # Until the feed has read the state for each claim (or, as before these were confirmed,
        # believed one).
        wait_until(
            "the feed to read the state for the forged claims",
            lambda: command_calls(r, "lock.info") >= reads + 5 or losses or changes._observer.queue.qsize(),
        )

        with pytest.raises(TimeoutError):
            print("an observer reported", changes.get(0))
        assert losses == [] and not a.lost
        assert election.leader() == Leader("a", term)

        # A real handoff: b waits, a's hold is released by the server's own command.
        thread_result = {}
        waiting = threading.Thread(target=lambda: thread_result.update(b=Election(r, key).campaign("b", timeout=10)))
        waiting.start()
        wait_waiters(r, key, 1)
        released = time.monotonic()
        assert r.execute_command("LOCK.RELEASE", key, "a") == 1
        waiting.join(10)
        b = thread_result["b"]
        change = changes.get(5)
        assert change.leader == Leader("b", b.term) and not change.resync
        assert lost_at.wait(5)
        ((reason, at),) = losses
        assert reason == "feed: handoff to 'b'"
        print(f"loss reported {(at - released) * 1000:.1f} ms after the release")  # `make bench` times it
        assert b.resign()
        assert changes.get(5).leader is None
    r.close()


def test_async_forged_messages_depose_nobody_and_real_changes_still_arrive(own, key, forger):
    r = own.client()

    async def until(what, predicate, timeout=10.0):
        deadline = time.monotonic() + timeout
        while not predicate():
            assert time.monotonic() < deadline, f"timed out waiting for {what}"
            await asyncio.sleep(0.005)

    async def main():
        ar, br = own.aclient(), own.aclient()
        losses = []

        def on_lost(leadership):
            losses.append((leadership.lost_reason, time.monotonic()))

        election = AsyncElection(ar, key, ttl=60)
        async with election.observe() as changes:
            assert (await changes.get(5)).leader is None
            a = await election.campaign("a", on_lost=on_lost)
            term = a.term
            assert (await changes.get(5)).leader == Leader("a", term)
            await until("the leadership synced with the feed", lambda: a.lock._feed_sub is not None and a.lock._feed_sub.checked)
            channel = channel_of(own, key)
            seq = info_seq(r, key)
            reads = command_calls(r, "lock.info")
            for message in [
                f"{seq + 1} handoff {term + 1000} 500 mallory",
                f"{seq + 1} released {term} 0 a",
                f"{seq + 1} extended {term} 500 a",
                f"{seq + 1} expired {term} 0 a",
                f"{seq + 100} deleted 0 0 ",
                f"{seq + 1} demoted 0 0 ",
            ]:
                assert forger.execute_command("SPUBLISH", channel, message) == 1
            await until(
                "the feed to read the state for the forged claims",
                lambda: command_calls(r, "lock.info") >= reads + 5 or losses or changes._observer.queue.qsize(),
            )
            assert changes._observer.queue.qsize() == 0, await changes.get(0.1)
            assert losses == [] and not a.lost
            assert await election.leader() == Leader("a", term)

            campaign = asyncio.ensure_future(AsyncElection(br, key).campaign("b", timeout=10))
            await until("b to wait", lambda: waiters(r, key) == 1)
            released = time.monotonic()
            assert r.execute_command("LOCK.RELEASE", key, "a") == 1
            b = await campaign
            change = await changes.get(5)
            assert change.leader == Leader("b", b.term) and not change.resync
            await until("a told of its loss", lambda: losses)
            ((reason, at),) = losses
            assert reason == "feed: handoff to 'b'"
            print(f"loss reported {(at - released) * 1000:.1f} ms after the release")  # `make bench` times it
            assert await b.resign()
            assert (await changes.get(5)).leader is None
        await ar.aclose()
        await br.aclose()

    asyncio.run(main())
    r.close()
