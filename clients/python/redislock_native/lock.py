"""``Lock``: an exclusive lock held on the server, for a synchronous redis-py client."""

import threading
import time

from redis.exceptions import ConnectionError, LockError, LockNotOwnedError, ResponseError, TimeoutError

from . import _wire
from . import default_session as _default
from . import feed as _feed
from .fence import fenced_call


class LockLostError(LockNotOwnedError):
    """The lock was not held any more when the ``with`` block ended (expired, deleted, taken)."""


class LockBusyError(LockError):
    """``with lock:`` (``async with``) could not acquire within ``blocking_timeout``: the lock is
    held by another owner. ``acquire()`` answers False for the same outcome, never raises it."""


class NotDurableError(LockError):
    """An acquire with ``durable=n`` was granted, but fewer than ``n`` replicas acknowledged the
    grant within ``durable_timeout``: neither "busy" nor success.

    - ``acknowledged``: how many replicas did.
    - ``released``: the grant this call made was given back (``LOCK.RELEASE``). False when
      that release failed too (the lock may stay held until its ttl runs out) or when this
      object already held the lock before the call (an idempotent retry: the earlier hold
      stays, and ``held`` is True).
    """

    def __init__(self, message, name, acknowledged, wanted, released, held):
        try:
            super().__init__(message, lock_name=name)
        except TypeError:  # redis-py before 5.1 has no lock_name
            super().__init__(message)
        self.acknowledged = acknowledged
        self.wanted = wanted
        self.released = released
        self.held = held


class _Base:
    """What ``Lock`` and ``AsyncLock`` share: arguments, state and the commands they send."""

    #: Options after ``ttl-ms`` in LOCK.ACQUIRE: none for an exclusive lock, ``SHARED``
    #: (and ``LIMIT n``) for the shared holders in ``redislock_native.shared``.
    _mode_args = ()

    def __init__(
        self,
        client,
        name,
        ttl,
        *,
        owner=None,
        blocking_timeout=None,
        watchdog=False,
        watchdog_period=None,
        on_lost=None,
        durable=0,
        durable_timeout=1.0,
        session=_default.DEFAULT,
        lock_delay=None,
        feed=True,
    ):
        self.client = client
        self.name = name
        #: A session given by the user: the hold is the session's alone (no watchdog, ttl 0 allowed).
        self._explicit_session = session is not _default.DEFAULT and session is not None
        #: Not given: the hold also joins the client's default session (``default_session``),
        #: keeping its own ttl; not with a lock-delay, which in a session is the session's.
        self._joins_default = session is _default.DEFAULT and lock_delay is None
        #: The session the hold is in: the given one, the default one once acquired, or None.
        self.session = session if self._explicit_session else None
        if self._explicit_session:
            if watchdog:
                raise ValueError("a lock in a session runs no watchdog: the session's keepalive covers it")
            if lock_delay is not None:
                raise ValueError("a hold in a session has its session's lock_delay")
        # In an explicit session a ttl of 0 means no deadline of the hold's own.
        self._ttl_ms = _wire.to_ms(ttl, "ttl", allow_zero=self._explicit_session)
        self._delay_ms = None
        if lock_delay is not None:
            self._delay_ms = _wire.to_ms(lock_delay, "lock_delay", allow_zero=True)
        self.owner = owner if owner is not None else _wire.new_owner()
        if isinstance(self.owner, (str, bytes)) and len(self.owner) == 0:
            raise ValueError("owner must not be empty")
        if blocking_timeout is not None:
            _wire.to_ms(blocking_timeout, "blocking_timeout", allow_zero=True)
        self.blocking_timeout = blocking_timeout
        self.watchdog = bool(watchdog)
        if watchdog_period is not None:
            period_ms = _wire.to_ms(watchdog_period, "watchdog_period")
            if period_ms >= self._ttl_ms:
                raise ValueError("watchdog_period must be shorter than the ttl")
        self.watchdog_period = watchdog_period
        self.on_lost = on_lost
        if not isinstance(durable, int) or durable < 0:
            raise ValueError("durable must be a number of replicas (0: do not wait)")
        self.durable = durable
        self._durable_ms = _wire.to_ms(durable_timeout, "durable_timeout", allow_zero=True)
        self.feed = bool(feed)
        self._token = None
        self._lost_reason = None
        self._lost_mutex = threading.Lock()
        self._feed_sub = None  # this hold's watch in the client's change feed (feed.py)
        self._cluster = _wire.is_cluster(client)
        self._renewed_sent = None  # time.monotonic() when the last grant or renewal was sent

    # --- state ---

    @property
    def token(self):
        """The fencing token of the current hold (an int), or None when not held."""
        return self._token

    @property
    def ttl(self):
        """The hold time in seconds that acquire, extend() and the watchdog ask for."""
        return self._ttl_ms / 1000

    @property
    def lost(self):
        """True once the watchdog or the session found the lock gone (see ``lost_reason``)."""
        return self._lost_reason is not None

    @property
    def lost_reason(self):
        """Why the hold was found lost, None while not: from the watchdog ``"not held"``
        (LOCK.EXTEND answered 0: expired, deleted or taken) or ``"extend failed: <error>"`` (no
        answer within its period); from the session ``"session lost: <its lost_reason>"``; from
        the change feed ``"feed: <event>"`` (``expired``, ``lost``, ``released``, ``deleted``,
        ``flushed``, ``swapped``, ``demoted``), ``"feed: acquired to 'owner'"`` / ``"feed:
        handoff to 'owner'"`` (another owner was granted it after this token), ``"feed: not held
        (LOCK.INFO)"``, ``"deadline passed: no renewal succeeded"`` or ``"feed connection lost:
        <error>"``. The first report wins; a hold is reported lost once."""
        return self._lost_reason

    def _period(self):
        if self.watchdog_period is not None:
            return self.watchdog_period
        return self._ttl_ms / 3000

    # --- commands ---

    def _acquire_args(self, blocking, timeout):
        """The LOCK.ACQUIRE arguments and the wait in seconds (None: no limit, 0: no wait)."""
        args = ("LOCK.ACQUIRE", self.name, self.owner, self._ttl_ms) + self._mode_args
        if self.session is not None:
            args += ("SESSION", self.session._usable_id())
        if self._delay_ms is not None:
            args += ("LOCKDELAY", self._delay_ms)
        if not blocking:
            return args, 0
        if timeout is None:
            return args + ("BLOCK", 0), None  # BLOCK 0 waits without limit
        block_ms = _wire.to_ms(timeout, "timeout", allow_zero=True)
        if block_ms == 0:
            return args, 0  # BLOCK 0 would wait forever: a zero wait is a single try
        return args + ("BLOCK", block_ms), block_ms / 1000

    def _release_args(self):
        return ("LOCK.RELEASE", self.name, self.owner)

    def _extend_args(self, ttl):
        if ttl is not None:
            self._ttl_ms = _wire.to_ms(ttl, "ttl", allow_zero=self._explicit_session)
        return ("LOCK.EXTEND", self.name, self.owner, self._ttl_ms)

    def _renewed(self, reply):
        """Whether a renewal's reply says the hold is still there."""
        return reply == 1

    def _durable_args(self):
        """``(replicas, timeout_ms)`` for the ``WAIT`` after a grant, or None."""
        return (self.durable, self._durable_ms) if self.durable else None

    def _not_durable(self, acked, held_before, released):
        if held_before:
            state = "the lock stays held: this object held it before the call"
        elif released:
            state = "the grant was released"
        else:
            state = "releasing the grant failed too: the lock may stay held until its ttl"
        return NotDurableError(
            f"{acked} of {self.durable} replicas acknowledged the grant of {self.name!r} within "
            f"{self._durable_ms} ms; {state}",
            self.name,
            acked,
            self.durable,
            released and not held_before,
            held_before,
        )

    def _granted(self, reply):
        if reply is None:
            return False
        self._token = int(reply)
        self._lost_reason = None
        return True

    def _needs_default(self):
        """Whether an acquire must first find the client's default session (it has none, or
        the one it had was lost or closed: a new one is opened)."""
        return self._joins_default and (self.session is None or not self.session._usable())

    def _in_session(self):
        """After a grant: the session reports this hold's loss. True if it was lost already."""
        return self.session is not None and self.session._hold(self)

    def _pooled(self):
        return _wire.node_client(self.client, self.name)

    def _run(self, *args):
        """``args`` through the user's client, straight to the node of this lock's key in a
        cluster (``_wire.route``); a coroutine for an asyncio client."""
        return self.client.execute_command(*args, **_wire.route(self.client, self.name))

    def _let_go(self):
        """Before a release: not held any more, and not the session's or the feed's to report."""
        self._unwatch_feed()
        self._token = None
        if self.session is not None:
            self.session._forget(self)

    # --- the change feed: loss reported at once (feed.py) ---

    def _feed_tokens(self):
        """The keys this hold watches, with its token on each."""
        return {self.name: self._token}

    def _first_deadline(self, sent_at, wait):
        """The hold's conservative deadline after a grant whose command was sent at ``sent_at``:
        known only for a single try (a blocking grant came at some point of the wait: the feed
        reads the hold's ttl from LOCK.INFO instead). None for a hold with no deadline."""
        if wait != 0 or self._ttl_ms == 0:
            return None
        ttl_s = self._ttl_ms / 1000
        return sent_at + ttl_s - _feed.margin(ttl_s)

    def _watch_feed(self, feed, deadline):
        """After a grant: watch the key through ``feed`` (the client's) if a loss callback wants it."""
        if self.on_lost is None or not self.feed or self._feed_sub is not None or feed is None:
            return
        self._feed_sub = feed.hold(self, self._feed_tokens(), "SHARED" in self._mode_args, deadline)

    def _unwatch_feed(self):
        sub, self._feed_sub = self._feed_sub, None
        if sub is not None:
            sub.feed.drop(sub)

    def _renewed_at(self, sent_at):
        """A renewal sent at ``sent_at`` succeeded: the feed's deadline moves."""
        sub = self._feed_sub
        if sub is not None and self._ttl_ms:
            sub.feed.renewed(sub, sent_at, self._ttl_ms / 1000)

    def _claim_loss(self, reason):
        """Record ``reason``; False if a loss of this hold was reported already (report once)."""
        with self._lost_mutex:
            if self._lost_reason is not None:
                return False
            self._lost_reason = reason
        self._unwatch_feed()
        return True

    def __repr__(self):
        state = f"token={self._token}" if self._token is not None else "not held"
        return f"<{type(self).__name__} {self.name!r} owner={self.owner!r} {state}>"


class Lock(_Base):
    """An exclusive lock on the redis-lock module, through a ``redis.Redis`` client.

    ``Lock(client, name, ttl)`` takes nothing yet; ``acquire()`` does. ``ttl`` is the hold
    time in seconds (fractions allowed, at least 1 ms). Keyword arguments:

    - ``owner``: who holds it (default: ``host:pid:uuid4``, new for every Lock object).
      Two Lock objects with the same owner share one hold.
    - ``blocking_timeout``: how long ``with lock:`` waits (seconds; None: no limit).
    - ``watchdog``: renew the hold every ``watchdog_period`` seconds (default ttl/3) from
      a daemon thread while it is held. It stops at ``release()``, or when a renewal
      answers 0 or fails, and then sets ``lost`` / ``lost_reason`` and calls
      ``on_lost(lock)`` (from the watchdog thread). It never extends a lock this owner no
      longer holds: LOCK.EXTEND checks the owner on the server.
    - ``durable``: a grant counts only once that many replicas acknowledged it (``WAIT n``
      on the same connection, up to ``durable_timeout`` seconds, default 1); otherwise
      ``acquire()`` gives the grant back and raises ``NotDurableError``. Needs Redis 7.0.12+.
    - ``session``: not given, the hold joins the client's default session
      (``redislock_native.default_session``: one bound session per client and server, so the
      hold ends within milliseconds of this process dying) and keeps its own ``ttl``, watchdog
      and ``extend()``. ``session=None``: the hold lives by its ttl alone. A ``Session``
      (``redislock_native.session``): the hold belongs to it alone (``SESSION id``): it ends
      when the session ends, and ``ttl`` may be 0 (no deadline of its own); no watchdog: the
      session's one keepalive covers every hold. A session's loss (the default's too) is
      reported on each hold (``lost_reason`` ``"session lost: ..."``, ``on_lost(lock)``).
    - ``lock_delay``: seconds nobody is granted the lock after this hold expired (``LOCKDELAY
      ms``); not with an explicit ``session`` (a session hold has its session's delay), and
      never in the default session (the lock holds by its ttl alone).
    - ``feed`` (default True): with ``on_lost``, the hold is watched through the change feed
      while held (``LOCK.WATCH``, ``redislock_native.feed``: one watch and one pub/sub
      connection per client object, not per lock), so ``on_lost(lock)`` is called (from the
      feed's thread) the moment the server reports the hold ended (expired, session lost,
      deleted, flushed, swapped, demoted, released elsewhere, or granted to another owner), at
      the hold's own conservative deadline if no renewal succeeded by then, or when the feed's
      connection is lost. Never while renewals succeed. ``feed=False``: the watchdog or the
      session alone reports. With a ``RedisCluster`` client the feed is that of the key's node.

    A blocking ``acquire()`` is one ``LOCK.ACQUIRE ... BLOCK`` command, however long the
    wait and whatever the client's socket timeout or retry policy: it keeps its place in
    the server's FIFO queue. Other commands go through the client as usual.
    """

    def __init__(self, client, name, ttl, **kwargs):
        super().__init__(client, name, ttl, **kwargs)
        self._dog = None

    def acquire(self, blocking=True, timeout=None):
        """Take the lock; True if granted.

        ``blocking=False``: one try. Otherwise wait in the server's queue for up to
        ``timeout`` seconds (None: no limit; 0: one try) and return False if it ran out.
        If the call fails (no reply, connection lost) or is interrupted after the command
        may have reached the server, and this object did not hold the lock before, a
        ``LOCK.RELEASE`` gives back a grant whose reply was lost; then the error is raised.

        In the client's default session: if that session ended before or while this call
        waited (``ERR no such session``, ``ERR the session ended while the client waited``: its
        connection dropped on a server without ``GRACE``), the call tries again in a new
        default session, at the back of the queue, within what is left of ``timeout``.
        """
        ends = None if timeout is None else time.monotonic() + timeout
        for attempt in range(_default.ATTEMPTS):
            if self._needs_default():
                self.session = _default.session_for(self.client, self.name)
            try:
                return self._acquire(blocking, timeout)
            except ResponseError as e:
                if not self._joins_default or not _default.session_gone(e) or attempt + 1 == _default.ATTEMPTS:
                    raise
                _default.retire(self.client, self.session)
                if ends is not None:
                    timeout = max(0.0, ends - time.monotonic())

    def _acquire(self, blocking, timeout):
        args, wait = self._acquire_args(blocking, timeout)
        held_before = self._token is not None
        cleanup = (lambda: None) if held_before else self._release_quietly
        sent_at = time.monotonic()
        if self.durable:
            _wire.check_durable(self.client.info("server"))
        ends = None if wait is None else sent_at + wait
        while True:
            try:
                reply = self._acquire_once(args, wait, held_before, cleanup)
                break
            except (ResponseError, ConnectionError) as e:
                # In a cluster, a waiter whose master became a replica (UNBLOCKED, or its
                # connection closed by the demoted node), or a try sent to a node that no longer
                # serves the slot (MOVED, READONLY), did not get the lock (a grant whose reply
                # was lost was given back: see _wire.acquire_blocking): it queues again on the
                # slot's master, within its own timeout.
                if not self._cluster or not _wire.moved_away(e):
                    raise
                left = None if ends is None else ends - time.monotonic()
                if wait == 0 and time.monotonic() - sent_at >= _wire.FOLLOW_TRY:
                    raise
                if left is not None and left <= 0 and wait != 0:
                    return False
                _wire.refresh_slots(self.client)
                time.sleep(_wire.FOLLOW_BACKOFF)
                if wait != 0:
                    args, wait = self._acquire_args(True, left)
        if not self._granted(reply):
            return False
        self._renewed_sent = sent_at
        if self._in_session():
            self._report_lost(f"session lost: {self.session.lost_reason}")
        elif self.on_lost is not None and self.feed:
            self._watch_feed(_feed.feed_for(self.client, self.name), self._first_deadline(sent_at, wait))
        if self.watchdog:
            self._start_watchdog()
        return True

    def _acquire_once(self, args, wait, held_before, cleanup):
        """One ``LOCK.ACQUIRE`` (and its ``WAIT`` when durable): the reply."""
        if self.durable:
            reply, acked = _wire.acquire_blocking(self._pooled(), args, wait, cleanup, self._durable_args())
            if reply is not None and acked < self.durable:
                # `cleanup` releases only a grant this call made (nothing if held before).
                raise self._not_durable(acked, held_before, _wire.succeeds(cleanup))
        elif wait == 0:
            try:
                reply = self._run(*args)
            except (ConnectionError, TimeoutError):
                _wire._quietly(cleanup)
                raise
        else:
            reply = _wire.acquire_blocking(self._pooled(), args, wait, cleanup)
        return reply

    def release(self):
        """Give the lock back; True if this owner held it, False if it was already lost.

        Stops the watchdog first (and waits for a renewal in flight), then sends LOCK.RELEASE.
        """
        self._stop_watchdog()
        self._let_go()
        return self._run(*self._release_args()) == 1

    def _release_quietly(self):
        self._run(*self._release_args())

    def extend(self, ttl=None):
        """Set the deadline to now + ``ttl`` seconds (default: the lock's ttl, which a given
        ``ttl`` replaces, also for the watchdog). True if held; False if lost: acquire again."""
        sent_at = time.monotonic()
        if self._run(*self._extend_args(ttl)) != 1:
            return False
        self._renewed_at(sent_at)
        return True

    def locked(self):
        """True if anyone holds the lock (``LOCK.FENCE key``; works on replicas too)."""
        return self._run("LOCK.FENCE", self.name) is not None

    def owned(self):
        """True if this object's hold is the live one (``LOCK.FENCE key token``)."""
        if self._token is None:
            return False
        return self._run("LOCK.FENCE", self.name, self._token) == 1

    def fenced(self, command, key, *args):
        """Run ``command key *args`` only while this hold is live; else StaleTokenError.

        E.g. ``lock.fenced("SET", "invoice:42:total", 100)``. See ``redislock_native.fence``.
        """
        return fenced_call(self.client, self.name, self._token, command, key, *args)

    def __enter__(self):
        if self.acquire(timeout=self.blocking_timeout):
            return self
        raise _wire.lock_error(
            LockBusyError, f"could not acquire {self.name!r} within {self.blocking_timeout} s", self.name
        )

    def __exit__(self, exc_type, exc, tb):
        if not self.release() and exc_type is None:
            raise _wire.lock_error(
                LockLostError, f"{self.name!r} was no longer held by {self.owner!r} at release", self.name
            )

    # --- watchdog ---

    def _start_watchdog(self):
        if self._dog is None or not self._dog.is_alive():
            self._dog = _Watchdog(self)
            self._dog.start()

    def _stop_watchdog(self):
        dog, self._dog = self._dog, None
        if dog is not None:
            dog.stop()

    def _renew(self):
        """One renewal within the period; True if still held. In a cluster a renewal that meets
        a failover (``_wire.moved_away``) is sent again to the slot's master, looked up afresh,
        until the hold's deadline from the last renewal sent: a failover alone loses nothing."""
        sent_at = time.monotonic()
        while True:
            try:
                reply = _wire.call_timed(self._pooled(), self._extend_args(None), self._period())
                break
            except Exception as e:
                since = self._renewed_sent if self._renewed_sent is not None else sent_at
                if not self._cluster or not _wire.moved_away(e) or time.monotonic() >= since + self._ttl_ms / 1000:
                    raise
                dog = self._dog
                if dog is not None and dog._stopped.is_set():
                    raise
            _wire.refresh_slots(self.client)
            time.sleep(_wire.FOLLOW_BACKOFF)
        if not self._renewed(reply):
            return False
        self._renewed_sent = sent_at
        self._renewed_at(sent_at)
        return True

    def _report_lost(self, reason):
        if not self._claim_loss(reason):
            return
        self._halt_watchdog()
        if self.on_lost is not None:
            self.on_lost(self)

    def _halt_watchdog(self):
        """No more renewals (the hold is gone: lost, or its session closed); never waits."""
        dog = self._dog
        if dog is not None:
            dog._stopped.set()

    def _feed_lost(self, sub, reason):
        """The feed found this hold lost (from the feed's thread): stop renewing, report once."""
        if self._feed_sub is not sub:
            return  # a hold released, or reported, since
        dog = self._dog
        if dog is not None:
            dog._stopped.set()
        self._report_lost(reason)


class _Watchdog(threading.Thread):
    """Renews a Lock every period until stopped or the lock is gone; reports a loss once."""

    def __init__(self, lock):
        super().__init__(name=f"redislock-watchdog:{lock.name}", daemon=True)
        self._lock = lock
        self._stopped = threading.Event()

    def run(self):
        lock = self._lock
        while not self._stopped.wait(lock._period()):
            try:
                held = lock._renew()
            except Exception as e:  # no answer within the period: fail safe, count it lost
                if not self._stopped.is_set():
                    lock._report_lost(f"extend failed: {e!r}")
                return
            if not held:
                if not self._stopped.is_set():
                    lock._report_lost("not held")
                return

    def stop(self):
        """Stop renewing; once this returns no renewal is in flight and none will follow."""
        self._stopped.set()
        if threading.current_thread() is not self:
            self.join()
