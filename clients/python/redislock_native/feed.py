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

import collections
import itertools
import logging
import os
import queue
import select
import socket
import threading
import time
import weakref

from redis.backoff import NoBackoff
from redis.exceptions import ConnectionError, ReadOnlyError, ResponseError, TimeoutError
from redis.retry import Retry

from . import _wire
from . import feed_failover as _failover

log = logging.getLogger("redislock_native")

#: Seconds the feed keeps its connections after its last subscriber left (a lock taken again
#: soon after reuses them).
IDLE_CLOSE = 2.0

#: The longest wait before reconnecting after the feed's connections failed (observers only:
#: holders were reported lost at the failure).
MAX_BACKOFF = 1.0

#: Events that end the hold whose token they carry.
HOLD_ENDS = frozenset({"released", "expired", "lost"})
#: Events about the whole key (owner empty, token 0): every hold of it ended.
KEY_ENDS = frozenset({"deleted", "flushed", "swapped", "demoted"})
#: A new token was granted (``handoff``: in the same step as a hold ended).
GRANTS = frozenset({"acquired", "handoff"})
#: Messages of a key remembered since its last state read, to tell a second message with the
#: same seq (one of the two was forged).
RECENT = 64

WATCH_NAME = "redislock-feed-watch"
SUB_NAME = "redislock-feed-sub"
_ids = itertools.count(1)

Message = collections.namedtuple("Message", "seq event token ttl owner")
Message.__doc__ = "One feed message: ``seq`` (int), ``event`` (str), ``token`` and ``ttl`` (ms) ints, ``owner`` bytes."

Leader = collections.namedtuple("Leader", "value term")
Leader.__doc__ = "Who leads: ``value`` (what the leader published: its owner string) and ``term`` (its fencing token)."

Change = collections.namedtuple("Change", "leader resync seq")
Change.__doc__ = """A change of leadership seen by ``observe()``: ``leader`` (a ``Leader``, or None: no
leader), ``resync`` (True: read from ``LOCK.INFO`` when observing started, after a reconnect or
after a gap in the feed; terms in between may have been missed) and ``seq`` (the key's sequence
number, None if ``LOCK.INFO`` showed none)."""


def parse_message(data):
    """``<seq> <event> <token> <ttl-ms> <owner>`` (bytes) as a ``Message``; ValueError if malformed."""
    parts = data.split(b" ", 4)
    if len(parts) < 4:
        raise ValueError(f"not a feed message: {data!r}")
    owner = parts[4] if len(parts) == 5 else b""
    return Message(int(parts[0]), parts[1].decode(), int(parts[2]), int(parts[3]), owner)


def _fields(reply):
    """A RESP2 flat list of field/value pairs (or a dict) as a dict with str keys."""
    if isinstance(reply, list):
        reply = dict(zip(reply[::2], reply[1::2]))
    return {(k.decode() if isinstance(k, bytes) else k): v for k, v in reply.items()}


State = collections.namedtuple("State", "seq holders")
State.__doc__ = "What ``LOCK.INFO`` showed: ``seq`` (None if absent) and ``holders``, ``[(owner, token, ttl_ms)]``."


def parse_info(reply):
    """``LOCK.INFO``'s reply as a ``State`` (nil: no holder, no seq)."""
    if reply is None:
        return State(None, [])
    fields = _fields(reply)
    seq = fields.get("seq")
    holders = []
    entries = fields.get("holders")
    if entries is not None:
        for entry in entries:
            h = _fields(entry)
            holders.append((h.get("owner", b""), int(h["token"]), int(h.get("ttl", 0))))
    elif fields.get("token") is not None and fields.get("owner") is not None:
        holders.append((fields["owner"], int(fields["token"]), int(fields.get("ttl", 0))))
    return State(None if seq is None else int(seq), holders)


def text(value):
    """An owner (bytes) as str, reversibly (``surrogateescape``)."""
    return value.decode("utf-8", "surrogateescape") if isinstance(value, bytes) else value


def margin(ttl_s):
    """How much earlier than ``sent + ttl`` a holder counts its hold gone: clock rates differ."""
    return max(0.002, ttl_s * 0.01)


# --- subscribers ----------------------------------------------------------------------


class _Hold:
    """One hold's watch: ``tokens`` (key bytes -> token) of ``lock``; reported lost once."""

    kind = "hold"

    def __init__(self, feed, lock, tokens, shared, deadline):
        self.feed = feed
        self.lock = lock
        self.tokens = tokens
        self.shared = shared
        #: time.monotonic() by which the hold is surely gone unless renewed; None: none known yet
        self.deadline = deadline
        self.floor = {key: -1 for key in tokens}  # messages up to this seq are already in a check
        self.checked = set()  # keys checked against LOCK.INFO since the watch began
        self.done = False

    def on_message(self, key, msg):
        """The loss ``msg`` reports for this hold (a lost_reason), or None."""
        if msg.seq <= self.floor[key]:
            return None
        mine = self.tokens[key]
        if msg.event in KEY_ENDS:
            return f"feed: {msg.event}"
        if msg.event in HOLD_ENDS and msg.token == mine:
            return f"feed: {msg.event}"
        if msg.event in GRANTS and not self.shared and msg.token != mine:
            return f"feed: {msg.event} to {text(msg.owner)!r}"
        return None

    def on_state(self, key, state, sent_at, claim=None):
        """``LOCK.INFO`` read at ``sent_at``: a lost_reason if this hold is not in it (``claim``'s,
        the message that made the feed read it, when there was one)."""
        self.checked.add(key)
        if state.seq is not None:
            self.floor[key] = max(self.floor[key], state.seq)
        for _owner, token, ttl in state.holders:
            if token == self.tokens[key]:
                if ttl > 0:
                    ttl_s = ttl / 1000
                    deadline = sent_at + ttl_s - margin(ttl_s)
                    self.deadline = deadline if self.deadline is None else max(self.deadline, deadline)
                return None
        return claim or "feed: not held (LOCK.INFO)"


class _Observer:
    """Leadership changes of one key, into ``put`` (a queue's put)."""

    kind = "observer"

    def __init__(self, feed, key, put):
        self.feed = feed
        self.key = key
        self.put = put
        self.leader = None
        self.floor = -1
        self.done = False
        self.reported = False  # a change was reported since observing (re)started

    def on_message(self, key, msg):
        """The change ``msg`` claims (a ``Change``, not yet reported: the state confirms it)."""
        if msg.seq <= self.floor:
            return None
        if msg.event in GRANTS:
            leader = Leader(text(msg.owner), msg.token)
        elif msg.event in KEY_ENDS or (msg.event in HOLD_ENDS and self.leader and msg.token == self.leader.term):
            leader = None
        else:
            return None
        if leader == self.leader:
            return None
        return Change(leader, False, msg.seq)

    def on_state(self, key, state, sent_at, claim=None):
        """The leader ``LOCK.INFO`` shows, as a ``Change`` when it is news: always the first
        time (observing started or the feed reconnected), else only when it differs from the
        last one reported. ``resync`` is False when it is what ``claim`` (a message) said."""
        if state.seq is not None:
            self.floor = max(self.floor, state.seq)
        # An election's key is exclusive: one holder at most.
        leader = Leader(text(state.holders[0][0]), state.holders[0][1]) if state.holders else None
        if self.reported and leader == self.leader:
            return None
        self.leader = leader
        self.reported = True
        confirmed = claim is not None and claim.leader == leader
        return Change(leader, not confirmed, state.seq)


# --- decisions ------------------------------------------------------------------------


class _Core:
    """The feed's tables and decisions, no I/O. Callers hold ``mutex`` (sync) or run on the loop."""

    def __init__(self):
        self.mutex = threading.Lock()
        self.subs = {}  # key -> [subscriber]
        self.channel_key = {}  # channel bytes -> key bytes (on the current connections)
        self.watched = set()  # keys watched and subscribed on the current connections
        self.seq = {}  # key -> last seq applied; None: waiting for the subscription to be confirmed
        self.baseline = set()  # keys whose LOCK.INFO showed no seq: the next message sets it
        self.unchecked = set()  # subscribers to check against LOCK.INFO once their key is synced
        self.unsupported = None  # the error LOCK.WATCH answered, when the server has no feed
        self.claims = {}  # key -> {sub: effect} messages claimed, until the state read confirms
        self.recent = {}  # key -> {seq: message bytes} applied since the last state read

    def add(self, sub, keys):
        for key in keys:
            self.subs.setdefault(key, []).append(sub)
        self.unchecked.add(sub)

    def remove(self, sub):
        sub.done = True
        self.unchecked.discard(sub)
        for claims in self.claims.values():
            claims.pop(sub, None)
        for key, subs in list(self.subs.items()):
            if sub in subs:
                subs.remove(sub)
                if not subs:
                    del self.subs[key]

    def plan(self):
        """``(to_watch, to_unwatch, to_check)``: keys to WATCH and SSUBSCRIBE, keys nobody wants
        any more, and ``(key, [subs])`` to check with LOCK.INFO now (their key is synced)."""
        to_watch = [k for k in self.subs if k not in self.watched]
        to_unwatch = [k for k in self.watched if k not in self.subs]
        checks = {}
        for sub in list(self.unchecked):
            keys = [k for k in self.subs if sub in self.subs[k]]
            if all(self.seq.get(k) is not None or k in self.baseline for k in keys):
                self.unchecked.discard(sub)
                for k in keys:
                    checks.setdefault(k, []).append(sub)
        return to_watch, to_unwatch, list(checks.items())

    def watching(self, key, channel):
        self.watched.add(key)
        self.channel_key[channel] = key
        self.seq[key] = None

    def unwatching(self, key):
        self.watched.discard(key)
        self.seq.pop(key, None)
        self.baseline.discard(key)
        self.claims.pop(key, None)
        self.recent.pop(key, None)
        for channel, k in list(self.channel_key.items()):
            if k == key:
                del self.channel_key[channel]

    def refused(self, key, error):
        """LOCK.WATCH answered an error: the key's subscribers are dropped (holders silently:
        their watchdog still reports; observers get the error)."""
        effects = []
        for sub in list(self.subs.get(key, ())):
            self.remove(sub)
            if sub.kind == "observer":
                effects.append((sub, error))
        return effects

    def confirmed(self, channel):
        """The subscription to ``channel`` took effect: the key to resynchronise, or None."""
        return self.channel_key.get(channel)

    def message(self, channel, data):
        """A published message: ``(effects, key_to_resync)``. ``effects`` is always empty: what a
        message claims is kept in ``claims`` and reported by ``synced`` once the state read
        (``key_to_resync``) confirms it."""
        key = self.channel_key.get(channel)
        if key is None:
            return [], None
        try:
            msg = parse_message(data)
        except ValueError:
            log.warning("redislock_native: ignoring a malformed feed message on %r: %r", channel, data)
            return [], None
        last = self.seq.get(key)
        if key in self.baseline:
            self.baseline.discard(key)
        elif last is None:
            return [], None  # not synced yet: the LOCK.INFO that will sync it covers this one
        elif msg.seq <= last:
            seen = self.recent.get(key, {}).get(msg.seq)
            if seen is None or seen == data:
                return [], None  # already in a LOCK.INFO read since
            # Two messages with one seq: one of them was not the server's. Read the state.
            self._claim(key, msg)
            return [], key
        elif msg.seq > last + 1:
            return [], key  # messages were lost (or a forged one skipped ahead): read the state
        self.seq[key] = msg.seq
        recent = self.recent.setdefault(key, {})
        recent[msg.seq] = bytes(data)
        if len(recent) > RECENT:
            del recent[min(recent)]
        return [], (key if self._claim(key, msg) else None)

    def _claim(self, key, msg):
        """Keep what ``msg`` claims for each subscriber of ``key``; True if it claims anything."""
        claimed = False
        for sub in list(self.subs.get(key, ())):
            if sub in self.unchecked:
                continue  # its check reads the state after this
            effect = sub.on_message(key, msg)
            if effect is not None:
                self.claims.setdefault(key, {}).setdefault(sub, effect)
                claimed = True
        return claimed

    def synced(self, key, state, sent_at, subs=None):
        """The ``State`` of ``key`` read at ``sent_at``; ``subs``: only those (a new subscriber's
        check), else every subscriber of the key and the key's seq (a resynchronisation)."""
        claims = {}
        if subs is None:
            subs = list(self.subs.get(key, ()))
            claims = self.claims.pop(key, {})
            self.recent.pop(key, None)
            if state.seq is None:
                self.baseline.add(key)
                self.seq[key] = -1
            else:
                self.baseline.discard(key)
                self.seq[key] = state.seq
            for sub in subs:
                self.unchecked.discard(sub)
        effects = []
        for sub in subs:
            if sub.done:
                continue
            effect = sub.on_state(key, state, sent_at, claims.get(sub))
            if effect is not None:
                effects.append((sub, effect))
                if sub.kind == "hold":
                    self.remove(sub)
        return effects

    def disconnected(self, error):
        """Both connections are gone: every hold is lost; observers wait for the resync."""
        self.watched.clear()
        self.channel_key.clear()
        self.seq.clear()
        self.baseline.clear()
        self.claims.clear()
        self.recent.clear()
        effects = []
        for subs in list(self.subs.values()):
            for sub in list(subs):
                if sub.kind == "hold" and not sub.done:
                    self.remove(sub)
                    effects.append((sub, f"feed connection lost: {error!r}"))
                elif sub.kind == "observer":
                    sub.reported = False  # its resync is reported, changed or not
                    sub.floor = -1  # the new watch's seq starts again from 0
                    self.unchecked.add(sub)
        return effects

    def take(self, keys=None):
        """Remove and return the subscribers of ``keys`` (every key when None) for another feed
        to adopt (a failover moved their slot), and forget what the current connections knew
        of those keys."""
        taken = []
        for key in list(self.subs) if keys is None else keys:
            for sub in list(self.subs.get(key, ())):
                if sub not in taken:
                    taken.append(sub)
                    self.remove(sub)
        for key in list(self.watched) if keys is None else keys:
            self.unwatching(key)
        return taken

    def holds(self):
        return {s for subs in self.subs.values() for s in subs if s.kind == "hold"}

    def next_deadline(self):
        deadlines = [h.deadline for h in self.holds() if h.deadline is not None]
        return min(deadlines) if deadlines else None

    def expired(self, now):
        effects = []
        for hold in self.holds():
            if hold.deadline is not None and hold.deadline <= now:
                self.remove(hold)
                effects.append((hold, "deadline passed: no renewal succeeded"))
        return effects


def _keys(tokens):
    return {(k.encode() if isinstance(k, str) else bytes(k)): t for k, t in tokens.items()}


def _key(key):
    return key.encode() if isinstance(key, str) else bytes(key)


def _connection_kwargs(kwargs, name):
    """A feed connection's arguments: the client's, with nothing that could replace its socket,
    RESP2 (a subscribed connection receives plain arrays), bytes and a name. redis-py 8's
    maintenance notifications need RESP3: off on these two (``None``, as for a RESP2 client)."""
    kwargs = {k: (None if "maint_notifications" in k else v) for k, v in kwargs.items()}
    return dict(
        kwargs,
        retry=Retry(NoBackoff(), 0),
        health_check_interval=0,
        protocol=2,
        decode_responses=False,
        client_name=name,
    )


def _state_commands(key):
    """The key's state and seq in one atomic step: ``LOCK.INFO`` is nil for a free key (no seq
    there), while ``LOCK.WATCH`` (again: a connection watches a key once) answers the seq."""
    return [("MULTI",), ("LOCK.WATCH", key), ("LOCK.INFO", key), ("EXEC",)]


#: The state of a key on a server that answered ``READONLY``: a replica now (``demoted``), where
#: no hold of this feed's is kept.
REPLICA = State(None, [])


def _state_of(replies):
    """The four replies to ``_state_commands`` (values, or the ``ResponseError`` read in place of
    one) as a ``State``: ``REPLICA`` when the server refused ``LOCK.WATCH`` as a replica."""
    for reply in replies:
        if isinstance(reply, ReadOnlyError) or (isinstance(reply, ResponseError) and str(reply).startswith("READONLY")):
            return REPLICA
    for reply in replies:
        if isinstance(reply, ResponseError):
            raise reply
    return _state(replies[3])


def _state(exec_reply):
    """``EXEC``'s reply to ``_state_commands`` as a ``State``."""
    if exec_reply is None:
        raise ResponseError("EXEC of the feed's state read was aborted")
    for item in exec_reply:
        if isinstance(item, Exception):
            raise item
    (_channel, seq), info = exec_reply
    return parse_info(info)._replace(seq=int(seq))


def _channel_of(reply):
    channel, seq = reply
    return channel, seq


def _is_unknown_command(error):
    return "unknown command" in str(error).lower()


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
            weakref.finalize(client, feed.close)
        if cluster is not None and feed._cluster is None:
            feed._cluster = weakref.ref(cluster)
        return feed




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
