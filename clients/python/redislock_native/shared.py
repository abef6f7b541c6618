"""Shared holders: a counting semaphore and a read/write lock on the same server-side queue.

They are ``LOCK.ACQUIRE key owner ttl-ms SHARED [LIMIT n] [BLOCK ms]`` (see the command
reference, "Shared locks and semaphores"), so everything ``Lock`` does holds for them:
one command per wait, FIFO order, a fencing token per holder, the watchdog, cancellation.
Exclusive and shared waiters share one queue: a writer queued behind readers is never
overtaken by readers that come after it.

- ``Semaphore(client, name, limit, ttl)``: at most ``limit`` holders at once. Everyone
  using the key must give the same ``limit`` while it is held; a different one gets the
  server's ``ERR this lock is held SHARED with LIMIT n ...`` as a ``ResponseError``.
- ``ReadWriteLock(client, name, ttl)``: ``.read`` (shared, any number of readers) and
  ``.write`` (exclusive) are two holders with owners of their own. There is no upgrade
  or downgrade: an owner holding one mode is refused the other, and a process that holds
  ``.read`` and waits for ``.write`` of the same key waits for itself.

One object is one holder: each thread or task that holds at the same time needs its own.
"""

from . import _wire
from .aio import AsyncLock
from .lock import Lock


def _limit(limit):
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
        raise ValueError(f"limit must be an integer >= 1, got {limit!r}")
    return limit


class Semaphore(Lock):
    """A counting semaphore: ``Lock`` with ``SHARED LIMIT limit``; ``token`` is this holder's."""

    def __init__(self, client, name, limit, ttl, **kwargs):
        super().__init__(client, name, ttl, **kwargs)
        self.limit = _limit(limit)
        self._mode_args = ("SHARED", "LIMIT", self.limit)


class AsyncSemaphore(AsyncLock):
    """``Semaphore`` for ``redis.asyncio``."""

    def __init__(self, client, name, limit, ttl, **kwargs):
        super().__init__(client, name, ttl, **kwargs)
        self.limit = _limit(limit)
        self._mode_args = ("SHARED", "LIMIT", self.limit)


class ReadLock(Lock):
    """The read side of a ``ReadWriteLock``: ``Lock`` with ``SHARED`` and no limit."""

    _mode_args = ("SHARED",)


class AsyncReadLock(AsyncLock):
    """``ReadLock`` for ``redis.asyncio``."""

    _mode_args = ("SHARED",)


def _sides(name, kwargs):
    owner = kwargs.pop("owner", None)
    if owner is None:
        return dict(kwargs, owner=_wire.new_owner()), dict(kwargs, owner=_wire.new_owner())
    return dict(kwargs, owner=f"{owner}:read"), dict(kwargs, owner=f"{owner}:write")


class ReadWriteLock:
    """``.read`` (a ``ReadLock``) and ``.write`` (a ``Lock``) on one key.

    Keyword arguments go to both sides; a given ``owner`` becomes ``owner:read`` and
    ``owner:write``.
    """

    def __init__(self, client, name, ttl, **kwargs):
        read, write = _sides(name, kwargs)
        self.name = name
        self.read = ReadLock(client, name, ttl, **read)
        self.write = Lock(client, name, ttl, **write)


class AsyncReadWriteLock:
    """``ReadWriteLock`` for ``redis.asyncio``."""

    def __init__(self, client, name, ttl, **kwargs):
        read, write = _sides(name, kwargs)
        self.name = name
        self.read = AsyncReadLock(client, name, ttl, **read)
        self.write = AsyncLock(client, name, ttl, **write)
