"""Sessions: one lease for many holds (``LOCK.SESSION``), with one keepalive.

A ``Session`` opens ``LOCK.SESSION OPEN ttl-ms [BOUND] [LOCKDELAY ms]`` and keeps it alive with
``LOCK.SESSION KEEPALIVE id`` every ``keepalive_period`` (default ttl/3) from one daemon thread
(an asyncio task for ``AsyncSession``), however many locks it holds. A lock, semaphore,
read/write lock or multi-key lock made with ``session=`` acquires with ``SESSION id`` and runs no
watchdog: its hold ends when the session ends (or at its own deadline; a ttl of 0 means none).

How a session is lost, and how that is reported (once, from the keepalive thread or task):

- ``"ended"``: ``KEEPALIVE`` answered nil: the server has no such session any more (it expired,
  was closed from elsewhere, or its bound connection closed). Every hold it had is gone.
- ``"keepalive failed: <error>"``: no answer within the period. Fail-safe, as the watchdog: the
  holder can no longer count on its holds.
- ``"connection lost: <error>"`` (``bound=True``): the dedicated connection closed. The server
  ends a bound session the moment it sees that connection close.

Then ``lost`` is True, ``lost_reason`` says why, ``on_lost(session)`` is called, and every hold
of the session is reported as each lock reports a loss today: its ``lost_reason`` becomes
``"session lost: <reason>"`` and its own ``on_lost(lock)`` is called.

``bound=True``: the session is opened on a dedicated connection, made like the client's own
(same address, credentials and database) but not in its pool, with no retries and no health
check (either could silently replace it with a new connection the session is not bound to). It
stays open for the session's life and carries nothing but the session's ``KEEPALIVE``; between
keepalives the thread (task) waits on it, so a close by the server is seen at once. No
re-``ATTACH``: after that connection drops the session is lost, even when the server still has
it (a restart, a promotion). (The client's default session, ``default_session``, re-attaches
after a blip when the server keeps it a grace: ``_reattaches``.) A session found again would not prove that each of its holds
survived: a promoted replica or an AOF restart can miss the newest grants. Open a new session.

In a Redis Cluster a session belongs to one node: ``key=`` names a key the session will lock,
and ``OPEN`` goes to that key's node (``target_nodes``). The id carries a hash tag of a slot
that node serves, and ``KEEPALIVE``, ``CLOSE`` and ``INFO`` declare the id at a key's position (a
key spec flagged ``not_key``: routed like a key, never checked against ACL key patterns); they
are sent to the node that serves the id's slot (see ``_route``). Every lock in the session must
be on that node.
"""

import asyncio
import inspect
import select
import socket
import threading
import time

from redis.backoff import NoBackoff
from redis.exceptions import ConnectionError, LockError, ResponseError, TimeoutError
from redis.retry import Retry

from . import _wire

#: ``LOCK.SESSION OPEN ... LOCKDELAY ms``: the server refuses more than this.
MAX_LOCK_DELAY = 60.0


is_cluster = _wire.is_cluster

#: ``Session(...)`` with a cluster client and no ``key=``.
NEEDS_KEY = (
    "a session in a cluster belongs to one node, the master of a slot: name a key it will lock "
    "(key=...); OPEN goes to that key's master, and every lock of the session must be on it"
)


def _text(value):
    return value.decode() if isinstance(value, bytes) else value


def _fields(reply):
    """A map reply (RESP3 dict or RESP2 flat list) as a dict with str keys."""
    if reply is None:
        return None
    if isinstance(reply, list):
        reply = dict(zip(reply[::2], reply[1::2]))
    return {_text(k): v for k, v in reply.items()}


def _dedicated_kwargs(kwargs):
    """A connection's arguments with nothing that could replace its socket behind our back."""
    return dict(kwargs, retry=Retry(NoBackoff(), 0), health_check_interval=0)


class _SessionBase:
    """What ``Session`` and ``AsyncSession`` share: arguments, state, commands, decisions."""

    def __init__(self, client, ttl, *, bound=False, lock_delay=None, key=None, on_lost=None, keepalive_period=None):
        self.client = client
        self._ttl_ms = _wire.to_ms(ttl, "ttl")
        self.bound = bool(bound)
        self._delay_ms = None
        if lock_delay is not None:
            if not isinstance(lock_delay, bool) and isinstance(lock_delay, (int, float)) and lock_delay > MAX_LOCK_DELAY:
                raise ValueError(f"lock_delay must be at most {MAX_LOCK_DELAY:g} s, got {lock_delay!r}")
            self._delay_ms = _wire.to_ms(lock_delay, "lock_delay", allow_zero=True)
        self._cluster = is_cluster(client)
        if self._cluster and key is None:
            raise ValueError(NEEDS_KEY)
        self.key = key
        self.on_lost = on_lost
        if keepalive_period is not None:
            if _wire.to_ms(keepalive_period, "keepalive_period") >= self._ttl_ms:
                raise ValueError("keepalive_period must be shorter than the ttl")
        self.keepalive_period = keepalive_period
        self._id = None
        #: The session's public serial (``LOCK.SESSION LIST``), known once a bound session is
        #: open; its connection is named ``redislock-session-<serial>``.
        self.serial = None
        self._closed = False
        self._lost_reason = None
        self._holds = set()  # the lock objects holding in this session now
        self._mutex = threading.Lock()

    # --- state ---

    @property
    def id(self):
        """The session id (a str, ``{tag}`` + 32 hex digits), or None before ``open()``. A secret:
        whoever knows it can keep the session alive or close it."""
        return self._id

    @property
    def ttl(self):
        """The session's ttl in seconds: it ends this long after its last keepalive."""
        return self._ttl_ms / 1000

    @property
    def lock_delay(self):
        """Seconds nobody is granted what a hold of this session had, after it was lost
        uncleanly (None: the server's default, 0)."""
        return None if self._delay_ms is None else self._delay_ms / 1000

    @property
    def lost(self):
        """True once the session was found gone or unreachable (see ``lost_reason``); set just
        before the loss is reported (``on_lost``)."""
        return self._lost_reason is not None

    @property
    def lost_reason(self):
        """``"ended"``, ``"keepalive failed: ..."`` or ``"connection lost: ..."``; None while not lost."""
        return self._lost_reason

    @property
    def closed(self):
        """True once ``close()`` was called."""
        return self._closed

    def _period(self):
        if self.keepalive_period is not None:
            return self.keepalive_period
        return self._ttl_ms / 3000

    def _opened_id(self):
        if self._id is None:
            raise LockError("the session is not open: call open() or use it in a with block")
        return self._id

    def _usable_id(self):
        """The id for an acquire's ``SESSION id``; LockError if the session cannot take holds."""
        self._opened_id()
        if self._closed:
            raise LockError("the session is closed")
        if self._lost_reason is not None:
            raise LockError(f"the session was lost ({self._lost_reason}): open a new one")
        return self._id

    # --- commands ---

    def _open_args(self):
        args = ("LOCK.SESSION", "OPEN", self._ttl_ms)
        if self.bound:
            args += ("BOUND",)
        if self._delay_ms is not None:
            args += ("LOCKDELAY", self._delay_ms)
        return args

    def _keepalive_args(self):
        return ("LOCK.SESSION", "KEEPALIVE", self._id)

    def _route(self):
        """Keyword arguments that send a command about this session to its node.

        In a cluster: the node that serves the id's hash tag, from the client's slot table.
        redis-py finds the same node by itself too (from the subcommand's key position in
        ``COMMAND``); naming it here does not depend on that."""
        return {"target_nodes": self.client.get_node_from_key(self._id)} if self._cluster else {}

    def _follow_deadline(self, since):
        """Until when a cluster session whose last keepalive was sent at ``since`` (monotonic)
        is worth looking for on the slot's (new) master: past its ttl the server has ended it."""
        return since + self._ttl_ms / 1000

    def _reattaches(self, error):
        """Whether the bound connection's end by ``error`` is worth a re-``ATTACH`` rather than
        a loss: in a cluster, a failover (``_wire.moved_away``). The default session
        (``default_session``) also re-attaches after a blip when the server keeps it a grace."""
        return self._cluster and error is not None and _wire.moved_away(error)

    def _attach_deadline(self):
        """Until when (monotonic) a re-``ATTACH`` is tried: in a cluster, the session's ttl
        from its last keepalive (a promoted replica keeps it that long, unbound)."""
        return self._follow_deadline(self._last_ok)

    @staticmethod
    def _attach_again(error):
        """Whether an ``ATTACH`` that failed with ``error`` is worth another try: the slot's
        master moved, or the server has not yet seen the old connection close (``ERR the
        session is bound to another connection that is still open``)."""
        return _wire.moved_away(error) or "still open" in str(error)

    def _opened(self, reply):
        if reply is None:
            raise LockError("LOCK.SESSION OPEN answered nil")
        self._id = _text(reply)
        return self

    def _check_not_open(self):
        if self._id is not None:
            raise LockError("this session object was opened already; make a new one")

    # --- holds ---

    def _hold(self, lock):
        """A lock of this session was granted: it is reported lost with the session.

        True if the session was lost already (the caller reports that hold's loss now)."""
        with self._mutex:
            self._holds.add(lock)
            return self._lost_reason is not None

    def _forget(self, lock):
        with self._mutex:
            self._holds.discard(lock)

    def _lose(self, reason):
        """Mark the session lost; the holds to report, or None if it was lost or closed already."""
        with self._mutex:
            if self._lost_reason is not None or self._closed:
                return None
            self._lost_reason = reason
            holds, self._holds = list(self._holds), set()
            return holds

    def _quiet(self):
        """Before ``CLOSE``: the holds stop watching the feed, which would report their release."""
        with self._mutex:
            holds = list(self._holds)
        for lock in holds:
            lock._unwatch_feed()

    def _let_go(self):
        """``close()``: the server released every hold cleanly; they are simply not held now."""
        with self._mutex:
            self._closed = True
            holds, self._holds = list(self._holds), set()
        for lock in holds:
            lock._token = None
            halt = getattr(lock, "_halt_watchdog", None)
            if halt is not None:
                halt()
            if hasattr(lock, "tokens"):
                lock.tokens = None

    def __repr__(self):
        state = "lost" if self.lost else "closed" if self._closed else "open" if self._id else "not open"
        return f"<{type(self).__name__} {state} ttl={self.ttl} bound={self.bound}>"


class Session(_SessionBase):
    """A session on the redis-lock module, through a ``redis.Redis`` (or ``RedisCluster``) client.

    ``Session(client, ttl)`` opens nothing yet; ``open()`` (or ``with``) does. ``ttl`` is in
    seconds: the session ends that long after its last keepalive. Keyword arguments:

    - ``bound``: the session also ends the moment its dedicated connection closes (the holder
      exits, crashes, is killed, or the connection drops).
    - ``lock_delay``: seconds (0 to 60) nobody is granted what a hold of this session had after
      the session was lost uncleanly (expired, or its bound connection closed); ``close()`` has
      no delay.
    - ``key``: with a cluster client, a key the session will lock (its node opens the session).
    - ``on_lost(session)``: called once, from the keepalive thread, when the session is lost.
    - ``keepalive_period``: seconds between keepalives (default ttl/3).
    """

    #: The keepalive thread's name, before ``:`` and the id's first characters.
    _thread_name = "redislock-session"

    def __init__(self, client, ttl, **kwargs):
        super().__init__(client, ttl, **kwargs)
        self._conn = None
        self._thread = None
        self._stopping = threading.Event()
        self._wake = None
        self._last_ok = None  # time.monotonic() when the last successful keepalive was sent

    def open(self):
        """Open the session (``LOCK.SESSION OPEN``) and start its keepalive; returns self."""
        self._check_not_open()
        if self.bound:
            self._conn = self._connect()
            try:
                self._conn.send_command(*self._open_args())
                self._opened(self._conn.read_response())
                self._name_connection()
            except BaseException:
                self._conn.disconnect()
                self._conn = None
                raise
            self._wake = socket.socketpair()
        elif self._cluster:
            self._opened(self._following(lambda: self.client.execute_command(*self._open_args(), target_nodes=self._node()),
                                         time.monotonic() + self._ttl_ms / 1000))
        else:
            self._opened(self.client.execute_command(*self._open_args()))
        self._last_ok = time.monotonic()
        self._thread = threading.Thread(target=self._keep, name=f"{self._thread_name}:{self._id[:8]}", daemon=True)
        self._thread.start()
        return self

    def close(self):
        """End the session (``LOCK.SESSION CLOSE``): every hold is released, with no lock delay.

        Returns the number of holds released, or None if the server had no such session (it
        was lost). Stops the keepalive first (and waits for one in flight)."""
        if self._id is None or self._closed:
            return None
        self._stop()
        self._quiet()
        try:
            reply = self._command("LOCK.SESSION", "CLOSE", self._id)
        finally:
            self._let_go()
            if self._conn is not None:
                self._conn.disconnect()
        return reply

    def _name_connection(self):
        """Name the bound connection after the session's serial (``LOCK.SESSION INFO``), never
        its id, so that ``CLIENT LIST`` says whose it is: ``name=redislock-session-<serial>``.
        Best effort: a server without the serial in ``INFO`` or a user refused ``CLIENT
        SETNAME`` leaves the connection unnamed."""
        self._conn.send_command("LOCK.SESSION", "INFO", self._id)
        info = _fields(self._conn.read_response())
        self.serial = info.get("serial") if info else None
        if self.serial is None:
            return
        self._conn.send_command("CLIENT", "SETNAME", f"redislock-session-{self.serial}")
        try:
            self._conn.read_response()
        except ResponseError:
            pass

    def info(self):
        """``LOCK.SESSION INFO``: a dict (``ttl`` ms left, ``bound``, ``lockdelay``, ``holds``), or
        None if the server has no such session."""
        return _fields(self._command("LOCK.SESSION", "INFO", self._opened_id()))

    def __enter__(self):
        if self._id is None:
            self.open()
        return self

    def __exit__(self, exc_type, exc, tb):
        self.close()

    # --- internals ---

    def _node(self):
        return self.client.get_node_from_key(self._id if self._id is not None else self.key)

    def _command(self, *args):
        """A command about this session, through the client, to the session's node (in a
        cluster: the master of the id's slot now, looked up again after a failover)."""
        if self._cluster:
            return self._following(lambda: self.client.execute_command(*args, **self._route()),
                                   self._follow_deadline(self._last_ok))
        return self.client.execute_command(*args, **self._route())

    def _following(self, call, deadline):
        """``call()``, again on the slot's master after a failover (``MOVED``, ``READONLY``,
        a lost connection: ``_wire.moved_away``) until ``deadline``; then the last error."""
        while True:
            try:
                return call()
            except Exception as e:
                keeper = threading.current_thread() is self._thread  # close() stops it
                if not _wire.moved_away(e) or time.monotonic() >= deadline or (keeper and self._stopping.is_set()):
                    raise
            _wire.refresh_slots(self.client)
            time.sleep(_wire.FOLLOW_BACKOFF)

    def _connect(self):
        """The dedicated connection of a bound session, made like the client's own."""
        client = self.client.get_redis_connection(self._node()) if self._cluster else self.client
        pool = client.connection_pool
        conn = pool.connection_class(**_dedicated_kwargs(pool.connection_kwargs))
        conn.connect()
        return conn

    def _stop(self):
        self._stopping.set()
        if self._wake is not None:
            self._wake[1].send(b"x")
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join()
        if self._wake is not None:
            for s in self._wake:
                s.close()
            self._wake = None

    def _keep(self):
        reason = self._keep_bound() if self.bound else self._keep_unbound()
        if reason is None or self._stopping.is_set():
            return
        holds = self._lose(reason)
        if holds is None:
            return
        if self._conn is not None:
            self._conn.disconnect()  # the server ends a bound session it still had
        try:
            if self.on_lost is not None:
                self.on_lost(self)
        finally:  # each hold hears of it even if the session's callback raised
            for lock in holds:
                lock._report_lost(f"session lost: {reason}")

    def _keepalive(self):
        """One keepalive within the period: the remaining ms, or None if the session is gone."""
        client = self.client
        if self._cluster:  # the pool of the id's node: the cluster client's reads may have no limit
            client = client.get_redis_connection(client.get_node_from_key(self._id))
        return _wire.call_timed(client, self._keepalive_args(), self._period())

    def _keep_unbound(self):
        """Keep the session alive until stopped; the reason it was lost, or None if stopped.

        In a cluster a keepalive that meets a failover (``_wire.moved_away``) is sent again to
        the slot's master, looked up afresh, until the session's ttl from the last keepalive
        that succeeded: only the server's nil, or that ttl passing, loses it."""
        while not self._stopping.wait(self._period()):
            sent_at = time.monotonic()
            try:
                if self._cluster:
                    remaining = self._following(self._keepalive, self._follow_deadline(self._last_ok))
                else:
                    remaining = self._keepalive()
            except Exception as e:
                return None if self._stopping.is_set() else f"keepalive failed: {e!r}"
            if remaining is None:
                return "ended"
            self._last_ok = sent_at
        return None

    def _reattach(self, error):
        """A bound session's connection met a failover (cluster only): bind the session to a
        new connection to the master of its id's slot (``LOCK.SESSION ATTACH``: a promoted
        replica has the session unbound). None when attached (``self._conn`` replaced), else
        the reason the session is lost: ``"ended"`` when the server has no such session (also
        when the old master is alive and ended it as its bound connection closed)."""
        deadline = self._attach_deadline()
        self._conn.disconnect()
        while not self._stopping.is_set():
            _wire.refresh_slots(self.client)
            try:
                conn = self._connect()
            except Exception as e:  # noqa: BLE001 - the slot's master unreachable for now
                error = e
            else:
                try:
                    conn.send_command("LOCK.SESSION", "ATTACH", self._id)
                    reply = _wire._read(conn, self._period())
                except Exception as e:  # noqa: BLE001
                    conn.disconnect()
                    if not self._attach_again(e):
                        return f"attach failed: {e!r}"
                    error = e
                else:
                    if reply is None:
                        conn.disconnect()
                        return "ended"
                    self._conn = conn
                    try:
                        self._name_connection()
                    except Exception:  # noqa: BLE001 - best effort; the next keepalive finds a dead connection
                        pass
                    return None
            if time.monotonic() >= deadline:
                return f"connection lost: {error!r}"
            self._stopping.wait(_wire.FOLLOW_BACKOFF)
        return None

    def _keep_bound(self):
        """The same on the dedicated connection, watching it between keepalives. In a cluster
        a failover (``MOVED``, the connection lost) re-attaches the session on the slot's master
        (``_reattach``) rather than counting it lost."""
        while True:
            reason = self._keep_bound_on(self._conn)
            if reason is None or self._stopping.is_set():
                return None
            reason, error = reason if isinstance(reason, tuple) else (reason, None)
            if not self._reattaches(error):
                return reason
            reason = self._reattach(error)
            if reason is not None:
                return reason

    def _keep_bound_on(self, conn):
        """Keepalives on ``conn`` until stopped (None) or a loss: a reason, or ``(reason,
        error)`` when an error the cluster may explain (``_wire.moved_away``) ended it."""
        pair = self._wake
        if pair is None or self._stopping.is_set():
            # Stopped meanwhile (``_stop`` from this very thread, e.g. a loss callback that
            # closed the session, does not join it): nothing more to keep.
            return None
        wake = pair[0]
        while True:
            due = time.monotonic() + self._period()
            while (left := due - time.monotonic()) > 0:
                sock = _wire._socket(conn)
                if sock is None:
                    return ("connection lost: closed", ConnectionError("closed"))
                readable, _, _ = select.select([sock, wake], [], [], left)
                if self._stopping.is_set():
                    return None
                if sock in readable:
                    try:
                        if conn.can_read(timeout=0):
                            return "connection lost: an unexpected reply on the idle connection"
                    except (ConnectionError, OSError) as e:
                        return (f"connection lost: {e}", e)
                    # Readable without a reply (e.g. a TLS record): keep waiting.
            sent_at = time.monotonic()
            try:
                conn.send_command(*self._keepalive_args())
                remaining = _wire._read(conn, self._period())
            except ResponseError as e:
                return (f"keepalive failed: {e!r}", e)
            except (ConnectionError, OSError) as e:
                return (f"connection lost: {e}", e)
            except TimeoutError as e:
                return (f"keepalive failed: {e!r}", e)
            if remaining is None:
                return "ended"
            self._last_ok = sent_at


class AsyncSession(_SessionBase):
    """``Session`` for ``redis.asyncio.Redis`` (or its ``RedisCluster``): the same arguments,
    awaitable ``open()``, ``close()`` and ``info()``, ``async with``, and a keepalive task.
    ``on_lost`` may be a plain function or a coroutine function; it runs in that task."""

    def __init__(self, client, ttl, **kwargs):
        super().__init__(client, ttl, **kwargs)
        self._conn = None
        self._task = None
        self._last_ok = None  # time.monotonic() when the last successful keepalive was sent

    async def _name_connection(self):
        """As ``Session._name_connection``: the bound connection named after the serial."""
        await self._conn.send_command("LOCK.SESSION", "INFO", self._id)
        info = _fields(await self._conn.read_response())
        self.serial = info.get("serial") if info else None
        if self.serial is None:
            return
        await self._conn.send_command("CLIENT", "SETNAME", f"redislock-session-{self.serial}")
        try:
            await self._conn.read_response()
        except ResponseError:
            pass

    async def open(self):
        """Open the session and start its keepalive task; returns self."""
        self._check_not_open()
        if self.bound:
            self._conn = await self._connect()
            try:
                await self._conn.send_command(*self._open_args())
                self._opened(await self._conn.read_response())
                await self._name_connection()
            except BaseException:
                await self._conn.disconnect()
                self._conn = None
                raise
        elif self._cluster:
            await self.client.initialize()  # its slot table, for _node(); once per client
            self._opened(await self._following(
                lambda: self.client.execute_command(*self._open_args(), target_nodes=self._node()),
                time.monotonic() + self._ttl_ms / 1000))
        else:
            self._opened(await self.client.execute_command(*self._open_args()))
        self._last_ok = time.monotonic()
        self._task = asyncio.ensure_future(self._keep())
        return self

    async def close(self):
        """End the session; the number of holds released, or None. Same rules as ``Session.close``."""
        if self._id is None or self._closed:
            return None
        await self._stop()
        self._quiet()
        try:
            reply = await self._command("LOCK.SESSION", "CLOSE", self._id)
        finally:
            self._let_go()
            if self._conn is not None:
                await self._conn.disconnect()
        return reply

    async def info(self):
        """``LOCK.SESSION INFO`` as a dict, or None."""
        return _fields(await self._command("LOCK.SESSION", "INFO", self._opened_id()))

    async def __aenter__(self):
        if self._id is None:
            await self.open()
        return self

    async def __aexit__(self, exc_type, exc, tb):
        await self.close()

    # --- internals ---

    def _node(self):
        return self.client.get_node_from_key(self._id if self._id is not None else self.key)

    async def _command(self, *args):
        if self._cluster:
            return await self._following(lambda: self.client.execute_command(*args, **self._route()),
                                         self._follow_deadline(self._last_ok))
        return await self.client.execute_command(*args, **self._route())

    async def _following(self, call, deadline):
        """``Session._following`` for asyncio: ``await call()``, again on the slot's master
        after a failover, until ``deadline``."""
        while True:
            try:
                return await call()
            except (asyncio.CancelledError, KeyboardInterrupt, SystemExit):
                raise
            except Exception as e:
                if not _wire.moved_away(e) or time.monotonic() >= deadline:
                    raise
            await _wire.arefresh_slots(self.client)
            await asyncio.sleep(_wire.FOLLOW_BACKOFF)

    async def _connect(self):
        if self._cluster:
            await self.client.initialize()
            node = self._node()
            conn = node.connection_class(**_dedicated_kwargs(node.connection_kwargs))
        else:
            pool = self.client.connection_pool
            conn = pool.connection_class(**_dedicated_kwargs(pool.connection_kwargs))
        await conn.connect()
        return conn

    async def _stop(self):
        task, self._task = self._task, None
        if task is None or task is asyncio.current_task():
            return
        await _wire.astop(task)

    async def _keep(self):
        reason = await (self._keep_bound() if self.bound else self._keep_unbound())
        holds = self._lose(reason)
        if holds is None:
            return
        if self._conn is not None:
            await self._conn.disconnect()
        try:
            if self.on_lost is not None:
                result = self.on_lost(self)
                if inspect.isawaitable(result):
                    await result
        finally:
            for lock in holds:
                await lock._report_lost(f"session lost: {reason}")

    async def _keepalive(self):
        if self._cluster:  # each try within the period, tried again on the slot's master after a failover
            return await self._following(
                lambda: _wire.within(self.client.execute_command(*self._keepalive_args(), **self._route()), self._period()),
                self._follow_deadline(self._last_ok))
        return await _wire.acall_timed(self.client, self._keepalive_args(), self._period())

    async def _keep_unbound(self):
        """Keep the session alive until cancelled; the reason it was lost (in a cluster, only
        the server's nil or the ttl passing without an answer: ``Session._keep_unbound``)."""
        while True:
            await asyncio.sleep(self._period())
            sent_at = time.monotonic()
            try:
                remaining = await self._keepalive()
            except (asyncio.CancelledError, KeyboardInterrupt, SystemExit):
                raise
            except Exception as e:
                return f"keepalive failed: {e!r}"
            if remaining is None:
                return "ended"
            self._last_ok = sent_at

    async def _keep_bound(self):
        """``_keep_bound_on`` the dedicated connection; in a cluster a failover re-attaches the
        session on the slot's master (``Session._keep_bound``)."""
        while True:
            reason, error = await self._keep_bound_on(self._conn)
            if not self._reattaches(error):
                return reason
            reason = await self._reattach()
            if reason is not None:
                return reason

    async def _reattach(self):
        """``Session._reattach`` for asyncio."""
        deadline = self._attach_deadline()
        await self._conn.disconnect()
        while True:
            await _wire.arefresh_slots(self.client)
            conn = None
            try:
                conn = await self._connect()
                await conn.send_command("LOCK.SESSION", "ATTACH", self._id)
                reply = await _wire._aread(conn, self._period())
            except (asyncio.CancelledError, KeyboardInterrupt, SystemExit):
                raise
            except Exception as e:  # noqa: BLE001
                if conn is not None:
                    await conn.disconnect()
                if not self._attach_again(e):
                    return f"attach failed: {e!r}"
                if time.monotonic() >= deadline:
                    return f"connection lost: {e!r}"
                await asyncio.sleep(_wire.FOLLOW_BACKOFF)
                continue
            if reply is None:
                await conn.disconnect()
                return "ended"
            self._conn = conn
            try:
                await self._name_connection()
            except (asyncio.CancelledError, KeyboardInterrupt, SystemExit):
                raise
            except Exception:  # noqa: BLE001 - best effort, as Session._reattach
                pass
            return None

    async def _keep_bound_on(self, conn):
        """Keepalives on ``conn``, reading it between them: a read that times out means nothing
        arrived (redis-py answers None and leaves the connection as it was), a closed connection
        raises at once. ``(reason, error)``: ``error`` when one the cluster may explain ended it."""
        while True:
            try:
                unexpected = await conn.read_response(timeout=self._period(), disconnect_on_error=False)
            except (ConnectionError, OSError) as e:
                return f"connection lost: {e}", e
            if unexpected is not None:
                return "connection lost: an unexpected reply on the idle connection", None
            sent_at = time.monotonic()
            try:
                await conn.send_command(*self._keepalive_args())
                remaining = await _wire._aread(conn, self._period())
            except (asyncio.CancelledError, KeyboardInterrupt, SystemExit):
                raise
            except (ConnectionError, OSError) as e:
                return f"connection lost: {e}", e
            except Exception as e:
                return f"keepalive failed: {e!r}", e
            if remaining is None:
                return "ended", None
            self._last_ok = sent_at
