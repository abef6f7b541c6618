"""The change feed (``LOCK.WATCH``): a holder hears of its loss at once, an observer of each change.

The server publishes every change of a watched lock key to a sharded pub/sub channel of that key
(``lock.feed:{TAG}:DB:KEY``) as one string, ``<seq> <event> <token> <ttl-ms> <owner>``, while at
least one connection watches the key (``LOCK.WATCH key`` answers ``[channel, seq]``). ``seq``
grows by 1 per message of the key; a gap means messages were lost (pub/sub delivers at most
once). The state and its seq are read in one step, ``MULTI``, ``LOCK.WATCH``, ``LOCK.INFO``,
``EXEC`` (``LOCK.INFO`` is nil for a free key, with no seq to show).

One ``Feed`` per client object (``feed_for(client)``; ``feed_aio.afeed_for`` for
``redis.asyncio``), not per lock: two connections made like the client's own but outside its
pool, with no retries, RESP2 and no health check (either could replace a connection behind the
feed's back):

- the *watch* connection sends ``LOCK.WATCH``, ``LOCK.UNWATCH`` and the state reads; the server
  ends its watches when it closes;
- the *pub/sub* connection ``SSUBSCRIBE``\\ s to the channels (a RESP2 connection that has
  subscribed can send nothing else).

Both are named (``CLIENT SETNAME``) ``redislock-feed-watch-<id>`` and ``redislock-feed-sub-<id>``
(``Feed.id``: the process id and a counter). One thread (an asyncio task for ``AsyncFeed``, in
``feed_aio.py``) reads them, checks the holders' deadlines and reports; it starts with the first
subscriber and ends, closing both connections, ``IDLE_CLOSE`` seconds after the last one left.

Two kinds of subscriber:

- a *hold* (a lock with ``on_lost``, see ``lock.py``): reported lost once, the moment the feed
  says the server ended it (``_Hold.on_message``), when its own conservative deadline passes with
  no renewal, or when either connection is lost (fail-safe: nothing tells it any more);
- an *observer* (``Election.observe()``): every change of the key's exclusive holder, ``None``
  for "nobody". After a gap in ``seq``, or a reconnect, the feed reads the state again and
  reports it, marked ``resync=True``; terms in between may have been missed.

A new subscriber of a key is checked against the state as soon as the key is watched and
subscribed, so a loss between the grant and the watch is reported too.

A message is a claim, never proof: anyone allowed to ``SPUBLISH`` on the channel can publish
one (``SECURITY.md``). So a message that would report a loss or a new leader is confirmed with
the server before anything is reported: the feed reads the state (the same ``MULTI``,
``LOCK.WATCH``, ``LOCK.INFO``, ``EXEC`` as after a gap) and reports what that shows, the
message's words only when the state agrees. A hold is lost only when ``LOCK.INFO`` no longer
shows its token (or the server answers that it is a replica now); an observer reports the
leader ``LOCK.INFO`` shows, and nothing when that is the leader it reported last. Two messages
with one sequence number mean one was not the server's: the state is read then too, so a forged
message cannot hide the real one that takes its number. A real change costs one round trip more
than the message alone; a forged one costs a read and reports nothing. Decisions are in
``_Core`` (no I/O, shared by the sync and asyncio drivers); ``Feed`` (a thread) and
``AsyncFeed`` (a task) only move bytes.

With a ``RedisCluster`` client a key's feed is that of redis-py's client of the key's node: the
channel lives on the key's shard. A failover closes that node's connections, which is reported
(fail-safe); an observer reconnects to the same address. ``redis.asyncio``'s cluster client gets
no feed (``afeed_for`` answers None): its holders keep the watchdog's and the session's reports.
"""

import logging
import os
import queue
import select
import socket
import threading
import time
import weakref

from redis.exceptions import ConnectionError, ReadOnlyError, ResponseError, TimeoutError

from . import _wire
from . import feed_failover as _failover

log = logging.getLogger("redislock_native")

from .feed_core import (  # noqa: F401 (re-exported: feed_aio, feed_failover and tests use them)
    IDLE_CLOSE,
    MAX_BACKOFF,
    HOLD_ENDS,
    KEY_ENDS,
    GRANTS,
    RECENT,
    WATCH_NAME,
    SUB_NAME,
    _ids,
    Message,
    Leader,
    Change,
    parse_message,
    _fields,
    State,
    parse_info,
    text,
    margin,
    _Hold,
    _Observer,
    _Core,
    _keys,
    _key,
    _connection_kwargs,
    _state_commands,
    REPLICA,
    _state_of,
    _state,
    _channel_of,
    _is_unknown_command,
)


# --- sync -----------------------------------------------------------------------------


_FEEDS = weakref.WeakKeyDictionary()
_FEEDS_MUTEX = threading.Lock()


def feed_for(client, key=None):
    """The ``Feed`` of a ``redis.Redis`` client (made on first use). For a ``RedisCluster``
    client, the feed of its client of the node that serves ``key`` (the channel lives on the
    key's shard); None for an asyncio cluster client (no node clients to build on)."""
    cluster = None
    if not hasattr(client, "connection_pool"):
        if key is None or not hasattr(client, "get_redis_connection"):
            return None
        cluster = client
        client = client.get_redis_connection(client.get_node_from_key(key))
    with _FEEDS_MUTEX:
        feed = _FEEDS.get(client)
        if feed is None:
            feed = _FEEDS[client] = Feed(client)
            weakref.finalize(client, _retire, feed)
        if cluster is not None and feed._cluster is None:
            feed._cluster = weakref.ref(cluster)
        return feed




def _retire(feed):
    """The client ``feed`` was built on is gone. A ``RedisCluster`` drops a node's client after
    a connection error there (and makes a new one on next use), from whichever thread met it:
    the holds and observers still in the feed then go to the feed of their slot's master now, as
    after a failover, instead of being closed with it unreported (under load, an observer of a
    failed-over key then saw no change again). Otherwise the feed just closes."""
    if feed._cluster is not None and feed._cluster() is not None:
        with feed._core.mutex:
            taken = feed._core.take()
        if taken:
            feed._hand_over(taken, ConnectionError("the cluster client replaced this node's client"))
    feed.close()


class Feed:
    """The change feed of one ``redis.Redis`` client: one watch and one pub/sub connection, one
    thread (``redislock-feed``), shared by every hold and observer of the client."""

    def __init__(self, client):
        pool = client.connection_pool
        self._connection_class = pool.connection_class
        self._kwargs = dict(pool.connection_kwargs)
        self._core = _Core()
        self._name_connections()
        self._thread = None
        self._closing = False
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        #: The ``RedisCluster`` (a weak reference) whose node client this feed is built on: a
        #: failover hands the subscribers over to the feed of their slot's new master.
        self._cluster = None

    def _name_connections(self):
        self.id = f"{os.getpid()}-{next(_ids)}"
        self.watch_name = f"{WATCH_NAME}-{self.id}"
        self.sub_name = f"{SUB_NAME}-{self.id}"

    # --- what locks and observers call ---

    def hold(self, lock, tokens, shared, deadline):
        """Watch ``tokens`` (key -> token) of ``lock`` until ``drop``; None if the server has no feed."""
        hold = _Hold(self, lock, _keys(tokens), shared, deadline)
        return hold if self._add(hold, hold.tokens) else None

    def observe(self, key):
        """An ``_Observer`` of ``key`` whose changes go to its ``queue`` (a ``queue.Queue``)."""
        q = queue.Queue()
        observer = _Observer(self, _key(key), q.put)
        observer.queue = q
        if not self._add(observer, [observer.key]):
            raise ResponseError(f"the server has no change feed: {self._core.unsupported}")
        return observer

    def drop(self, sub):
        sub.dropped = True  # a hand-over in flight must not adopt it
        with self._core.mutex:
            self._core.remove(sub)
        self._wake()

    def renewed(self, hold, sent_at, ttl_s):
        """A renewal sent at ``sent_at`` succeeded: the hold lasts at least ``ttl_s`` from then."""
        with self._core.mutex:
            deadline = sent_at + ttl_s - margin(ttl_s)
            if hold.deadline is None or deadline > hold.deadline:
                hold.deadline = deadline

    def close(self):
        """Stop the thread and close both connections (holders still watched are not reported)."""
        with self._core.mutex:
            self._closing = True
            thread = self._thread
        self._wake()
        if thread is not None and thread is not threading.current_thread():
            thread.join(5)

    def _add(self, sub, keys):
        with self._core.mutex:
            if self._core.unsupported is not None:
                return False
            self._core.add(sub, keys)
            if self._thread is None and not self._closing:
                self._thread = threading.Thread(target=self._run, name="redislock-feed", daemon=True)
                self._thread.start()
        self._wake()
        return True

    def _wake(self):
        try:
            self._wake_w.send(b"x")
        except OSError:
            pass

    # --- the thread ---

    def _connect(self):
        conns = []
        try:
            for name in (self.watch_name, self.sub_name):
                conn = self._connection_class(**_connection_kwargs(self._kwargs, name))
                conn.connect()
                conns.append(conn)
        except BaseException:
            for conn in conns:
                conn.disconnect()
            raise
        return conns

    def _run(self):
        conns = None
        idle_since = None
        backoff = 0.0
        core = self._core
        try:
            while True:
                with core.mutex:
                    busy = bool(core.subs)
                    if busy:
                        idle_since = None
                    elif idle_since is None:
                        idle_since = time.monotonic()
                    if self._closing or (idle_since is not None and time.monotonic() - idle_since >= IDLE_CLOSE):
                        self._thread = None
                        return
                if busy and conns is None:
                    try:
                        conns = self._connect()
                        backoff = 0.0
                    except Exception as e:
                        if self._following(e):
                            with core.mutex:
                                taken = core.take()
                                core.disconnected(e)
                            self._hand_over(taken, e)
                        else:
                            with core.mutex:
                                effects = core.disconnected(e)
                            self._dispatch(effects)
                        backoff = min(MAX_BACKOFF, backoff * 2 or 0.05)
                        self._sleep(backoff)
                        continue
                try:
                    if conns is not None:
                        self._reconcile(conns)
                    self._wait(conns, idle_since)
                except Exception as e:  # a connection lost, or a reply that makes no sense: start over
                    for conn in conns or ():
                        conn.disconnect()
                    conns = None
                    if self._following(e):
                        with core.mutex:
                            taken = core.take()
                            core.disconnected(e)
                        self._hand_over(taken, e)
                        continue
                    with core.mutex:
                        effects = core.disconnected(e)
                    self._dispatch(effects)
                with core.mutex:
                    effects = core.expired(time.monotonic())
                self._dispatch(effects)
        finally:
            for conn in conns or ():
                conn.disconnect()

    def _sleep(self, seconds):
        select.select([self._wake_r], [], [], seconds)
        self._drain_wake()

    def _drain_wake(self):
        try:
            while self._wake_r.recv(4096):
                pass
        except (BlockingIOError, OSError):
            pass

    def _command(self, conn, *args):
        conn.send_command(*args)
        return conn.read_response(disconnect_on_error=False)

    def _reconcile(self, conns):
        """WATCH and subscribe what is wanted, UNWATCH what is not, check new subscribers."""
        watch, sub = conns
        core = self._core
        with core.mutex:
            to_watch, to_unwatch, checks = core.plan()
        for key in to_watch:
            try:
                channel, _seq = _channel_of(self._command(watch, "LOCK.WATCH", key))
            except ResponseError as e:
                if self._following(e):
                    with core.mutex:
                        taken = core.take([key])
                    self._hand_over(taken, e)
                    continue
                with core.mutex:
                    if _is_unknown_command(e):
                        core.unsupported = e
                    effects = core.refused(key, e)
                self._dispatch(effects)
                continue
            with core.mutex:
                core.watching(key, channel)
            sub.send_command("SSUBSCRIBE", channel)
        for key in to_unwatch:
            with core.mutex:
                channels = [c for c, k in core.channel_key.items() if k == key]
                core.unwatching(key)
            self._command(watch, "LOCK.UNWATCH", key)
            for channel in channels:
                sub.send_command("SUNSUBSCRIBE", channel)
        for key, subs in checks:
            self._sync(watch, key, subs)

    def _sync(self, watch, key, subs=None):
        sent_at = time.monotonic()
        watch.send_packed_command(watch.pack_commands(_state_commands(key)))
        replies = []
        for _ in range(4):  # OK, QUEUED, QUEUED, the EXEC
            try:
                replies.append(watch.read_response(disconnect_on_error=False))
            except ResponseError as e:
                replies.append(e)
        state = _state_of(replies)
        if state is REPLICA and self._cluster is not None:
            # A cluster node that turned replica: the slot has a new master, where the
            # holds are (a failover keeps them) and the key's feed now is.
            with self._core.mutex:
                taken = self._core.take([key])
            self._hand_over(taken, ReadOnlyError("the node is a replica now"))
            return
        with self._core.mutex:
            effects = self._core.synced(key, state, sent_at, subs)
        self._dispatch(effects)

    def _wait(self, conns, idle_since):
        """Wait for a message, the watch connection closing, a wake-up or the next deadline."""
        with self._core.mutex:
            deadline = self._core.next_deadline()
        timeout = None if deadline is None else max(0.0, deadline - time.monotonic())
        if idle_since is not None:
            left = max(0.0, idle_since + IDLE_CLOSE - time.monotonic())
            timeout = left if timeout is None else min(timeout, left)
        sockets = [self._wake_r]
        if conns is not None:
            watch, sub = conns
            if sub.can_read(timeout=0):  # replies the parser has buffered already
                timeout = 0
            sockets += [_socket(watch), _socket(sub)]
        readable, _, _ = select.select(sockets, [], [], timeout)
        self._drain_wake()
        if conns is None:
            return
        watch, sub = conns
        if _socket(watch) in readable and watch.can_read(timeout=0):
            raise ConnectionError("an unexpected reply on the feed's watch connection")
        while sub.can_read(timeout=0):
            self._received(watch, sub.read_response(disconnect_on_error=False))

    def _received(self, watch, reply):
        kind = reply[0]
        core = self._core
        if kind == b"smessage":
            with core.mutex:
                effects, resync = core.message(reply[1], reply[2])
            self._dispatch(effects)
            if resync is not None:
                self._sync(watch, resync)
        elif kind == b"sunsubscribe":
            # Sent by the server, not asked for (an unwatched key's channel has left
            # channel_key before its SUNSUBSCRIBE): the slot left this node (a failover, a
            # migration). The holds are on the slot's new master; so is the key's feed.
            with core.mutex:
                key = core.channel_key.get(reply[1])
                taken = core.take([key]) if key is not None and self._cluster is not None else []
            if taken:
                self._hand_over(taken, ResponseError("sunsubscribe: the key's slot left this node"))
        elif kind == b"ssubscribe":
            with core.mutex:
                key = core.confirmed(reply[1])
            if key is not None:
                self._sync(watch, key)

    # --- a failover in a cluster (feed_failover.py) ---

    def _following(self, error):
        """Whether ``error`` on this feed's node means the slot may have moved (in a cluster)."""
        return self._cluster is not None and self._cluster() is not None and _wire.moved_away(error)

    def _hand_over(self, subs, error):
        """Give ``subs`` (taken from this feed) to the feeds of their keys' masters now."""
        _failover.hand_over(self, subs, error)

    def _dispatch(self, effects):
        for sub, effect in effects:
            try:
                if sub.kind == "hold":
                    sub.lock._feed_lost(sub, effect)
                else:
                    sub.put(effect)
            except Exception:
                log.exception("redislock_native: a loss callback raised")


def _socket(conn):
    sock = getattr(conn, "_sock", None)
    if sock is None:
        raise ConnectionError("the feed's connection is closed")
    return sock
