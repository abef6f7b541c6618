"""Python client for the redis-lock Redis module (LOCK.ACQUIRE, RELEASE, EXTEND, FENCE, INFO).

- :class:`Lock` / :class:`AsyncLock`: an exclusive lock with a fencing token, for
  ``redis.Redis`` and ``redis.asyncio.Redis``; a blocking acquire waits in the server's
  FIFO queue with one command; an opt-in watchdog renews the hold and reports its loss.
- :class:`RedisPyLock` / :class:`AsyncRedisPyLock`: drop-ins for redis-py's own Lock
  classes (``r.lock(name, timeout=10, lock_class=RedisPyLock)``).
- :class:`Semaphore` / :class:`ReadWriteLock` (and their ``Async`` twins): shared holders
  on the same queue (``LOCK.ACQUIRE ... SHARED [LIMIT n]``).
- :class:`Session` / :class:`AsyncSession`: one lease for many holds (``LOCK.SESSION``) with one
  keepalive; ``bound=True`` ends it the moment its holder's connection closes. Locks of every
  kind take ``session=``; without it they join the client's default bound session
  (:mod:`redislock_native.default_session`: a dead holder process frees its locks within
  milliseconds), and ``session=None`` holds by the ttl alone.
- :class:`Election` / :class:`AsyncElection`: leader election on one key (``campaign``,
  ``leader``, ``observe``, ``resign``); the term is the fencing token. ``watch(client, name)``
  (``awatch``) observes the holder of any lock the same way.
- Loss reported at once: a lock with ``on_lost`` watches its key through the change feed
  (``LOCK.WATCH``, :mod:`redislock_native.feed`) while held.
- :class:`Redlock` / :class:`AsyncRedlock`: one lock over several independent masters,
  granted by a majority.
- :func:`lock_info` / :func:`alock_info`: ``LOCK.INFO`` as one dict shape, whichever client class.
- :mod:`redislock_native.fence`: writes that happen only while a token is live.

The server needs the module loaded (``loadmodule /path/to/libredis_lock.so``).
"""

from .aio import AsyncLock
from .compat import AsyncRedisPyLock, RedisPyLock
from .default_session import DEFAULT_GRACE, DEFAULT_SESSION_TTL, aclose_default_sessions, close_default_sessions
from .election import AsyncElection, AsyncLeadership, Change, Election, Leader, Leadership, awatch, watch
from .fence import FENCE_CHECK_LUA, FENCED_CALL_LUA, StaleTokenError, afenced_call, fenced_call, fenced_script
from .info import alock_info, lock_info
from .lock import Lock, LockBusyError, LockLostError, NotDurableError
from .multi import AsyncMultiLock, MultiLock
from .redlock import AsyncRedlock, Redlock, RedlockError
from .session import AsyncSession, Session
from .shared import AsyncReadLock, AsyncReadWriteLock, AsyncSemaphore, ReadLock, ReadWriteLock, Semaphore

__all__ = [
    "lock_info",
    "alock_info",
    "Lock",
    "AsyncLock",
    "LockLostError",
    "LockBusyError",
    "NotDurableError",
    "MultiLock",
    "AsyncMultiLock",
    "Semaphore",
    "AsyncSemaphore",
    "ReadWriteLock",
    "AsyncReadWriteLock",
    "ReadLock",
    "AsyncReadLock",
    "Session",
    "AsyncSession",
    "DEFAULT_SESSION_TTL",
    "DEFAULT_GRACE",
    "close_default_sessions",
    "aclose_default_sessions",
    "Election",
    "AsyncElection",
    "Leadership",
    "AsyncLeadership",
    "Leader",
    "Change",
    "watch",
    "awatch",
    "Redlock",
    "AsyncRedlock",
    "RedlockError",
    "RedisPyLock",
    "AsyncRedisPyLock",
    "StaleTokenError",
    "FENCE_CHECK_LUA",
    "FENCED_CALL_LUA",
    "fenced_call",
    "afenced_call",
    "fenced_script",
]

__version__ = "0.1.0"
