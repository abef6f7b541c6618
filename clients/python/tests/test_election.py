"""Election / AsyncElection against a real server: campaign in FIFO order, leader(), resign, a
leader killed (SIGKILL, bound session: the next leads within milliseconds), a leader paused
(SIGSTOP) past its ttl (the next term is larger, the old leader's fenced writes are refused), and
observe(): every change including "no leader", a resynchronisation after its pub/sub connection
is killed."""

import asyncio
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from conftest import await_until, wait_until, wait_waiters, waiters
from redislock_native import AsyncElection, Change, Election, Leader, Session, StaleTokenError, fenced_call
from redislock_native import feed, feed_aio

HERE = Path(__file__).resolve().parent
CANDIDATE = HERE / "candidate.py"


def campaigning(election, value, **kwargs):
    """``election.campaign(value)`` in a thread; ``result["leadership"]`` once it returns."""
    result = {}
    thread = threading.Thread(target=lambda: result.update(leadership=election.campaign(value, **kwargs)))
    thread.start()
    return thread, result


def test_campaign_leader_resign(r, key):
    assert Election(r, key).leader() is None
    a, b = Election(r, key), Election(r, key)
    first = a.campaign("node-a:7000")
    assert first.value == "node-a:7000" and first.term > 0 and not first.lost
    assert a.leader() == Leader("node-a:7000", first.term)
    thread, result = campaigning(b, "node-b:7000", timeout=10)
    wait_waiters(r, key, 1)
    assert b.leader() == Leader("node-a:7000", first.term)  # a waiting candidate does not lead
    assert a.resign() is True
    thread.join(10)
    second = result["leadership"]
    assert second.term > first.term and a.leader() == Leader("node-b:7000", second.term)
    assert first.lost is False  # a resignation is no loss
    assert Election(r, key).campaign("node-c:7000", timeout=0.05) is None  # timed out
    assert second.resign() is True and b.leader() is None
    assert a.resign() is False  # nothing left to resign


def test_campaign_in_a_session(r, key):
    with Session(r, 30) as session:
        leadership = Election(r, key, session=session).campaign("in-session")
        assert r.pttl(key) == -1  # no deadline of its own: the session covers it
        assert Election(r, key).leader() == Leader("in-session", leadership.term)
    assert Election(r, key).leader() is None  # the session's end ended the leadership


def test_observe_reports_every_change_including_no_leader(r, key):
    election = Election(r, key)
    with election.observe() as changes:
        assert changes.get(5) == Change(None, True, 0)  # the state when it began
        a = election.campaign("a")
        assert changes.get(5) == Change(Leader("a", a.term), False, 1)
        b_election = Election(r, key)
        thread, result = campaigning(b_election, "b", timeout=10)
        wait_waiters(r, key, 1)
        assert a.resign()
        thread.join(10)
        b = result["leadership"]
        # A handoff is one change: no "no leader" between a and b.
        assert changes.get(5) == Change(Leader("b", b.term), False, 2)
        r.delete(key)
        assert changes.get(5) == Change(None, False, 3)
        # And b heard of it, through its own client's feed (another connection and thread, so
        # it may come a moment after the observer's message: seen in CI with redis-py 5).
        deadline = time.monotonic() + 5
        while not b.lost and time.monotonic() < deadline:
            time.sleep(0.005)
        assert b.lost
        c = election.campaign("c")
        assert changes.get(5) == Change(Leader("c", c.term), False, 4)
        assert c.resign()
        assert changes.get(5) == Change(None, False, 5)
        with pytest.raises(TimeoutError):
            changes.get(0.2)  # nothing else happened


def test_observe_resynchronises_after_its_pubsub_connection_is_killed(server, key):
    r = server.client()
    election = Election(r, key)
    with election.observe() as changes:
        assert changes.get(5).leader is None
        a = election.campaign("a")
        assert changes.get(5).leader == Leader("a", a.term)
        (sub,) = [c for c in r.client_list() if c["name"] == feed.feed_for(r).sub_name]
        assert r.client_kill_filter(_id=int(sub["id"])) == 1
        # The feed reconnects and reads the state again: reported as a resynchronisation,
        # whatever changed meanwhile (here the leader changes as soon as the kill is done).
        assert a.resign()
        b = Election(r, key).campaign("b")
        seen = []
        while not seen or seen[-1].leader != Leader("b", b.term):
            assert len(seen) < 10, f"b never reported as leader: {seen}"
            seen.append(changes.get(5))
        assert any(change.resync for change in seen), seen
        assert b.resign()
        assert changes.get(5).leader is None
    r.close()


def spawn_candidate(server, key, value, ttl, *extra):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(HERE.parent), os.environ.get("PYTHONPATH", "")]))
    return subprocess.Popen(
        [sys.executable, str(CANDIDATE), str(server.port), key, value, str(ttl), *extra],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)


def read_line(proc, timeout=20):
    """The next line ``proc`` prints, within ``timeout`` seconds."""
    line = []
    reader = threading.Thread(target=lambda: line.append(proc.stdout.readline()))
    reader.start()
    reader.join(timeout)
    assert line and line[0], f"no line from the candidate (exit {proc.poll()}): {proc.stderr.read() if proc.poll() is not None else ''}"
    return line[0].split()


@pytest.mark.own_server
def test_leader_killed_the_next_leads_within_milliseconds(server, r, key):
    # Three candidates in bound sessions; the leader is SIGKILLed: its session ends with its
    # connection, and the next in the queue leads.
    election = Election(r, key)
    candidates = []
    try:
        with election.observe() as changes:
            assert changes.get(5).leader is None
            for i, value in enumerate(("c1", "c2", "c3")):  # one at a time: the queue order is known
                candidates.append(spawn_candidate(server, key, value, 30, "bound"))
                if value == "c1":
                    assert read_line(candidates[0])[0] == "leader"
                    first = changes.get(10).leader
                    assert first.value == "c1"
                else:
                    wait_waiters(r, key, i)
            disconnected = r.info("lock")["lock_sessions_disconnected"]
            killed = time.monotonic()
            candidates[0].send_signal(signal.SIGKILL)
            second = changes.get(10)
            took = time.monotonic() - killed
            assert second.leader.value == "c2" and second.leader.term > first.term and not second.resync
            assert read_line(candidates[1]) == ["leader", str(second.leader.term)]
            assert election.leader() == second.leader
            # The leader's session ended with its connection, not at its 30 s ttl (how fast is
            # `make bench`'s leader failover row).
            assert r.info("lock")["lock_sessions_disconnected"] == disconnected + 1
            print(f"takeover observed {took * 1000:.1f} ms after SIGKILL")
            candidates[1].send_signal(signal.SIGKILL)
            third = changes.get(10).leader
            assert third.value == "c3" and third.term > second.leader.term
    finally:
        for proc in candidates:
            proc.kill()
            proc.wait()


def test_leader_paused_past_its_ttl_is_fenced_off(server, r, key):
    candidates = [spawn_candidate(server, key, "p1", 0.6)]
    try:
        assert read_line(candidates[0])[0] == "leader"
        old = Election(r, key).leader()
        assert old.value == "p1"
        candidates.append(spawn_candidate(server, key, "p2", 0.6))
        wait_waiters(r, key, 1)
        candidates[0].send_signal(signal.SIGSTOP)  # no renewal, no write, past the 0.6 s ttl
        line = read_line(candidates[1])
        assert line[0] == "leader" and int(line[1]) > old.term
        new = Election(r, key).leader()
        assert new == Leader("p2", int(line[1]))
        # The old term's writes are refused from now on, wherever they come from.
        with pytest.raises(StaleTokenError):
            fenced_call(r, key, old.term, "SET", f"{key}:data", "stale")
        candidates[0].send_signal(signal.SIGCONT)
        lost = read_line(candidates[0])
        assert lost[0] == "lost", lost
        assert read_line(candidates[0]) == ["refused", str(old.term)]
        assert candidates[0].wait(10) == 0
        wait_until("the new leader's write", lambda: r.get(f"{key}:data") == b"p2")
    finally:
        for proc in candidates:
            proc.send_signal(signal.SIGCONT)
            proc.kill()
            proc.wait()


def test_async_campaign_observe_resign(server, key):
    async def main():
        ar = server.aclient()
        election = AsyncElection(ar, key)
        async with election.observe() as changes:
            assert await changes.get(5) == Change(None, True, 0)
            lost = []
            a = await election.campaign("a", on_lost=lost.append)
            assert await changes.get(5) == Change(Leader("a", a.term), False, 1)
            assert await election.leader() == Leader("a", a.term)
            other = AsyncElection(ar, key)
            waiting = asyncio.ensure_future(other.campaign("b"))
            probe = server.client()
            await await_until("b queued", lambda: waiters(probe, key) == 1)
            probe.close()
            assert await election.resign()
            b = await waiting
            assert b.term > a.term and await changes.get(5) == Change(Leader("b", b.term), False, 2)
            await ar.delete(key)
            assert (await changes.get(5)).leader is None
            await await_until("b's loss reported", lambda: b.lost)
            assert b.lost_reason == "feed: deleted" and lost == []
        await ar.aclose()

    asyncio.run(main())


def test_async_observe_resynchronises_after_its_pubsub_connection_is_killed(server, r, key):
    async def main():
        ar = server.aclient()
        election = AsyncElection(ar, key)
        async with election.observe() as changes:
            assert (await changes.get(5)).leader is None
            a = await election.campaign("a")
            assert (await changes.get(5)).leader == Leader("a", a.term)
            name = feed_aio.afeed_for(ar).sub_name
            (sub,) = [c for c in r.client_list() if c["name"] == name]
            assert r.client_kill_filter(_id=int(sub["id"])) == 1
            assert await a.resign()
            b = await AsyncElection(ar, key).campaign("b")
            seen = []
            while not seen or seen[-1].leader != Leader("b", b.term):
                assert len(seen) < 10, f"b never reported as leader: {seen}"
                seen.append(await changes.get(5))
            assert any(change.resync for change in seen), seen
            assert await b.resign()
            assert (await changes.get(5)).leader is None
        await ar.aclose()

    asyncio.run(main())
