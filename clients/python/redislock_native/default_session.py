"""The client's default session: what a lock made without ``session=`` joins.

Every ``Lock``, ``Semaphore``, ``ReadWriteLock`` side, ``MultiLock`` and ``Election`` (and each
``Async`` twin) made without ``session=`` holds in its client's *default session*: one
``BOUND`` session per client object and server (per node of the keys for a ``RedisCluster``,
opened there with ``key=``), opened by the first acquire that needs it, kept alive by one
keepalive thread (an asyncio task for ``redis.asyncio``) for all its holds. So a process that
dies (exits, crashes, ``kill -9``) frees everything it held the moment the server sees its
connection close, instead of when each hold's ttl runs out.

Nothing else changes for the lock: it sends its own ttl as well as ``SESSION id``
(``LOCK.ACQUIRE key owner ttl-ms SESSION id``), so the hold keeps its own deadline and
``watchdog=True``, ``extend()`` and ``durable`` work as without a session. ``session=None``
keeps the TTL-only behaviour exactly; ``lock_delay=`` also means no default session (a
session's lock-delay is the session's, one for all its holds, and a hold in a session cannot
have its own: such a lock holds by its ttl alone, as before).

The session:

- ttl ``DEFAULT_SESSION_TTL`` (10 s), a keepalive every third (3.3 s): the bound for a holder
  whose *host* vanished without closing its connection (the server learns of that only from
  TCP). A process that dies on a live host closes its connection at once.
- ``GRACE`` ``DEFAULT_GRACE`` (0.5 s): opened as ``LOCK.SESSION OPEN ttl-ms BOUND GRACE ms``.
  When its connection drops while the process lives (``CLIENT KILL``, a proxy or the network
  closing it), the server keeps the session that long, and the keepalive, which waits on that
  connection, sees the close at once and binds the session to a new connection
  (``LOCK.SESSION ATTACH``): every hold is kept. A server that answers ``GRACE`` with a syntax
  error (a module without it) gets the ``OPEN`` without it, remembered per client and node:
  there a blip ends the session, and each hold reports the loss as with an explicit session
  (``lost_reason`` ``"session lost: ..."``, ``on_lost(lock)``); the next acquire opens a new one.
- Closed (``LOCK.SESSION CLOSE``: every hold released at once, no lock-delay) when the client
  is closed (``client.close()``, ``await client.aclose()``, ``with``/``async with``: this
  module wraps the client object's own close method), when the client object is garbage
  collected, or when the interpreter exits normally (a ``weakref.finalize``; each step waits
  at most ``_EXIT_WAIT`` s, so exit is never held up). For ``redis.asyncio`` clients only an
  explicit close sends ``CLOSE``; at exit the operating system closes the connection and the
  server ends the session after the grace.
- A child process (``fork``) never uses its parent's default session: the first acquire in
  the child opens its own (as redis-py's pools do for connections).
- It is seen like any bound session: ``LOCK.SESSION LIST`` (one entry per client and node),
  ``INFO lock`` (``lock_sessions``), and ``CLIENT LIST`` shows its connection as
  ``name=redislock-session-<serial>``.
"""

import asyncio
import os
import threading
import time
import weakref

from redis.exceptions import ResponseError

from . import _wire
from .session import AsyncSession, Session

#: The default session's ttl in seconds; the keepalive runs every third.
DEFAULT_SESSION_TTL = 10.0

#: Seconds the server keeps the default session after its bound connection drops (``BOUND
#: GRACE ms``), for the keepalive to re-``ATTACH`` it; also how much longer than the close of
#: a killed holder's connection its holds stay taken.
DEFAULT_GRACE = 0.5

#: At most this many seconds per step when a default session is closed at exit or by the
#: garbage collector (stopping the keepalive, then the ``CLOSE`` reply).
_EXIT_WAIT = 0.5


class _Default:
    """The ``session=`` default: join the client's default session."""

    __slots__ = ()

    def __repr__(self):
        return "DEFAULT"


#: ``session=DEFAULT`` (what not giving ``session=`` means): the client's default session.
DEFAULT = _Default()


#: How many times an acquire in the default session is made when the session ended under it.
ATTEMPTS = 3


def session_gone(error):
    """Whether an acquire's error says its session ended (before it, or while it waited)."""
    text = str(error)
    return "no such session" in text or "session ended while the client waited" in text


def _refuses_grace(error):
    """The server's answer to ``GRACE`` from a module that does not know it."""
    text = str(error)
    return isinstance(error, ResponseError) and "syntax" in text and "GRACE" in text


class _DefaultMixin:
    """What the sync and asyncio default sessions add to a bound session: ``GRACE`` on open,
    a re-``ATTACH`` after a blip, and a weak reference to the client (so the client can be
    garbage collected, and the default session closed with it)."""

    def _setup(self, sessions, node):
        self._sessions = sessions
        self._node_key = node
        grace = round(DEFAULT_GRACE * 1000)
        # None: no grace (the module has none, or DEFAULT_GRACE is 0): a blip ends the session.
        self._grace_ms = None if node in sessions.no_grace or grace <= 0 else grace

    def _open_args(self):
        args = super()._open_args()
        return args + ("GRACE", self._grace_ms) if self._grace_ms else args

    def _without_grace(self, error):
        """After a failed OPEN: True (and remembered) if it failed only for ``GRACE``."""
        if not self._grace_ms or not _refuses_grace(error):
            return False
        self._sessions.no_grace.add(self._node_key)
        self._grace_ms = None
        return True

    def _reattaches(self, error):
        if error is None or not _wire.moved_away(error):
            return False
        return self._grace_ms is not None or self._cluster

    def _attach_deadline(self):
        """After a blip on one server: the grace, counted from now (the drop was seen at
        once), so the session is reported lost no later than the server may have ended it. A
        cluster's failover keeps the session's ttl (a promoted replica keeps it unbound)."""
        if self._cluster or self._grace_ms is None:
            return super()._attach_deadline()
        return time.monotonic() + self._grace_ms / 1000

    def _usable(self):
        return self._id is not None and not self._closed and self._lost_reason is None


class DefaultSession(_DefaultMixin, Session):
    """The default session of a ``redis.Redis`` (or ``RedisCluster``) client on one node."""

    _thread_name = "redislock-default-session"

    def __init__(self, client, sessions, node, key):
        super().__init__(weakref.proxy(client), DEFAULT_SESSION_TTL, bound=True, key=key)
        self._setup(sessions, node)

    def open(self):
        try:
            return super().open()
        except ResponseError as e:
            if not self._without_grace(e):
                raise
        return super().open()

    def _keep(self):
        try:
            super()._keep()
        except ReferenceError:  # the client was collected; its finalizer stops this thread
            pass

    def _usable(self):
        return super()._usable() and self._thread is not None and self._thread.is_alive()

    def end(self, wait=None):
        """``LOCK.SESSION CLOSE`` on the bound connection, each step within ``wait`` seconds
        (None: the keepalive period); never raises. Without an answer the connection is
        closed all the same, and the server ends the session after its grace."""
        if self._id is None or self._closed:
            return
        wait = self._period() if wait is None else wait
        self._stopping.set()
        if self._wake is not None:
            try:
                self._wake[1].send(b"x")
            except OSError:
                pass
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(wait)
            if thread.is_alive():  # a keepalive still in flight: leave it the connection
                self._let_go()
                return
        self._quiet()
        conn = self._conn
        try:
            if conn is not None and _wire._socket(conn) is not None:  # never connect again here
                conn.send_command("LOCK.SESSION", "CLOSE", self._id)
                _wire._read(conn, wait)
        except Exception:  # noqa: BLE001 - the connection's close ends it too
            pass
        finally:
            self._let_go()
            if conn is not None:
                conn.disconnect()
            if self._wake is not None:
                for s in self._wake:
                    s.close()
                self._wake = None


class AsyncDefaultSession(_DefaultMixin, AsyncSession):
    """The default session of a ``redis.asyncio`` client on one node, in one event loop."""

    def __init__(self, client, sessions, node, key):
        super().__init__(weakref.proxy(client), DEFAULT_SESSION_TTL, bound=True, key=key)
        self._setup(sessions, node)
        self._loop = asyncio.get_running_loop()

    async def open(self):
        try:
            return await super().open()
        except ResponseError as e:
            if not self._without_grace(e):
                raise
        return await super().open()

    def _usable(self):
        return (super()._usable() and self._task is not None and not self._task.done()
                and self._loop is asyncio.get_running_loop())

    async def end(self):
        """``LOCK.SESSION CLOSE`` on the bound connection; never raises (as ``DefaultSession.end``)."""
        if self._id is None or self._closed:
            return
        try:
            await self._stop()
        except Exception:  # noqa: BLE001 - the keepalive's own error: closing regardless
            pass
        self._quiet()
        conn = self._conn
        try:
            if conn is not None:
                await conn.send_command("LOCK.SESSION", "CLOSE", self._id)
                await _wire._aread(conn, self._period())
        except (asyncio.CancelledError, KeyboardInterrupt, SystemExit):
            raise
        except Exception:  # noqa: BLE001
            pass
        finally:
            self._let_go()
            if conn is not None:
                await conn.disconnect()


def _node_of(client, key):
    """The registry key of ``key``'s node: its name in a cluster, None for one server."""
    if not _wire.is_cluster(client):
        return None
    return client.get_node_from_key(key).name


class _Sessions:
    """The default sessions of one client object, by node; made in one process (``pid``)."""

    def __init__(self):
        self.pid = os.getpid()
        self.no_grace = set()  # nodes that answered GRACE with a syntax error
        self.by_node = {}
        self.mutex = threading.Lock()
        self.opening = {}  # asyncio: node -> the task opening its session
        self.retired = []  # sessions an acquire found gone before their keepalive did

    def get(self, client, key):
        node = _node_of(client, key)
        with self.mutex:
            session = self.by_node.get(node)
            if session is None or not session._usable():
                session = DefaultSession(client, self, node, key)
                session.open()
                self.by_node[node] = session
            return session

    async def aget(self, client, key):
        if _wire.is_cluster(client):
            await client.initialize()  # its slot table, for the node; once per client
        node = _node_of(client, key)
        while True:
            session = self.by_node.get(node)
            if session is not None and session._usable():
                return session
            opening = self.opening.get(node)
            if opening is None or opening.get_loop() is not asyncio.get_running_loop():
                opening = self.opening[node] = asyncio.ensure_future(self._aopen(client, node, key))
            await asyncio.shield(opening)

    async def _aopen(self, client, node, key):
        try:
            session = AsyncDefaultSession(client, self, node, key)
            await session.open()
            self.by_node[node] = session
        finally:
            self.opening.pop(node, None)

    def retire(self, session):
        """An acquire was told ``session`` is gone: the next one opens a new session. The old
        one is kept to be closed with the client (in a cluster it may be alive elsewhere)."""
        with self.mutex:
            for node, s in list(self.by_node.items()):
                if s is session:
                    del self.by_node[node]
                    self.retired.append(session)

    def _take(self):
        with self.mutex:
            sessions, self.by_node = list(self.by_node.values()) + self.retired, {}
            self.retired = []
        return sessions

    def close(self, wait=None):
        """Close every sync default session (the client is being closed)."""
        if self.pid != os.getpid():
            return  # a forked child's copy: the sessions are the parent's
        for session in self._take():
            if isinstance(session, DefaultSession):
                session.end(wait)

    async def aclose(self):
        for session in self._take():
            if isinstance(session, AsyncDefaultSession):
                await session.end()

    def at_exit(self):
        """The client was collected, or the interpreter exits: close what can be closed
        without waiting long (sync sessions; an asyncio session's connection is closed by
        the operating system, and the server ends it after the grace)."""
        self.close(_EXIT_WAIT)


_ALL = weakref.WeakKeyDictionary()  # client object -> _Sessions
_ALL_MUTEX = threading.Lock()


def _sessions_of(client):
    with _ALL_MUTEX:
        sessions = _ALL.get(client)
        if sessions is None or sessions.pid != os.getpid():
            sessions = _ALL[client] = _Sessions()
            weakref.finalize(client, sessions.at_exit)
            _wrap_close(client)
        return sessions


def _wrap_close(client):
    """Make the client object's own close (``close``, or ``aclose`` for asyncio) close its
    default sessions first. Only this object's: its class is untouched."""
    ref = weakref.ref(client)
    cls = type(client)
    if asyncio.iscoroutinefunction(getattr(cls, "aclose", None)):
        if "aclose" in vars(client):
            return
        original = cls.aclose

        async def aclose(*args, **kwargs):
            c = ref()
            if c is None:
                return None
            await aclose_default_sessions(c)
            return await original(c, *args, **kwargs)

        client.aclose = aclose
    elif hasattr(cls, "close") and not asyncio.iscoroutinefunction(cls.close):
        if "close" in vars(client):
            return
        original = cls.close

        def close(*args, **kwargs):
            c = ref()
            if c is None:
                return None
            close_default_sessions(c)
            return original(c, *args, **kwargs)

        client.close = close


def retire(client, session):
    """``_Sessions.retire`` for ``client``'s default sessions."""
    sessions = _ALL.get(client)
    if sessions is not None:
        sessions.retire(session)


def session_for(client, key):
    """The default session of a sync ``client`` for ``key``'s node, opened if needed."""
    return _sessions_of(client).get(client, key)


async def asession_for(client, key):
    """``session_for`` for a ``redis.asyncio`` client."""
    return await _sessions_of(client).aget(client, key)


def close_default_sessions(client):
    """Close the default sessions of a sync ``client`` now (``client.close()`` does it too);
    the next lock acquired through it opens a new one."""
    sessions = _ALL.get(client)
    if sessions is not None:
        sessions.close()


async def aclose_default_sessions(client):
    """``close_default_sessions`` for a ``redis.asyncio`` client (``await client.aclose()``
    does it too)."""
    sessions = _ALL.get(client)
    if sessions is not None:
        await sessions.aclose()
