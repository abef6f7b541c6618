"""The change feed's decisions and wire shapes, with no I/O of their own: the messages and
states parsed, the subscribers (``_Hold``, ``_Observer``) and ``_Core``, which decides what each
message or state read means for them. Shared by the sync driver (``feed.py``, a thread) and the
asyncio one (``feed_aio.py``, a task); ``feed.py`` says what the feed does and re-exports these.
"""

import collections
import itertools
import logging
import threading
import time

from redis.backoff import NoBackoff
from redis.exceptions import ReadOnlyError, ResponseError
from redis.retry import Retry

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
