"""``LOCK.INFO`` in one shape, whichever redis-py client class reads it.

The server answers a map. redis-py turns it into a dict where it knows the command's reply
shape or speaks RESP3 (``RedisCluster`` did here), and leaves a RESP2 map as a flat list
``[field, value, ...]`` otherwise (``redis.Redis``); the holders and the queue are maps inside
it, shaped the same way. ``lock_info`` (``alock_info`` for asyncio) gives a dict with ``str``
field names every time, ``holders`` and ``queue`` as lists of such dicts, or None when the key
is free. Values are as the client decodes them (bytes unless ``decode_responses=True``).
"""

from . import _wire


def _text(value):
    return value.decode() if isinstance(value, bytes) else value


def _map(reply):
    if isinstance(reply, list):
        reply = dict(zip(reply[::2], reply[1::2]))
    return {_text(k): v for k, v in reply.items()}


def normalize_info(reply):
    """A ``LOCK.INFO`` reply (dict or flat list, or None) as one dict shape, or None."""
    if reply is None:
        return None
    info = _map(reply)
    for field in ("holders", "queue"):
        if isinstance(info.get(field), list):
            info[field] = [_map(entry) if isinstance(entry, (list, dict)) else entry for entry in info[field]]
    return info


def lock_info(client, key):
    """``LOCK.INFO key`` through ``client`` (``redis.Redis`` or ``RedisCluster``: straight to the
    key's master), as ``normalize_info`` shapes it."""
    return normalize_info(client.execute_command("LOCK.INFO", key, **_wire.route(client, key)))


async def alock_info(client, key):
    """``lock_info`` for ``redis.asyncio`` clients."""
    return normalize_info(await client.execute_command("LOCK.INFO", key, **_wire.route(client, key)))
