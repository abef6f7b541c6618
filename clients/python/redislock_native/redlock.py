"""``Redlock`` / ``AsyncRedlock``: one lock over N independent masters, granted by a majority.

The algorithm described for Redis's Redlock, with the module's commands in place of
``SET NX PX`` and the compare-and-delete script (the same as the Rust crate's ``Redlock`` and
the Node package's drop-in):

1. Note the start time; pick a random owner.
2. ``LOCK.ACQUIRE key owner ttl`` on every master (the sync class one after the other, the
   asyncio class all at once). Give each client short timeouts so that a dead master costs
   little (see the README).
3. Granted if a majority (``N // 2 + 1``) granted it and time is left:
   ``validity = ttl - elapsed - drift``, ``drift = ttl / 100 + 2 ms``.
4. Otherwise ``LOCK.RELEASE`` on every master that granted it or did not answer, and raise
   ``RedlockError`` saying why: contended, unavailable or expired.

The tokens are per master (``lock.tokens``, None where a master did not grant): a resource
fenced by one of them must be fenced on that master's token alone.
"""

import asyncio
import time

from redis.exceptions import LockError

from . import _wire


class RedlockError(LockError):
    """The lock was not granted by a majority. ``reason`` is ``"contended"`` (enough masters
    answered, too few granted), ``"unavailable"`` (too few answered to decide) or ``"expired"``
    (granted, but no validity time was left); ``granted``, ``answered`` and ``needed`` count
    masters, ``errors`` maps a master's index to its error."""

    def __init__(self, reason, granted, answered, needed, errors):
        super().__init__(
            f"redlock not granted ({reason}): {granted} granted, {answered} answered, "
            f"{needed} needed"
        )
        self.reason = reason
        self.granted = granted
        self.answered = answered
        self.needed = needed
        self.errors = errors


class _Round:
    """What the sync and asyncio classes share: the commands and the decision."""

    def __init__(self, clients, name, ttl, owner):
        if not clients:
            raise ValueError("a Redlock needs at least one master")
        self.clients = list(clients)
        self.name = name
        self._ttl_ms = _wire.to_ms(ttl, "ttl")
        self.owner = owner if owner is not None else _wire.new_owner()
        self.tokens = None
        self._valid_until = None

    @property
    def quorum(self):
        return len(self.clients) // 2 + 1

    @property
    def validity(self):
        """Seconds the lock can still be relied on (0 once past, None when not held)."""
        if self._valid_until is None:
            return None
        return max(0.0, self._valid_until - time.monotonic())

    def _acquire_args(self):
        return ("LOCK.ACQUIRE", self.name, self.owner, self._ttl_ms)

    def _release_args(self):
        return ("LOCK.RELEASE", self.name, self.owner)

    def _decide(self, started, replies):
        """``replies``: per master, a token, None (held by another), or an exception. Returns
        the masters to release and the error, or ``(None, None)`` when granted."""
        tokens = [r if isinstance(r, int) else None for r in replies]
        errors = {i: r for i, r in enumerate(replies) if isinstance(r, Exception)}
        granted = sum(t is not None for t in tokens)
        answered = len(replies) - len(errors)
        elapsed_ms = (time.monotonic() - started) * 1000
        drift_ms = self._ttl_ms / 100 + 2
        validity_ms = self._ttl_ms - elapsed_ms - drift_ms
        undo = [i for i, r in enumerate(replies) if r is not None]  # granted, or no answer
        if granted >= self.quorum and validity_ms > 0:
            self.tokens = tokens
            self._valid_until = started + (self._ttl_ms - drift_ms) / 1000
            return None, None
        if granted >= self.quorum:
            reason = "expired"
        elif answered >= self.quorum:
            reason = "contended"
        else:
            reason = "unavailable"
        return undo, RedlockError(reason, granted, answered, self.quorum, errors)


class Redlock(_Round):
    """A Redlock over ``clients`` (``redis.Redis``, one per independent master).

    ``Redlock(clients, name, ttl)``; ``acquire()`` returns True or raises ``RedlockError``;
    ``release()`` gives it back on every master; ``with Redlock(...) as lock:``."""

    def __init__(self, clients, name, ttl, *, owner=None):
        super().__init__(clients, name, ttl, owner)

    def acquire(self):
        started = time.monotonic()
        replies = []
        for client in self.clients:
            try:
                reply = client.execute_command(*self._acquire_args())
                replies.append(int(reply) if reply is not None else None)
            except Exception as e:  # noqa: BLE001 - a master that failed counts as unavailable
                replies.append(e)
        undo, error = self._decide(started, replies)
        if error is not None:
            for i in undo:
                _wire._quietly(lambda c=self.clients[i]: c.execute_command(*self._release_args()))
            raise error
        return True

    def release(self):
        """Release on every master; the number of masters where it was still held."""
        released = 0
        for client in self.clients:
            try:
                released += client.execute_command(*self._release_args()) == 1
            except Exception:  # noqa: BLE001 - a master down keeps it until its ttl
                pass
        self.tokens = self._valid_until = None
        return released

    def __enter__(self):
        self.acquire()
        return self

    def __exit__(self, *exc):
        self.release()


class AsyncRedlock(_Round):
    """``Redlock`` for ``redis.asyncio`` clients: the masters are asked all at once."""

    def __init__(self, clients, name, ttl, *, owner=None):
        super().__init__(clients, name, ttl, owner)

    async def _one(self, client, args):
        try:
            reply = await client.execute_command(*args)
            return int(reply) if reply is not None else None
        except Exception as e:  # noqa: BLE001
            return e

    async def acquire(self):
        started = time.monotonic()
        replies = await asyncio.gather(*(self._one(c, self._acquire_args()) for c in self.clients))
        undo, error = self._decide(started, list(replies))
        if error is not None:
            await asyncio.gather(*(self._one(self.clients[i], self._release_args()) for i in undo))
            raise error
        return True

    async def release(self):
        replies = await asyncio.gather(*(self._one(c, self._release_args()) for c in self.clients))
        self.tokens = self._valid_until = None
        return sum(r == 1 for r in replies)

    async def __aenter__(self):
        await self.acquire()
        return self

    async def __aexit__(self, *exc):
        await self.release()
