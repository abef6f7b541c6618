"""Leader election on one lock key: ``Election`` / ``AsyncElection``.

A candidate campaigns with ``LOCK.ACQUIRE name value ttl BLOCK ...``: it waits in the key's FIFO
queue, one command, and leads once granted. The owner is the candidate's *value* (what the
leader publishes about itself: an address, an id), so candidates must keep their values unique;
the *term* is the grant's fencing token, larger for every new leader, so a deposed leader's
fenced writes (``Leadership.fenced``) are refused. A leadership is an ordinary ``Lock`` with a
watchdog, held in the client's default session (``default_session``: the leader's process dies,
its bound connection closes, and the next candidate leads within milliseconds, not after the
ttl); ``session=None`` holds by the ttl alone; with an explicit ``session=`` it is a hold of
that session, whose one keepalive covers it. It is watched through the change feed:
``Leadership.lost`` and ``on_lost`` tell the leader at once that it does not lead any more.

``leader()`` reads ``LOCK.INFO`` (value and term, or None). ``observe()`` follows the key's change
feed (``redislock_native.feed``): every change of leader, ``None`` when nobody leads, and after a
reconnect or a gap in the feed's sequence numbers the state read again, marked ``resync=True``.
"""

import asyncio
import queue

from . import default_session as _default
from . import feed as _feed
from . import feed_aio as _feed_aio
from .aio import AsyncLock
from .fence import afenced_call, fenced_call
from .feed import Change, Leader
from .lock import Lock

__all__ = ["Election", "AsyncElection", "Leadership", "AsyncLeadership", "Leader", "Change"]

#: A leadership's hold time without a session, in seconds (renewed by its watchdog every third).
DEFAULT_TTL = 10.0


class _ElectionBase:
    def __init__(self, client, name, ttl=None, *, session=_default.DEFAULT, watchdog_period=None):
        self.client = client
        self.name = name
        self.session = session
        explicit = session is not _default.DEFAULT and session is not None
        if ttl is None:
            ttl = 0 if explicit else DEFAULT_TTL
        self.ttl = ttl
        self.watchdog_period = watchdog_period
        self._explicit_session = explicit
        self._leadership = None

    def _lock_kwargs(self, value, on_lost):
        kwargs = dict(owner=value, on_lost=on_lost, session=self.session)
        if not self._explicit_session:  # the default session, or none: the watchdog renews the ttl
            kwargs.update(watchdog=True, watchdog_period=self.watchdog_period)
        return kwargs

    @staticmethod
    def _leader(reply):
        state = _feed.parse_info(reply)
        if not state.holders:
            return None
        owner, token, _ttl = state.holders[0]
        return Leader(_feed.text(owner), token)


class _LeadershipBase:
    def __init__(self, lock):
        self.lock = lock
        self._term = None  # set once granted

    @property
    def value(self):
        """What this leader published (its owner string)."""
        return self.lock.owner

    @property
    def term(self):
        """This leadership's term: the fencing token of its grant."""
        return self._term if self._term is not None else self.lock.token

    @property
    def lost(self):
        """True once this leadership was found gone (``lost_reason`` says how)."""
        return self.lock.lost

    @property
    def lost_reason(self):
        return self.lock.lost_reason

    def __repr__(self):
        state = f"lost ({self.lost_reason})" if self.lost else "leading"
        return f"<{type(self).__name__} {self.lock.name!r} value={self.value!r} term={self.term} {state}>"


class Leadership(_LeadershipBase):
    """A won campaign: ``value``, ``term``, ``lost``/``lost_reason``, ``fenced()``, ``resign()``."""

    def fenced(self, command, key, *args):
        """Run ``command key *args`` only while this term is the live one; else StaleTokenError."""
        return fenced_call(self.lock.client, self.lock.name, self.term, command, key, *args)

    def resign(self):
        """Step down (``LOCK.RELEASE``): the next candidate in the queue leads. True if this
        leadership was still live."""
        return self.lock.release()


class AsyncLeadership(_LeadershipBase):
    """``Leadership`` for ``redis.asyncio``: awaitable ``fenced()`` and ``resign()``."""

    async def fenced(self, command, key, *args):
        return await afenced_call(self.lock.client, self.lock.name, self.term, command, key, *args)

    async def resign(self):
        return await self.lock.release()


class Election(_ElectionBase):
    """Leader election on the lock key ``name``, through a ``redis.Redis`` client.

    - ``ttl``: seconds a leadership lasts unless renewed (default 10; its watchdog renews it
      every ``watchdog_period``, default ttl/3); with an explicit ``session=`` default 0 (no
      deadline of its own: the session's keepalive covers it).
    - ``session``: not given, the leadership also joins the client's default session (a
      takeover within milliseconds of the leader's process dying); ``None``: the ttl alone; a
      ``Session``: the leadership is held in it.
    """

    def campaign(self, value, timeout=None, on_lost=None):
        """Wait in the queue until this candidate leads; its ``Leadership``, or None if
        ``timeout`` seconds passed first (None: no limit). ``value`` becomes the owner: keep it
        unique among candidates. ``on_lost(leadership)`` is called once (from the feed's or the
        watchdog's thread) when the leadership is found gone."""
        def lost(_lock):
            if on_lost is not None:
                on_lost(leadership)

        lock = Lock(self.client, self.name, self.ttl, **self._lock_kwargs(value, lost))
        leadership = Leadership(lock)
        if not lock.acquire(timeout=timeout):
            return None
        leadership._term = lock.token
        self._leadership = leadership
        return leadership

    def resign(self):
        """Step down from the last leadership this object won; False if it was not live."""
        leadership, self._leadership = self._leadership, None
        return leadership is not None and leadership.resign()

    def leader(self):
        """Who leads now (``LOCK.INFO``): a ``Leader(value, term)``, or None."""
        return self._leader(self.client.execute_command("LOCK.INFO", self.name))

    def observe(self):
        """An ``Observation``: an iterator of ``Change(leader, resync, seq)``, the first being the
        state when it started (read from LOCK.INFO, ``resync=True``). Close it when done."""
        feed = _feed.feed_for(self.client, self.name)
        return Observation(feed, feed.observe(self.name))


class AsyncElection(_ElectionBase):
    """``Election`` for ``redis.asyncio``: awaitable ``campaign()``, ``resign()``, ``leader()``;
    ``observe()`` is an async iterator. ``on_lost`` may be a coroutine function."""

    async def campaign(self, value, timeout=None, on_lost=None):
        async def lost(_lock):
            if on_lost is not None:
                result = on_lost(leadership)
                if asyncio.iscoroutine(result):
                    await result

        lock = AsyncLock(self.client, self.name, self.ttl, **self._lock_kwargs(value, lost))
        leadership = AsyncLeadership(lock)
        if not await lock.acquire(timeout=timeout):
            return None
        leadership._term = lock.token
        self._leadership = leadership
        return leadership

    async def resign(self):
        leadership, self._leadership = self._leadership, None
        return leadership is not None and await leadership.resign()

    async def leader(self):
        return self._leader(await self.client.execute_command("LOCK.INFO", self.name))

    def observe(self):
        """An ``AsyncObservation`` (``async for change in election.observe()``)."""
        feed = _feed_aio.afeed_for(self.client)
        if feed is None:
            raise TypeError("observe() needs a redis.asyncio.Redis client (no change feed in a cluster yet)")
        return AsyncObservation(feed, feed.observe(self.name))


def watch(client, name):
    """Every change of the exclusive holder of any lock ``name``, as an ``Observation``: the same
    ``Change(leader, resync, seq)`` as ``Election.observe()``, where ``leader`` is the holder,
    ``Leader(value=owner, term=token)``, or None when nobody holds it. The first change is the
    state when it started. Close it when done."""
    return Election(client, name).observe()


def awatch(client, name):
    """``watch`` for a ``redis.asyncio.Redis`` client: an ``AsyncObservation``."""
    return AsyncElection(client, name).observe()


class Observation:
    """Leadership changes of one election, as an iterator of ``Change``; ``get(timeout)`` waits
    at most ``timeout`` seconds and then raises the built-in ``TimeoutError``. ``close()`` (or
    ``with``) stops it."""

    def __init__(self, feed, observer):
        self._feed = feed
        self._observer = observer

    def get(self, timeout=None):
        try:
            item = self._observer.queue.get(timeout=timeout)
        except queue.Empty:
            raise TimeoutError(f"no leadership change within {timeout} s") from None
        if isinstance(item, Exception):
            raise item
        return item

    def __iter__(self):
        return self

    def __next__(self):
        return self.get()

    def close(self):
        self._observer.feed.drop(self._observer)  # its feed now: a failover may have moved it

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class AsyncObservation:
    """``Observation`` for asyncio: ``async for``, ``await get(timeout)``, ``close()``."""

    def __init__(self, feed, observer):
        self._feed = feed
        self._observer = observer

    async def get(self, timeout=None):
        try:
            item = await asyncio.wait_for(self._observer.queue.get(), timeout)
        except asyncio.TimeoutError:
            raise TimeoutError(f"no leadership change within {timeout} s") from None
        if isinstance(item, Exception):
            raise item
        return item

    def __aiter__(self):
        return self

    async def __anext__(self):
        return await self.get()

    def close(self):
        self._observer.feed.drop(self._observer)  # its feed now: a failover may have moved it

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc):
        self.close()
