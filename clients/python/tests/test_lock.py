"""Lock (sync) against a real server: every method, waits beyond the socket timeout,
FIFO order, interruption, the watchdog and its loss reports, fenced writes."""

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import redis
from redis.exceptions import LockError, LockNotOwnedError, ResponseError

from conftest import command_calls, wait_until, wait_waiters, waiters
from redislock_native import FENCE_CHECK_LUA, Lock, LockLostError, StaleTokenError, fenced_script


def info(r, key):
    reply = r.execute_command("LOCK.INFO", key)
    if isinstance(reply, list):
        reply = dict(zip(reply[::2], reply[1::2]))
    return None if reply is None else {k.decode(): v for k, v in reply.items()}


def test_acquire_release_token_locked_owned(r, key):
    a, b = Lock(r, key, 10), Lock(r, key, 10)
    assert a.token is None and not a.owned() and not a.locked()
    assert a.acquire(blocking=False) is True
    assert isinstance(a.token, int) and a.token > 0
    assert info(r, key)["owner"] == a.owner.encode()
    assert info(r, key)["token"] == a.token
    assert 9000 < r.pttl(key) <= 10000
    assert a.locked() and a.owned()
    assert b.acquire(blocking=False) is False and b.token is None
    assert b.locked() and not b.owned()
    first = a.token
    assert a.acquire(blocking=False) is True and a.token == first  # same owner: same hold
    assert a.release() is True
    assert a.token is None and not a.locked() and r.exists(key) == 0
    assert a.release() is False
    assert b.acquire(blocking=False) and b.token > first


def test_extend_moves_the_deadline_and_replaces_the_ttl(r, key):
    a = Lock(r, key, 10)
    assert a.acquire()
    assert a.extend(60) is True and 59000 < r.pttl(key) <= 60000 and a.ttl == 60
    assert a.extend() is True and 59000 < r.pttl(key) <= 60000
    r.delete(key)
    assert a.extend() is False


def test_bad_arguments_are_refused_before_sending(r, key):
    for ttl in (0, -1, float("nan"), "10"):
        with pytest.raises((ValueError, TypeError)):
            Lock(r, key, ttl)
    with pytest.raises(ValueError):
        Lock(r, key, 1, watchdog_period=1)
    with pytest.raises(ValueError):
        Lock(r, key, 1, owner="")


def test_wrongtype_is_raised(r, key):
    r.set(key, "a string")
    with pytest.raises(ResponseError, match="WRONGTYPE"):
        Lock(r, key, 1).acquire(blocking=False)
    with pytest.raises(ResponseError, match="WRONGTYPE"):
        Lock(r, key, 1).acquire(timeout=1)


def held_past_the_socket_timeout(server, key, hold_secs):
    """A client with a 1 s socket timeout, its command counts reset, `key` held by one of its
    locks and released by a thread `hold_secs` after a waiter is queued, and the waiter's
    Lock (not acquired yet)."""
    r = server.client(socket_timeout=1)
    holder, waiter = Lock(r, key, 30), Lock(r, key, 30)
    assert holder.acquire()
    r.config_resetstat()
    threading.Thread(target=lambda: (wait_waiters(r, key, 1), time.sleep(hold_secs), holder.release())).start()
    return r, waiter


@pytest.mark.own_server
def test_blocking_wait_outlasts_the_socket_timeout_with_one_command(server, key):
    # redis-py's defaults (Retry with retries) and a 1 s socket timeout: a wait of 2.5 s
    # must still be one LOCK.ACQUIRE, kept in the queue, granted on release.
    r, waiter = held_past_the_socket_timeout(server, key, 2.5)
    start = time.monotonic()
    assert waiter.acquire(timeout=20) is True
    assert time.monotonic() - start >= 2.5
    assert command_calls(r, "lock.acquire") == 1
    assert info(r, key)["owner"] == waiter.owner.encode()
    # The borrowed connection went back with the client's own socket timeout.
    for conn in r.connection_pool._available_connections:
        assert conn.socket_timeout == 1 and conn._sock.gettimeout() == 1
    assert waiter.release()


@pytest.mark.own_server
def test_wait_without_limit_outlasts_the_socket_timeout(server, key):
    r, waiter = held_past_the_socket_timeout(server, key, 1.5)
    assert waiter.acquire() is True  # timeout=None: LOCK.ACQUIRE ... BLOCK 0
    assert command_calls(r, "lock.acquire") == 1
    waiter.release()


@pytest.mark.own_server
def test_wait_that_runs_out_returns_false_and_leaves_the_queue(server, key):
    r = server.client(socket_timeout=0.5)
    holder, waiter = Lock(r, key, 30), Lock(r, key, 30)
    assert holder.acquire()
    r.config_resetstat()
    assert waiter.acquire(timeout=1.2) is False
    assert command_calls(r, "lock.acquire") == 1
    assert waiter.token is None and waiters(r, key) == 0
    assert info(r, key)["owner"] == holder.owner.encode()


@pytest.mark.own_server
def test_zero_timeout_is_one_try_not_a_wait_without_limit(r, key):
    holder = Lock(r, key, 30)
    assert holder.acquire()
    r.config_resetstat()
    assert Lock(r, key, 30).acquire(timeout=0) is False
    assert command_calls(r, "lock.acquire") == 1


def test_fifo_place_is_kept_past_the_socket_timeout(server, key):
    r = server.client(socket_timeout=1)
    holder, first, second = Lock(r, key, 30), Lock(r, key, 30), Lock(r, key, 30)
    assert holder.acquire()
    order = []

    def wait(lock):
        assert lock.acquire(timeout=20)
        order.append((lock, lock.token))

    t1 = threading.Thread(target=wait, args=(first,))
    t1.start()
    wait_waiters(r, key, 1)
    t2 = threading.Thread(target=wait, args=(second,))
    t2.start()
    wait_waiters(r, key, 2)
    time.sleep(1.2)  # both waits are now past the 1 s socket timeout
    assert waiters(r, key) == 2  # nobody was cut off and re-queued
    holder.release()
    t1.join(10)
    assert [lk for lk, _ in order] == [first] and waiters(r, key) == 1
    first.release()
    t2.join(10)
    assert [lk for lk, _ in order] == [first, second] and order[1][1] > order[0][1]
    second.release()


def test_interrupted_wait_leaves_no_waiter_and_no_grant(server, key):
    # A signal handler raising KeyboardInterrupt in the main thread, in the middle of the wait.
    r = server.client(socket_timeout=1)
    holder, waiter = Lock(r, key, 30), Lock(r, key, 30)
    assert holder.acquire()

    def interrupt(signum, frame):
        raise KeyboardInterrupt

    old = signal.signal(signal.SIGALRM, interrupt)
    try:
        signal.setitimer(signal.ITIMER_REAL, 0.5)
        with pytest.raises(KeyboardInterrupt):
            waiter.acquire(timeout=20)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
    assert waiters(r, key) == 0 and waiter.token is None
    holder.release()
    assert r.exists(key) == 0  # nothing was handed to the interrupted waiter
    assert r.ping()  # the client still works


def test_with_block_releases_and_reports_loss(r, key):
    with Lock(r, key, 10) as lock:
        assert lock.owned()
    assert r.exists(key) == 0
    with pytest.raises(LockLostError) as e:
        with Lock(r, key, 10):
            r.delete(key)
    assert isinstance(e.value, LockNotOwnedError)
    # An exception from the block wins over the loss report.
    with pytest.raises(ZeroDivisionError):
        with Lock(r, key, 10):
            r.delete(key)
            1 / 0


def test_with_block_gives_up_after_blocking_timeout(r, key):
    holder = Lock(r, key, 10)
    assert holder.acquire()
    with pytest.raises(LockError, match="could not acquire"):
        with Lock(r, key, 10, blocking_timeout=0.2):
            pass
    holder.release()


# --- watchdog ----------------------------------------------------------------------


@pytest.mark.own_server
def test_watchdog_keeps_the_lock_past_its_ttl_and_stops_on_release(r, key):
    lost = []
    lock = Lock(r, key, 1.2, watchdog=True, on_lost=lost.append)
    assert lock.acquire()
    token = lock.token
    r.config_resetstat()
    wait_until("four renewals", lambda: command_calls(r, "lock.extend") >= 4)  # 4 x 400 ms
    assert lock.owned() and lock.token == token and not lock.lost and lost == []
    dog = lock._dog
    assert lock.release() is True
    assert not dog.is_alive()  # release() joined it: no renewal in flight or to come
    renewals = command_calls(r, "lock.extend")
    time.sleep(0.9)  # more than two periods
    assert command_calls(r, "lock.extend") == renewals and r.exists(key) == 0


def test_watchdog_reports_a_deleted_key_and_never_extends_after(r, key):
    seen = threading.Event()
    lock = Lock(r, key, 1.2, watchdog=True, on_lost=lambda lk: seen.set(), feed=False)
    assert lock.acquire()
    r.delete(key)
    assert seen.wait(5)
    assert lock.lost and lock.lost_reason == "not held"
    assert not lock._dog.is_alive() and r.exists(key) == 0
    assert lock.release() is False


def test_watchdog_reports_a_failed_renewal(server, key):
    # The server stops answering: the renewal times out within its period, fail-safe.
    # A 2 s ttl renewed every 0.2 s: the loss is reported (0.2 s renewal timeout) long
    # before the hold could actually expire.
    r = server.client(socket_timeout=1)
    seen = threading.Event()
    lock = Lock(r, key, 2, watchdog=True, watchdog_period=0.2, on_lost=lambda lk: seen.set(), feed=False)
    assert lock.acquire()
    server.proc.send_signal(signal.SIGSTOP)
    try:
        assert seen.wait(5)
    finally:
        server.proc.send_signal(signal.SIGCONT)
    assert lock.lost_reason.startswith("extend failed: ")
    assert lock.release() is True  # it had in fact not expired yet: the release still works


HOLDER = Path(__file__).with_name("holder.py")


def test_holder_paused_past_its_ttl_learns_the_loss_at_once(server, key):
    # A holder process with a watchdog is stopped (SIGSTOP) past its ttl: a waiter gets the
    # lock; resumed, the holder's watchdog reports "not held" and never extends it back.
    child = subprocess.Popen(
        [sys.executable, str(HOLDER), str(server.port), key, "0.5"],
        stdout=subprocess.PIPE, text=True,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )
    try:
        line = child.stdout.readline().split()
        assert line[0] == "held", line
        held_token = int(line[1])
        r = server.client()
        waiter = Lock(r, key, 30)
        child.send_signal(signal.SIGSTOP)
        assert waiter.acquire(timeout=10)
        assert waiter.token > held_token
        child.send_signal(signal.SIGCONT)
        assert child.stdout.readline().split() == ["lost", "not", "held"]
        assert child.wait(10) == 0
        assert waiter.owned() and info(r, key)["owner"] == waiter.owner.encode()
        waiter.release()
    finally:
        child.kill()
        child.wait()


# --- fenced writes --------------------------------------------------------------------


def test_fenced_write_happens_only_with_the_live_token(r, key):
    lock = Lock(r, key, 10)
    assert lock.acquire()
    assert lock.fenced("SET", f"{key}:total", 100) == b"OK"
    assert r.get(f"{key}:total") == b"100"
    stale = Lock(r, key, 10)
    stale._token = lock.token
    lock.release()
    with pytest.raises(StaleTokenError, match=r"STALE token \d+ is not the live hold"):
        stale.fenced("SET", f"{key}:total", 1)
    with pytest.raises(StaleTokenError):
        lock.fenced("SET", f"{key}:total", 1)  # not held: no token at all
    assert r.get(f"{key}:total") == b"100"


def test_fenced_script_runs_its_body_behind_the_check(r, key):
    incr = fenced_script(r, "return redis.call('INCRBY', KEYS[2], ARGV[2])")
    assert incr.script.startswith(FENCE_CHECK_LUA)
    lock = Lock(r, key, 10)
    assert lock.acquire()
    assert incr(keys=[key, f"{key}:n"], args=[lock.token, 5]) == 5
    lock.release()
    with pytest.raises(StaleTokenError, match="^STALE"):  # as lock.fenced raises it
        incr(keys=[key, f"{key}:n"], args=[lock.token or 1, 5])
    assert r.get(f"{key}:n") == b"5"


def test_a_wait_whose_connection_another_thread_closes_raises_connection_error(server, r, key):
    # redis-py's cluster client resets a failed node's pool, connections in use included, from
    # whichever thread met the failure; a waiter blocked on such a connection then read redis-py's
    # closed buffer (redis-py 5.0.8: ValueError "I/O operation on closed file", after
    # "Connection closed by server.") and, not seeing a ConnectionError, did not queue again on
    # the new master (CI, test_planned_failover_keeps_holds_sessions_waiters_and_elections). It
    # must read as the lost connection it is.
    holder = Lock(r, key, 30, session=None)
    assert holder.acquire(blocking=False)
    client = server.client()
    waiter = Lock(client, key, 30, session=None)
    outcome = []

    def wait():
        try:
            outcome.append(waiter.acquire(timeout=20))
        except Exception as e:  # noqa: BLE001 - the exact type is what is checked
            outcome.append(e)

    t = threading.Thread(target=wait)
    t.start()
    wait_waiters(r, key, 1)
    client.connection_pool.disconnect()  # in-use connections too (redis-py's default)
    t.join(10)
    assert not t.is_alive()
    assert len(outcome) == 1 and isinstance(outcome[0], redis.exceptions.ConnectionError), outcome
    wait_waiters(r, key, 0)
    assert holder.release()
    assert r.exists(key) == 0
