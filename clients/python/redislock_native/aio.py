"""``AsyncLock``: the same lock for a ``redis.asyncio`` client."""

import asyncio
import inspect
import time

from redis.exceptions import ConnectionError, ResponseError, TimeoutError

from . import _wire
from . import default_session as _default
from . import feed as _feed
from . import feed_aio as _feed_aio
from .fence import afenced_call
from .lock import LockBusyError, LockLostError, _Base


class AsyncLock(_Base):
    """``Lock`` for ``redis.asyncio.Redis``: the same arguments, awaitable methods,
    ``async with``, and a watchdog that is an asyncio task.

    A task cancelled while it waits in ``acquire()`` leaves no grant behind: the waiter
    is unblocked (or its connection closed) and a grant that raced the cancellation is
    released before ``CancelledError`` propagates. ``on_lost`` may be a plain function or
    a coroutine function; it runs in the watchdog task, or in the change feed's task
    (``feed=True``: see ``Lock``).
    """

    def __init__(self, client, name, ttl, **kwargs):
        super().__init__(client, name, ttl, **kwargs)
        self._dog = None

    async def acquire(self, blocking=True, timeout=None):
        """Take the lock; True if granted. Same rules as ``Lock.acquire`` (a default session
        that ended under the call included)."""
        ends = None if timeout is None else time.monotonic() + timeout
        for attempt in range(_default.ATTEMPTS):
            if self._needs_default():
                self.session = await _default.asession_for(self.client, self.name)
            try:
                return await self._acquire(blocking, timeout)
            except ResponseError as e:
                if not self._joins_default or not _default.session_gone(e) or attempt + 1 == _default.ATTEMPTS:
                    raise
                _default.retire(self.client, self.session)
                if ends is not None:
                    timeout = max(0.0, ends - time.monotonic())

    async def _acquire(self, blocking, timeout):
        args, wait = self._acquire_args(blocking, timeout)
        held_before = self._token is not None
        cleanup = _nothing if held_before else self._release_quietly
        sent_at = time.monotonic()
        if self.durable:
            _wire.check_durable(await self.client.info("server"))
            reply, acked = await _wire.aacquire_blocking(
                self._pooled(), args, wait, cleanup, self._durable_args()
            )
            if reply is not None and acked < self.durable:
                # `cleanup` releases only a grant this call made (nothing if held before).
                raise self._not_durable(acked, held_before, await _wire.asucceeds(cleanup))
        elif wait == 0:
            try:
                reply = await self._run(*args)
            except (ConnectionError, TimeoutError):
                await _wire._aquietly(cleanup)
                raise
        else:
            reply = await _wire.aacquire_blocking(self._pooled(), args, wait, cleanup)
        if not self._granted(reply):
            return False
        if self._in_session():
            await self._report_lost(f"session lost: {self.session.lost_reason}")
        elif self.on_lost is not None and self.feed:
            self._watch_feed(_feed_aio.afeed_for(self.client), self._first_deadline(sent_at, wait))
        if self.watchdog and (self._dog is None or self._dog.done()):
            self._dog = asyncio.ensure_future(self._watch())
        return True

    async def release(self):
        """Give the lock back; True if this owner held it, False if it was already lost."""
        await self._stop_watchdog()
        self._let_go()
        return await self._run(*self._release_args()) == 1

    async def _release_quietly(self):
        await self._run(*self._release_args())

    async def extend(self, ttl=None):
        """Set the deadline to now + ``ttl`` seconds (default: the lock's ttl); False if lost."""
        sent_at = time.monotonic()
        if await self._run(*self._extend_args(ttl)) != 1:
            return False
        self._renewed_at(sent_at)
        return True

    async def locked(self):
        """True if anyone holds the lock."""
        return await self._run("LOCK.FENCE", self.name) is not None

    async def owned(self):
        """True if this object's hold is the live one."""
        if self._token is None:
            return False
        return await self._run("LOCK.FENCE", self.name, self._token) == 1

    async def fenced(self, command, key, *args):
        """Run ``command key *args`` only while this hold is live; else StaleTokenError."""
        return await afenced_call(self.client, self.name, self._token, command, key, *args)

    async def __aenter__(self):
        if await self.acquire(timeout=self.blocking_timeout):
            return self
        raise _wire.lock_error(
            LockBusyError, f"could not acquire {self.name!r} within {self.blocking_timeout} s", self.name
        )

    async def __aexit__(self, exc_type, exc, tb):
        if not await self.release() and exc_type is None:
            raise _wire.lock_error(
                LockLostError, f"{self.name!r} was no longer held by {self.owner!r} at release", self.name
            )

    # --- watchdog ---

    async def _stop_watchdog(self):
        dog, self._dog = self._dog, None
        if dog is None or dog is asyncio.current_task():
            return
        await _wire.astop(dog)

    async def _watch(self):
        """Renew every period until cancelled or the lock is gone; report a loss once.

        Cancellation (release) can land only while sleeping or while a renewal is in
        flight; either way the awaiting ``release()`` sends LOCK.RELEASE after it.
        """
        while True:
            await asyncio.sleep(self._period())
            sent_at = time.monotonic()
            try:
                reply = await _wire.acall_timed(self._pooled(), self._extend_args(None), self._period())
            except (asyncio.CancelledError, KeyboardInterrupt, SystemExit):
                raise
            except Exception as e:  # no answer within the period: fail safe, count it lost
                await self._report_lost(f"extend failed: {e!r}")
                return
            if not self._renewed(reply):
                await self._report_lost("not held")
                return
            self._renewed_at(sent_at)

    async def _report_lost(self, reason):
        if not self._claim_loss(reason):
            return
        self._halt_watchdog()
        if self.on_lost is not None:
            result = self.on_lost(self)
            if inspect.isawaitable(result):
                await result


    def _halt_watchdog(self):
        """No more renewals (the hold is gone: lost, or its session closed); never waits."""
        dog, self._dog = self._dog, None
        if dog is not None and dog is not asyncio.current_task():
            dog.cancel()

    async def _feed_lost(self, sub, reason):
        """The feed found this hold lost (in the feed's task): stop renewing, report once."""
        if self._feed_sub is not sub:
            return
        dog, self._dog = self._dog, None
        if dog is not None and dog is not asyncio.current_task():
            dog.cancel()
        await self._report_lost(reason)


async def _nothing():
    return None
