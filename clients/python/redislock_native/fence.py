"""Fenced writes: a write that happens only while a fencing token is the live hold.

A holder that pauses past its deadline (GC, swap, SIGSTOP) still believes it holds
the lock when it wakes up; only the resource can refuse its late write. With
redis-lock the resource can be Redis itself: ``LOCK.FENCE key token`` inside a
Lua script checks the token and the write runs in the same atomic step, so no
grant can slip in between.

- :data:`FENCE_CHECK_LUA` is the check to put first in a script of your own
  (``KEYS[1]`` the lock, ``ARGV[1]`` the token, as a string).
- :data:`FENCED_CALL_LUA` runs one command on one key behind that check;
  :func:`fenced_call` / :func:`afenced_call` send it, and ``Lock.fenced`` /
  ``AsyncLock.fenced`` send it with the lock's own token.
- :func:`fenced_script` registers your own script body behind the check.

A refused write raises :class:`StaleTokenError`, from every one of them. In a Redis Cluster, give the
lock and the written keys the same hash tag (``{sku:42}:lock``, ``{sku:42}:stock``).
"""

from redis.exceptions import LockNotOwnedError, ResponseError

FENCE_CHECK_LUA = """\
if redis.call('LOCK.FENCE', KEYS[1], ARGV[1]) ~= 1 then
    return redis.error_reply('STALE token ' .. ARGV[1] .. ' is not the live hold on ' .. KEYS[1])
end
"""

FENCED_CALL_LUA = (
    FENCE_CHECK_LUA
    + """\
-- KEYS[2] the key written, ARGV[2] the command, ARGV[3..] its other arguments.
return redis.call(ARGV[2], KEYS[2], unpack(ARGV, 3))
"""
)


class StaleTokenError(LockNotOwnedError):
    """The token was not the live hold on the lock: the write did not happen."""


def _stale(error):
    if isinstance(error, ResponseError) and str(error).startswith("STALE "):
        return StaleTokenError(str(error))
    return None


def fenced_script(client, body):
    """A registered script that runs ``body`` only while ``ARGV[1]`` is the live token of ``KEYS[1]``.

    Call it as ``script(keys=[lock_key, *your_keys], args=[token, *your_args])`` (with a
    ``redis.asyncio`` client, ``await script(...)``). A refused call raises
    :class:`StaleTokenError`, as :func:`fenced_call` and ``Lock.fenced`` do; other error replies
    are redis-py's ``ResponseError`` as usual.
    """
    return _FencedScript(client.register_script(FENCE_CHECK_LUA + body))


class _FencedScript:
    """redis-py's ``Script`` (or ``AsyncScript``), whose STALE refusal is a StaleTokenError."""

    def __init__(self, script):
        self._script = script

    def __getattr__(self, name):  # sha, script, ... as the wrapped Script has them
        return getattr(self._script, name)

    def __call__(self, keys=None, args=None, client=None):
        try:
            result = self._script(keys=keys, args=args, client=client)
        except ResponseError as e:
            raise (_stale(e) or e) from None
        if hasattr(result, "__await__"):
            return self._awaited(result)
        return result

    @staticmethod
    async def _awaited(result):
        try:
            return await result
        except ResponseError as e:
            raise (_stale(e) or e) from None


def _args(lock_key, token, command, key, args):
    if token is None:
        raise StaleTokenError(f"no token: the lock {lock_key!r} is not held")
    return [lock_key, key], [str(token), command, *args]


def _one_slot(client, lock_key, key):
    """In a cluster the check and the write run in one script on one node: both keys must hash
    to one slot. Raise a ValueError naming that rule (redis-py's own error would only say
    ``EVAL - all keys must map to the same key slot``)."""
    slot_of = getattr(client, "keyslot", None)
    if slot_of is None or not hasattr(client, "get_node_from_key"):
        return
    if slot_of(lock_key) != slot_of(key):
        raise ValueError(
            f"a fenced write runs LOCK.FENCE on {lock_key!r} and the write on {key!r} in one script, "
            "so in a cluster both keys need one hash tag (e.g. '{invoice:42}' and '{invoice:42}:total')"
        )


def fenced_call(client, lock_key, token, command, key, *args):
    """Run ``command key *args`` only while ``token`` is the live hold on ``lock_key``.

    Returns the command's reply; raises :class:`StaleTokenError` if the token is not live. In a
    cluster ``key`` must share ``lock_key``'s hash tag (ValueError otherwise).
    """
    _one_slot(client, lock_key, key)
    keys, argv = _args(lock_key, token, command, key, args)
    try:
        return client.eval(FENCED_CALL_LUA, len(keys), *keys, *argv)
    except ResponseError as e:
        raise (_stale(e) or e) from None


async def afenced_call(client, lock_key, token, command, key, *args):
    """The asyncio :func:`fenced_call`, for a ``redis.asyncio`` client."""
    _one_slot(client, lock_key, key)
    keys, argv = _args(lock_key, token, command, key, args)
    try:
        return await client.eval(FENCED_CALL_LUA, len(keys), *keys, *argv)
    except ResponseError as e:
        raise (_stale(e) or e) from None
