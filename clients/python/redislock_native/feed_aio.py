"""The change feed for ``redis.asyncio`` clients: ``AsyncFeed``, the driver of ``feed.py``'s
decisions in one task (see ``feed.py`` for what the feed does)."""

import asyncio
import time
import weakref

from redis.exceptions import ConnectionError, ResponseError

from .feed import (
    IDLE_CLOSE,
    MAX_BACKOFF,
    Feed,
    _channel_of,
    _connection_kwargs,
    _Core,
    _is_unknown_command,
    _key,
    _Observer,
    _state_of,
    _state_commands,
    log,
)

_AFEEDS = weakref.WeakKeyDictionary()


def afeed_for(client):
    """The ``AsyncFeed`` of a ``redis.asyncio.Redis`` client, or None for a cluster client."""
    if not hasattr(client, "connection_pool"):
        return None
    feed = _AFEEDS.get(client)
    if feed is None or feed._loop is not asyncio.get_running_loop():
        feed = _AFEEDS[client] = AsyncFeed(client)
    return feed


class AsyncFeed(Feed):
    """``Feed`` for ``redis.asyncio.Redis``: the same connections and decisions, one task."""

    def __init__(self, client):
        pool = client.connection_pool
        self._connection_class = pool.connection_class
        self._kwargs = dict(pool.connection_kwargs)
        self._core = _Core()
        self._name_connections()
        self._task = None
        self._closing = False
        self._loop = asyncio.get_running_loop()
        self._event = asyncio.Event()

    def observe(self, key):
        q = asyncio.Queue()
        observer = _Observer(self, _key(key), q.put_nowait)
        observer.queue = q
        if not self._add(observer, [observer.key]):
            raise ResponseError(f"the server has no change feed: {self._core.unsupported}")
        return observer

    def drop(self, sub):
        self._core.remove(sub)
        self._wake()

    async def aclose(self):
        self._closing = True
        self._wake()
        task = self._task
        if task is not None and task is not asyncio.current_task():
            try:
                await task
            except asyncio.CancelledError:
                pass

    def close(self):
        self._closing = True
        self._wake()

    def _add(self, sub, keys):
        if self._core.unsupported is not None:
            return False
        self._core.add(sub, keys)
        if self._task is None and not self._closing:
            self._task = asyncio.ensure_future(self._run())
        self._wake()
        return True

    def _wake(self):
        self._event.set()

    async def _connect(self):
        conns = []
        try:
            for name in (self.watch_name, self.sub_name):
                conn = self._connection_class(**_connection_kwargs(self._kwargs, name))
                await conn.connect()
                conns.append(conn)
        except BaseException:
            for conn in conns:
                await conn.disconnect()
            raise
        return conns

    async def _run(self):
        conns = None
        idle_since = None
        backoff = 0.0
        core = self._core
        self._reading = None
        try:
            while True:
                busy = bool(core.subs)
                if busy:
                    idle_since = None
                elif idle_since is None:
                    idle_since = time.monotonic()
                if self._closing or (idle_since is not None and time.monotonic() - idle_since >= IDLE_CLOSE):
                    self._task = None  # before the awaits below: a subscriber added meanwhile starts a new task
                    return
                if busy and conns is None:
                    try:
                        conns = await self._connect()
                        backoff = 0.0
                    except Exception as e:
                        await self._dispatch(core.disconnected(e))
                        backoff = min(MAX_BACKOFF, backoff * 2 or 0.05)
                        await self._sleep(backoff)
                        continue
                try:
                    if conns is not None:
                        await self._reconcile(conns)
                    await self._wait(conns, idle_since)
                except Exception as e:
                    await self._cancel_reading()
                    for conn in conns or ():
                        await conn.disconnect()
                    conns = None
                    await self._dispatch(core.disconnected(e))
                await self._dispatch(core.expired(time.monotonic()))
        finally:
            if self._task is asyncio.current_task():
                self._task = None
            await self._cancel_reading()
            for conn in conns or ():
                await conn.disconnect()

    async def _cancel_reading(self):
        reading, self._reading = self._reading, None
        if reading is not None:
            reading.cancel()
            try:
                await reading
            except BaseException:
                pass

    async def _sleep(self, seconds):
        try:
            await asyncio.wait_for(self._event.wait(), seconds)
        except asyncio.TimeoutError:
            pass
        self._event.clear()

    async def _command(self, conn, *args):
        await conn.send_command(*args)
        return await conn.read_response(timeout=_FOREVER, disconnect_on_error=False)

    async def _reconcile(self, conns):
        watch, sub = conns
        core = self._core
        to_watch, to_unwatch, checks = core.plan()
        for key in to_watch:
            try:
                channel, _seq = _channel_of(await self._command(watch, "LOCK.WATCH", key))
            except ResponseError as e:
                if _is_unknown_command(e):
                    core.unsupported = e
                await self._dispatch(core.refused(key, e))
                continue
            core.watching(key, channel)
            await sub.send_command("SSUBSCRIBE", channel)
        for key in to_unwatch:
            channels = [c for c, k in core.channel_key.items() if k == key]
            core.unwatching(key)
            await self._command(watch, "LOCK.UNWATCH", key)
            for channel in channels:
                await sub.send_command("SUNSUBSCRIBE", channel)
        for key, subs in checks:
            await self._sync(watch, key, subs)

    async def _sync(self, watch, key, subs=None):
        sent_at = time.monotonic()
        await watch.send_packed_command(watch.pack_commands(_state_commands(key)))
        replies = []
        for _ in range(4):  # OK, QUEUED, QUEUED, the EXEC
            try:
                replies.append(await watch.read_response(timeout=_FOREVER, disconnect_on_error=False))
            except ResponseError as e:
                replies.append(e)
        state = _state_of(replies)
        await self._dispatch(self._core.synced(key, state, sent_at, subs))

    async def _wait(self, conns, idle_since):
        deadline = self._core.next_deadline()
        timeout = None if deadline is None else max(0.0, deadline - time.monotonic())
        if idle_since is not None:
            left = max(0.0, idle_since + IDLE_CLOSE - time.monotonic())
            timeout = left if timeout is None else min(timeout, left)
        waits = [asyncio.ensure_future(self._event.wait())]
        probe = None
        if conns is not None:
            watch, sub = conns
            if self._reading is None:  # one read of the pub/sub connection at a time, never cut
                self._reading = asyncio.ensure_future(
                    sub.read_response(timeout=_FOREVER, disconnect_on_error=False)
                )
            # The watch connection is read only to see it close: a read with a timeout that
            # runs out leaves it as it was (redis-py answers None).
            probe = asyncio.ensure_future(
                watch.read_response(timeout=_FOREVER, disconnect_on_error=False)
            )
            waits += [self._reading, probe]
        try:
            await asyncio.wait(waits, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        finally:
            waits[0].cancel()
            if probe is not None and not probe.done():
                probe.cancel()
                try:
                    await probe
                except BaseException:
                    pass
        self._event.clear()
        if conns is None:
            return
        watch, _sub = conns
        if probe.done() and not probe.cancelled():
            probe.result()  # raises ConnectionError when it closed
            raise ConnectionError("an unexpected reply on the feed's watch connection")
        if self._reading.done():
            reading, self._reading = self._reading, None
            await self._received(watch, reading.result())

    async def _received(self, watch, reply):
        kind = reply[0]
        core = self._core
        if kind == b"smessage":
            effects, resync = core.message(reply[1], reply[2])
            await self._dispatch(effects)
            if resync is not None:
                await self._sync(watch, resync)
        elif kind == b"ssubscribe":
            key = core.confirmed(reply[1])
            if key is not None:
                await self._sync(watch, key)

    async def _dispatch(self, effects):
        for sub, effect in effects:
            try:
                if sub.kind == "hold":
                    await sub.lock._feed_lost(sub, effect)
                else:
                    sub.put(effect)
            except Exception:
                log.exception("redislock_native: a loss callback raised")


#: A read that must not time out (redis-py's asyncio read treats None as "the socket timeout").
_FOREVER = 1e9
