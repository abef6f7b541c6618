"""Drop-ins for redis-py's ``redis.lock.Lock`` and ``redis.asyncio.lock.Lock``.

``r.lock("invoice:42", timeout=10, lock_class=RedisPyLock)`` (or
``redis.asyncio`` with ``AsyncRedisPyLock``) gives an object with redis-py's
constructor, methods and exceptions, backed by the module's commands: a blocking
``acquire`` waits in the server's FIFO queue with one command instead of polling
every ``sleep`` seconds, and the hold has a fencing token (``fencing_token``).

Where it differs from redis-py's Lock:

- The key holds a ``redislock`` value, not a string: ``GET``/``SET`` on it answer
  ``WRONGTYPE``. Locks taken with redis-py's own class on the same key do not
  exclude this one's, and the reverse: switch every user of a key at once.
- ``timeout=None`` (no expiry) is not a thing the server offers. Such a lock is held
  for ``NO_TIMEOUT_TTL`` (60 s) and renewed every third of that by a watchdog (a
  daemon thread, or an asyncio task) until it is released: held as long as the
  process lives, and freed within 60 s after it dies, where redis-py's would stay
  locked forever. ``extend`` and ``reacquire`` refuse it, as in redis-py.
- ``sleep`` is used only while the key holds something other than a lock (a string, a
  hash...): that key counts as held, as in redis-py, and a blocking ``acquire`` tries again
  every ``sleep`` seconds until ``blocking_timeout``, where it would otherwise wait in the
  server's queue (which only a lock key has).
- ``extend(t)`` without ``replace_ttl`` adds ``t`` to the remaining time in one
  script (``PTTL`` + ``LOCK.EXTEND``).
- A key overwritten by another command (``SET``, ``DEL`` + anything) is a lock no longer
  owned, as in redis-py: ``release``/``extend``/``reacquire`` raise ``LockNotOwnedError``,
  not the server's ``WRONGTYPE``.
- ``owned()`` compares fencing tokens (``LOCK.FENCE key token``), not the owner string.
- The ``do_acquire`` / ``do_release`` / ``do_extend`` / ``do_reacquire`` hooks and the
  ``lua_*`` scripts of redis-py's class do not exist.
"""

import asyncio
import logging
import threading
import time
import uuid
from types import SimpleNamespace

from redis.exceptions import LockError, LockNotOwnedError, ResponseError

from . import _wire
from .aio import AsyncLock
from .lock import Lock

logger = logging.getLogger(__name__)

NO_TIMEOUT_TTL = 60.0

# KEYS[1] the lock, ARGV[1] the owner, ARGV[2] milliseconds to add to the remaining time.
_EXTEND_ADD_LUA = """\
local left = redis.call('PTTL', KEYS[1])
if left < 0 then
    return 0
end
return redis.call('LOCK.EXTEND', KEYS[1], ARGV[1], left + tonumber(ARGV[2]))
"""


class _Common:
    def __init__(
        self,
        redis,
        name,
        timeout=None,
        sleep=0.1,
        blocking=True,
        blocking_timeout=None,
        thread_local=True,
        raise_on_release_error=True,
    ):
        self.redis = redis
        self.name = name
        self.timeout = timeout
        self.sleep = sleep
        self.blocking = blocking
        self.blocking_timeout = blocking_timeout
        self.thread_local = bool(thread_local)
        self.raise_on_release_error = raise_on_release_error
        self.local = threading.local() if self.thread_local else SimpleNamespace()
        self.local.token = None
        self.local.held = None

    @property
    def fencing_token(self):
        """The fencing token of this thread's hold (an int), or None."""
        held = getattr(self.local, "held", None)
        return held.token if held is not None and getattr(self.local, "token", None) else None

    def _encode(self, token):
        if token is None:
            return uuid.uuid1().hex.encode()
        try:
            encoder = self.redis.get_encoder()
        except AttributeError:
            encoder = self.redis.connection_pool.get_encoder()
        return encoder.encode(token)

    def _acquire_options(self, token, blocking, blocking_timeout):
        """An acquire's owner (``token`` encoded, or a new UUID), and its ``blocking`` and
        ``blocking_timeout``, the lock's own where not given."""
        owner = self._encode(token)
        if blocking is None:
            blocking = self.blocking
        if blocking_timeout is None:
            blocking_timeout = self.blocking_timeout
        return owner, blocking, blocking_timeout

    def _options_with_sleep(self, sleep, blocking, blocking_timeout):
        """``sleep`` (the lock's own if not given) and the monotonic time to stop trying at
        (None: no limit), as redis-py's acquire computes them."""
        sleep = self.sleep if sleep is None else sleep
        stop_at = None if blocking_timeout is None else time.monotonic() + blocking_timeout
        return sleep, stop_at

    @staticmethod
    def _left(stop_at):
        return None if stop_at is None else max(0.0, stop_at - time.monotonic())

    @staticmethod
    def _held_by_another_type(error):
        """True for ``WRONGTYPE``: the key holds another type (a string, a hash...), which
        redis-py's Lock counts as held by someone. Any other error is raised."""
        if str(error).startswith("WRONGTYPE"):
            return True
        raise error

    @staticmethod
    def _pause_on_foreign_key(error, blocking, stop_at, sleep):
        """After an acquire found the key holding another type: seconds to sleep before trying
        again, or None to give up (acquire answers False) as redis-py does: not blocking, or
        the next try would come after ``blocking_timeout``. Any other error is raised."""
        _Common._held_by_another_type(error)
        if not blocking:
            return None
        if stop_at is not None and time.monotonic() + sleep > stop_at:
            return None
        return sleep

    def _run(self, *args):
        """``args`` through the user's client, to the node of the key in a cluster."""
        return self.redis.execute_command(*args, **_wire.route(self.redis, self.name))

    def _native(self, cls, owner):
        if self.timeout:
            return cls(self.redis, self.name, self.timeout, owner=owner)
        return cls(self.redis, self.name, NO_TIMEOUT_TTL, owner=owner, watchdog=True, on_lost=_warn_lost)

    def _held(self, what):
        if getattr(self.local, "token", None) is None:
            if what == "release":
                message = "Cannot release a lock that's not owned or is already unlocked."
            else:
                message = f"Cannot {what} an unlocked lock"
            raise _wire.lock_error(LockError, message, self.name)
        if what != "release" and self.timeout is None:
            raise _wire.lock_error(LockError, f"Cannot {what} a lock with no timeout", self.name)
        return self.local.held

    def _lost_if_wrongtype(self, what, error):
        """A ``WRONGTYPE`` reply means the key no longer holds a lock at all: to a caller of
        redis-py's API that is a lock no longer owned."""
        if str(error).startswith("WRONGTYPE"):
            return self._not_owned(what)
        return error

    def _owned_call(self, what, call):
        """``call()``, with a ``WRONGTYPE`` reply raised as ``LockNotOwnedError``."""
        try:
            return call()
        except ResponseError as e:
            raise self._lost_if_wrongtype(what, e) from e

    async def _aowned_call(self, what, call):
        """``await call()``, with a ``WRONGTYPE`` reply raised as ``LockNotOwnedError``."""
        try:
            return await call()
        except ResponseError as e:
            raise self._lost_if_wrongtype(what, e) from e

    def _extend_command(self, held, additional_time, replace_ttl):
        """The call that extends ``held``: ``LOCK.EXTEND`` to the new time, or the script that
        adds it to what is left."""
        ms = int(additional_time * 1000)
        if replace_ttl:
            return lambda: held._run("LOCK.EXTEND", self.name, held.owner, ms)
        return lambda: held._run("EVAL", _EXTEND_ADD_LUA, 1, self.name, held.owner, ms)

    def _not_owned(self, what):
        return _wire.lock_error(LockNotOwnedError, f"Cannot {what} a lock that's no longer owned", self.name)

    def _cannot_acquire(self):
        return _wire.lock_error(LockError, "Unable to acquire lock within the time specified", self.name)

    def _release_failed(self, error):
        if self.raise_on_release_error:
            raise error
        logger.warning("Lock was unlocked or no longer owned when exiting context manager.")


def _warn_lost(lock):
    logger.warning("lock %r (no timeout) lost: %s", lock.name, lock.lost_reason)


class RedisPyLock(_Common):
    """Drop-in for ``redis.lock.Lock`` on the redis-lock module (see the module docstring
    for where it differs): ``r.lock(name, timeout=10, lock_class=RedisPyLock)``."""

    def __enter__(self):
        if self.acquire():
            return self
        raise self._cannot_acquire()

    def __exit__(self, exc_type, exc_value, traceback):
        try:
            self.release()
        except LockError as e:
            self._release_failed(e)

    def acquire(self, sleep=None, blocking=None, blocking_timeout=None, token=None):
        """Take the lock; True if granted. ``blocking_timeout``: seconds to wait in the
        server's queue (None: no limit). ``token``: the owner string (default: a UUID). A key
        that holds something other than a lock counts as held (False, or tried again every
        ``sleep`` seconds while blocking), as in redis-py."""
        owner, blocking, blocking_timeout = self._acquire_options(token, blocking, blocking_timeout)
        sleep, stop_at = self._options_with_sleep(sleep, blocking, blocking_timeout)
        while True:
            held = self._native(Lock, owner)
            try:
                if not held.acquire(blocking=blocking, timeout=self._left(stop_at)):
                    return False
                break
            except ResponseError as e:
                pause = self._pause_on_foreign_key(e, blocking, stop_at, sleep)
                if pause is None:
                    return False
                time.sleep(pause)
        previous = getattr(self.local, "held", None)
        if previous is not None:
            previous._stop_watchdog()
        self.local.token, self.local.held = owner, held
        return True

    def locked(self):
        """True if anyone holds the lock (or the key holds something else, as in redis-py)."""
        try:
            return self._run("LOCK.FENCE", self.name) is not None
        except ResponseError as e:
            return self._held_by_another_type(e)

    def owned(self):
        """True if this thread's hold is the live one."""
        token = self.fencing_token
        return token is not None and self._run("LOCK.FENCE", self.name, token) == 1

    def release(self):
        """Release; LockError if not acquired here, LockNotOwnedError if it was lost."""
        held = self._held("release")
        self.local.token = self.local.held = None
        if not self._owned_call("release", held.release):
            raise self._not_owned("release")

    def extend(self, additional_time, replace_ttl=False):
        """Add ``additional_time`` seconds to the remaining time (or replace it)."""
        held = self._held("extend")
        if self._owned_call("extend", self._extend_command(held, additional_time, replace_ttl)) != 1:
            raise self._not_owned("extend")
        return True

    def reacquire(self):
        """Reset the remaining time to ``timeout``."""
        held = self._held("reacquire")
        if not self._owned_call("reacquire", held.extend):
            raise self._not_owned("reacquire")
        return True


class AsyncRedisPyLock(_Common):
    """Drop-in for ``redis.asyncio.lock.Lock``:
    ``r.lock(name, timeout=10, lock_class=AsyncRedisPyLock)`` on a ``redis.asyncio`` client."""

    async def __aenter__(self):
        if await self.acquire():
            return self
        raise self._cannot_acquire()

    async def __aexit__(self, exc_type, exc_value, traceback):
        try:
            await self.release()
        except LockError as e:
            self._release_failed(e)

    async def acquire(self, blocking=None, blocking_timeout=None, token=None):
        """Take the lock; True if granted (as ``RedisPyLock.acquire``; redis-py's asyncio
        Lock has no ``sleep`` argument here)."""
        owner, blocking, blocking_timeout = self._acquire_options(token, blocking, blocking_timeout)
        sleep, stop_at = self._options_with_sleep(None, blocking, blocking_timeout)
        while True:
            held = self._native(AsyncLock, owner)
            try:
                if not await held.acquire(blocking=blocking, timeout=self._left(stop_at)):
                    return False
                break
            except ResponseError as e:
                pause = self._pause_on_foreign_key(e, blocking, stop_at, sleep)
                if pause is None:
                    return False
                await asyncio.sleep(pause)
        previous = getattr(self.local, "held", None)
        if previous is not None:
            await previous._stop_watchdog()
        self.local.token, self.local.held = owner, held
        return True

    async def locked(self):
        try:
            return await self._run("LOCK.FENCE", self.name) is not None
        except ResponseError as e:
            return self._held_by_another_type(e)

    async def owned(self):
        token = self.fencing_token
        return token is not None and await self._run("LOCK.FENCE", self.name, token) == 1

    async def release(self):
        held = self._held("release")
        self.local.token = self.local.held = None
        if not await self._aowned_call("release", held.release):
            raise self._not_owned("release")

    def extend(self, additional_time, replace_ttl=False):
        """Returns an awaitable; raises LockError at once if not held (as redis-py does)."""
        return self._extend(self._held("extend"), additional_time, replace_ttl)

    async def _extend(self, held, additional_time, replace_ttl):
        if await self._aowned_call("extend", self._extend_command(held, additional_time, replace_ttl)) != 1:
            raise self._not_owned("extend")
        return True

    def reacquire(self):
        """Returns an awaitable; raises LockError at once if not held (as redis-py does)."""
        return self._reacquire(self._held("reacquire"))

    async def _reacquire(self, held):
        if not await self._aowned_call("reacquire", held.extend):
            raise self._not_owned("reacquire")
        return True
