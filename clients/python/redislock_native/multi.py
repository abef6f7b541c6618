"""``MultiLock``: exclusive locks on several keys, all or none (``LOCK.MACQUIRE``).

``MultiLock(client, names, ttl)`` takes every key in one step or none, waiting in every key's
queue at once with one ``LOCK.MACQUIRE numkeys key ... owner ttl-ms BLOCK ms`` (so two sets
that overlap cannot deadlock), and gives them back with one ``LOCK.MRELEASE``. ``tokens`` are
the fencing tokens, one per key, in the order of ``names``. In a cluster the keys must share a
hash tag. There is no multi-key extend command: ``extend()``, ``owned()``, ``locked()`` and the
watchdog's renewals run one script over the keys (one atomic step on the server).
"""

import time

from .aio import AsyncLock
from .lock import Lock

# KEYS the locks, ARGV[1] the owner, ARGV[2] ttl-ms: how many keys were extended.
_EXTEND_ALL_LUA = """\
local n = 0
for _, key in ipairs(KEYS) do
    n = n + redis.call('LOCK.EXTEND', key, ARGV[1], ARGV[2])
end
return n
"""

# KEYS the locks, ARGV their tokens: 1 if every token is live.
_OWNED_ALL_LUA = """\
for i, key in ipairs(KEYS) do
    if redis.call('LOCK.FENCE', key, ARGV[i]) ~= 1 then
        return 0
    end
end
return 1
"""

# KEYS the locks: 1 if any of them is held.
_ANY_HELD_LUA = """\
for _, key in ipairs(KEYS) do
    if redis.call('LOCK.FENCE', key) then
        return 1
    end
end
return 0
"""


class _Multi:
    """What MultiLock and AsyncMultiLock add to Lock / AsyncLock: the commands."""

    def _setup(self, names):
        self.names = list(names)
        if not self.names:
            raise ValueError("names must not be empty")
        self.tokens = None

    def _acquire_args(self, blocking, timeout):
        args, wait = super()._acquire_args(blocking, timeout)
        # ("LOCK.ACQUIRE", name, owner, ttl, [BLOCK ms]) -> ("LOCK.MACQUIRE", n, *names, owner, ttl, ...)
        return ("LOCK.MACQUIRE", len(self.names), *self.names) + args[2:], wait

    def _release_args(self):
        return ("LOCK.MRELEASE", len(self.names), *self.names, self.owner)

    def _extend_args(self, ttl):
        super()._extend_args(ttl)
        return ("EVAL", _EXTEND_ALL_LUA, len(self.names), *self.names, self.owner, self._ttl_ms)

    def _let_go(self):
        super()._let_go()
        self.tokens = None

    def _granted(self, reply):
        if reply is None:
            return False
        self.tokens = [int(t) for t in reply]
        self._token = max(self.tokens)
        self._lost_reason = None
        return True

    def _renewed(self, reply):
        return reply == len(self.names)

    def _feed_tokens(self):
        return dict(zip(self.names, self.tokens))

    def _owned_args(self):
        return ("EVAL", _OWNED_ALL_LUA, len(self.names), *self.names, *self.tokens)

    def _locked_args(self):
        return ("EVAL", _ANY_HELD_LUA, len(self.names), *self.names)


class MultiLock(_Multi, Lock):
    """Exclusive locks on every key of ``names`` or none; ``Lock``'s methods and arguments.

    ``release()`` and ``extend()`` are True only if every key was still held; ``token`` is
    the largest of ``tokens``. ``fenced()`` is not offered: fence each key with its token
    (``redislock_native.fence.fenced_call``).
    """

    def __init__(self, client, names, ttl, **kwargs):
        self._setup(names)
        super().__init__(client, self.names[0], ttl, **kwargs)

    def release(self):
        self._stop_watchdog()
        self._let_go()
        return self._run(*self._release_args()) == len(self.names)

    def extend(self, ttl=None):
        sent_at = time.monotonic()
        if self._run(*self._extend_args(ttl)) != len(self.names):
            return False
        self._renewed_at(sent_at)
        return True

    def owned(self):
        return self.tokens is not None and self._run(*self._owned_args()) == 1

    def locked(self):
        return self._run(*self._locked_args()) == 1

    def fenced(self, *args):
        raise NotImplementedError("fence each key with its own token: fenced_call(client, key, token, ...)")


class AsyncMultiLock(_Multi, AsyncLock):
    """``MultiLock`` for ``redis.asyncio``."""

    def __init__(self, client, names, ttl, **kwargs):
        self._setup(names)
        super().__init__(client, self.names[0], ttl, **kwargs)

    async def release(self):
        await self._stop_watchdog()
        self._let_go()
        return await self._run(*self._release_args()) == len(self.names)

    async def extend(self, ttl=None):
        sent_at = time.monotonic()
        if await self._run(*self._extend_args(ttl)) != len(self.names):
            return False
        self._renewed_at(sent_at)
        return True

    async def owned(self):
        return self.tokens is not None and await self._run(*self._owned_args()) == 1

    async def locked(self):
        return await self._run(*self._locked_args()) == 1

    async def fenced(self, *args):
        raise NotImplementedError("fence each key with its own token: afenced_call(client, key, token, ...)")
