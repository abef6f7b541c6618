'use strict';
// The change feed (LOCK.WATCH): a holder hears of its loss at once, an observer of each change.
// The same design as the Python package's feed.py and the Rust crate's hold.rs.
//
// The server publishes every change of a watched lock key to a sharded pub/sub channel of that
// key (`lock.feed:{TAG}:DB:KEY`) as one string, `SEQ EVENT TOKEN TTL OWNER`, while at least one
// connection watches the key (`LOCK.WATCH key` answers `[channel, seq]`). SEQ grows by 1 per
// message of the key: a gap means lost messages. The state and its seq are read in one step,
// `MULTI; LOCK.WATCH; LOCK.INFO; EXEC` (LOCK.INFO is nil for a free key, with no seq to show).
//
// One Feed per server a client talks to (`feedFor`; with an ioredis Cluster, one per master:
// the channel lives on the key's shard), shared by every hold and observer of that client: two
// dedicated connections (lib/adapter.js: never reconnected, nothing re-sent), the *watch*
// connection (LOCK.WATCH, LOCK.UNWATCH, state reads; the server ends its watches when it closes)
// and the *pub/sub* connection (SSUBSCRIBE). They open with the first subscriber and close
// IDLE_CLOSE_MS after the last one left.
//
// Two kinds of subscriber:
// - a hold (a lock with `onLost`, lib/lock.js): reported lost once, when a message says the
//   server ended it, when its own conservative deadline passes with no renewal, or when either
//   connection is lost (fail-safe: nothing would tell it any more);
// - an observer (Election.observe()): every change of the key's exclusive holder, null for
//   "nobody". After a gap in SEQ, or a reconnect, the state is read again and reported with
//   `resync: true`.
// A new subscriber is checked against the state as soon as its key is watched and subscribed, so
// a loss between the grant and the watch is reported too.
//
// A message is a claim, never proof: anyone allowed to SPUBLISH on the channel can publish one
// (SECURITY.md). A message that would report a loss or a new leader makes the feed read the
// state (the same MULTI; LOCK.WATCH; LOCK.INFO; EXEC as after a gap), and what is reported is
// what that read shows: a hold is lost only when LOCK.INFO no longer shows its token (or the
// server answers READONLY: a replica now), an observer reports the leader LOCK.INFO shows and
// nothing when it is the one it reported last; the message's words (the loss reason,
// `resync: false`) only when the state agrees. A second message with a seq already applied
// means one of the two was forged: the state is read then too. A real change costs one round
// trip more than the message alone; a forged one a read, and nothing is reported. Messages that arrive while a read of
// the state is in flight are kept and applied after it (the two connections are two sockets: a
// message published after the read may arrive before the read's reply).

const { adapt } = require('./adapter');
const { movedAway } = require('./wire');

/** ms the connections stay open after the last subscriber left (a lock taken again reuses them). */
const IDLE_CLOSE_MS = 2000;
/** The longest wait before reconnecting after the connections failed (for observers). */
const MAX_BACKOFF_MS = 1000;
/**
 * How long a subscriber whose key's slot left its node (a cluster failover) looks for the slot's
 * master before it is given up: a hold is then reported lost, an observer gets the error.
 */
const HANDOVER_PATIENCE_MS = 30000;
/** ms between two looks at the slot table while handing subscribers over: 50, doubled up to 250. */
const HANDOVER_RETRY_MS = 250;

/** Events that end the hold whose token they carry. */
const HOLD_ENDS = new Set(['released', 'expired', 'lost']);
/** Events about the whole key (owner empty, token 0): every hold of it ended. */
const KEY_ENDS = new Set(['deleted', 'flushed', 'swapped', 'demoted']);
/** A new token was granted (handoff: in the same step as a hold ended). */
const GRANTS = new Set(['acquired', 'handoff']);
/** Messages of a key remembered since its last state read, to tell a second one with a seq. */
const RECENT = 64;
/** The state of a key on a server that answered READONLY: a replica now, holding none of ours. */
const REPLICA = Object.freeze({ seq: null, holders: [] });

/** `SEQ EVENT TOKEN TTL OWNER` as {seq, event, token, ttl, owner}; null if malformed. */
function parseMessage(data) {
  const text = Buffer.isBuffer(data) ? data.toString() : String(data);
  const m = /^(\d+) (\S+) (\d+) (-?\d+)(?: ([\s\S]*))?$/.exec(text);
  if (m === null) return null;
  return { seq: Number(m[1]), event: m[2], token: Number(m[3]), ttl: Number(m[4]), owner: m[5] || '' };
}

function pairs(reply) {
  if (reply instanceof Map) return Object.fromEntries(reply);
  if (!Array.isArray(reply)) return { ...reply };
  const out = {};
  for (let i = 0; i < reply.length; i += 2) out[String(reply[i])] = reply[i + 1];
  return out;
}

/** LOCK.INFO's reply as {seq, holders: [{owner, token, ttl}]} (nil: no holder, no seq). */
function parseInfo(reply) {
  if (reply === null || reply === undefined) return { seq: null, holders: [] };
  const f = pairs(reply);
  const holders = [];
  if (Array.isArray(f.holders)) {
    for (const entry of f.holders) {
      const h = pairs(entry);
      holders.push({ owner: h.owner === undefined ? '' : String(h.owner), token: Number(h.token), ttl: Number(h.ttl || 0) });
    }
  } else if (f.token !== undefined && f.token !== null && f.owner !== undefined) {
    holders.push({ owner: String(f.owner), token: Number(f.token), ttl: Number(f.ttl || 0) });
  }
  return { seq: f.seq === undefined || f.seq === null ? null : Number(f.seq), holders };
}

/** How much earlier than `sent + ttl` a holder counts its hold gone: clock rates differ. */
function margin(ttlMs) {
  return Math.max(2, ttlMs * 0.01);
}

const now = () => performance.now();

// --- subscribers ---------------------------------------------------------------------------

/** One hold's watch: `tokens` (key -> token) of `lock`; reported lost once. */
class Hold {
  constructor(feed, lock, tokens, shared, deadline) {
    this.kind = 'hold';
    this.feed = feed;
    this.lock = lock;
    this.tokens = tokens;
    this.shared = shared;
    this.deadline = deadline; // performance.now() by which it is surely gone unless renewed
    this.floor = new Map([...tokens.keys()].map((k) => [k, -1]));
    this.timer = null;
    this.done = false;
    this.pending = [];
    this.checked = new Set(); // keys checked against LOCK.INFO since the watch began
  }

  keys() {
    return [...this.tokens.keys()];
  }

  onMessage(key, msg) {
    if (msg.seq <= this.floor.get(key)) return null;
    const mine = this.tokens.get(key);
    if (KEY_ENDS.has(msg.event)) return `feed: ${msg.event}`;
    if (HOLD_ENDS.has(msg.event) && msg.token === mine) return `feed: ${msg.event}`;
    if (GRANTS.has(msg.event) && !this.shared && msg.token !== mine) {
      return `feed: ${msg.event} to ${JSON.stringify(msg.owner)}`;
    }
    return null;
  }

  /** A loss reason if `state` (read at `sentAt`) lacks this hold: `claim`'s, when a message claimed it. */
  onState(key, state, sentAt, claim) {
    this.checked.add(key);
    if (state.seq !== null) this.floor.set(key, Math.max(this.floor.get(key), state.seq));
    for (const h of state.holders) {
      if (h.token === this.tokens.get(key)) {
        if (h.ttl > 0) this.feed.renewed(this, sentAt, h.ttl);
        return null;
      }
    }
    return claim || 'feed: not held (LOCK.INFO)';
  }
}

/** Leadership changes of one key, as an async queue of {leader, resync, seq}. */
class Observer {
  constructor(feed, key) {
    this.kind = 'observer';
    this.feed = feed;
    this.key = key;
    this.leader = null;
    this.floor = -1;
    this.reported = false; // a change was reported since observing (re)started
    this.done = false;
    this.pending = [];
    this.queue = [];
    this.waiting = [];
  }

  keys() {
    return [this.key];
  }

  onMessage(_key, msg) {
    if (msg.seq <= this.floor) return null;
    let leader;
    if (GRANTS.has(msg.event)) leader = { value: msg.owner, term: msg.token };
    else if (KEY_ENDS.has(msg.event) || (HOLD_ENDS.has(msg.event) && this.leader && msg.token === this.leader.term)) {
      leader = null;
    } else return null;
    if (sameLeader(leader, this.leader)) return null;
    return { leader, resync: false, seq: msg.seq }; // a claim: the state read confirms it
  }

  /**
   * The leader `state` shows, as a change when it is news: always the first time (observing
   * began, or the feed reconnected), else only when it differs from the last one reported.
   * `resync` is false when it is what `claim` (a message's change) said.
   */
  onState(_key, state, _sentAt, claim) {
    if (state.seq !== null) this.floor = Math.max(this.floor, state.seq);
    // An election's key is exclusive: one holder at most.
    const h = state.holders[0];
    const leader = h === undefined ? null : { value: h.owner, term: h.token };
    if (this.reported && sameLeader(leader, this.leader)) return null;
    this.leader = leader;
    this.reported = true;
    const confirmed = claim !== undefined && sameLeader(claim.leader, leader);
    return { leader, resync: !confirmed, seq: state.seq };
  }

  push(item) {
    const w = this.waiting.shift();
    if (w !== undefined) w(item);
    else this.queue.push(item);
  }

  /** The next change (or the error that ended the observation). */
  next() {
    if (this.queue.length > 0) return Promise.resolve(this.queue.shift());
    return new Promise((resolve) => this.waiting.push(resolve));
  }
}

function sameLeader(a, b) {
  return a === null ? b === null : b !== null && a.term === b.term && a.value === b.value;
}

// --- the feed ------------------------------------------------------------------------------

const feeds = new WeakMap();

/**
 * The Feed of the server that serves `key` for `client` (made on first use). With a cluster
 * client it is the feed of the key's master now, and it follows a failover (`_handOver`).
 */
function feedFor(client, key) {
  const adapter = adapt(client);
  const node = adapter.nodeClient(key);
  let feed = feeds.get(node);
  if (feed === undefined) {
    feed = new Feed(adapt(node), adapter.isCluster ? adapter : null);
    feeds.set(node, feed);
  }
  return feed;
}

let ids = 0;

class Feed {
  /** `adapter`: the node's; `cluster`: the cluster client's adapter when the node is a cluster's. */
  constructor(adapter, cluster = null) {
    this._adapter = adapter;
    this._cluster = cluster;
    this.id = `${process.pid}-${++ids}`;
    this._subs = new Map(); // key -> Set of subscribers
    this._keys = new Map(); // key watched on the current connections -> {channel, seq, pending}
    this._channels = new Map(); // channel -> key
    this._unchecked = new Set(); // subscribers to check against the state once their key is synced
    this._conns = null; // {watch, sub, generation}
    this._generation = 0;
    this._chain = Promise.resolve();
    this._idleTimer = null;
    this._retryTimer = null;
    this._backoff = 0;
    this.unsupported = null; // the error LOCK.WATCH answered when the server has no feed
  }

  /** Watch `tokens` (Map key -> token) of `lock` until `drop`; null if the server has no feed. */
  hold(lock, tokens, shared, deadline) {
    if (this.unsupported !== null) return null;
    const hold = new Hold(this, lock, tokens, shared, null);
    if (deadline !== null) this.renewed(hold, deadline.sentAt, deadline.ttl);
    this._add(hold);
    return hold;
  }

  /** An Observer of `key`. */
  observe(key) {
    const observer = new Observer(this, key);
    if (this.unsupported !== null) {
      observer.push(this.unsupported);
      return observer;
    }
    this._add(observer);
    return observer;
  }

  drop(sub) {
    this._remove(sub);
    this._kick();
  }

  /** A renewal sent at `sentAt` (performance.now()) succeeded: the hold lasts `ttl` ms from then. */
  renewed(hold, sentAt, ttl) {
    if (hold.done) return;
    const deadline = sentAt + ttl - margin(ttl);
    if (hold.deadline !== null && deadline <= hold.deadline) return;
    hold.deadline = deadline;
    clearTimeout(hold.timer);
    hold.timer = setTimeout(() => {
      if (hold.done) return;
      const feed = hold.feed; // this one, or the one it was handed over to after a failover
      feed._remove(hold);
      feed._kick();
      feed._report(hold, 'deadline passed: no renewal succeeded');
    }, Math.max(0, deadline - now()));
    hold.timer.unref();
  }

  _add(sub) {
    for (const key of sub.keys()) {
      if (!this._subs.has(key)) this._subs.set(key, new Set());
      this._subs.get(key).add(sub);
    }
    this._unchecked.add(sub);
    this._kick();
  }

  _remove(sub) {
    sub.done = true;
    clearTimeout(sub.timer);
    this._unchecked.delete(sub);
    for (const key of sub.keys()) {
      const set = this._subs.get(key);
      if (set === undefined) continue;
      set.delete(sub);
      if (set.size === 0) this._subs.delete(key);
    }
  }

  /** Run one reconcile after whatever step is in flight (every I/O step runs in `_chain`). */
  _kick() {
    this._chain = this._chain.then(() => this._reconcile()).catch((error) => this._disconnected(error));
  }

  _report(sub, effect) {
    try {
      if (sub.kind === 'hold') sub.lock._feedLost(sub, effect);
      else sub.push(effect);
    } catch {
      // a throwing callback must not stop the others
    }
  }

  async _connect() {
    const generation = ++this._generation;
    const watch = await this._adapter.dedicated(undefined, `redislock-feed-watch-${this.id}`);
    let sub;
    try {
      sub = await this._adapter.dedicated(undefined, `redislock-feed-sub-${this.id}`);
    } catch (error) {
      watch.close();
      throw error;
    }
    const conns = { watch, sub, generation, closing: false };
    const lost = (error) => {
      // Checked again in the chain: a reconnect may have come first.
      const current = () => !conns.closing && this._conns === conns;
      if (!current()) return;
      this._chain = this._chain.then(() => (current() ? this._disconnected(error) : undefined));
    };
    watch.onClose(lost);
    sub.onClose(lost);
    if (this._cluster !== null && typeof sub.onUnsubscribed === 'function') {
      sub.onUnsubscribed((channel) => {
        if (!conns.closing && this._conns === conns) this._slotLeft(channel);
      });
    }
    this._conns = conns;
    return conns;
  }

  _close() {
    const conns = this._conns;
    this._conns = null;
    this._keys.clear();
    this._channels.clear();
    if (conns !== null) {
      conns.closing = true;
      conns.watch.close();
      conns.sub.close();
    }
  }

  /**
   * Both connections are gone (or unusable): every hold is lost; observers wait for a resync. In
   * a cluster a lost connection (or MOVED, READONLY) is a failover until shown otherwise: every
   * subscriber is handed over to its key's master now (`_handOver`), where LOCK.INFO decides.
   */
  _disconnected(error) {
    if (this._conns === null && this._keys.size === 0 && error === undefined) return;
    this._close();
    if (this._following(error)) {
      this._handOver(this._take([...this._subs.keys()]), error);
      return;
    }
    const message = error && error.message ? error.message : String(error);
    for (const set of [...this._subs.values()]) {
      for (const sub of [...set]) {
        if (sub.done) continue;
        if (sub.kind === 'hold') {
          this._remove(sub);
          this._report(sub, `feed connection lost: ${message}`);
        } else {
          sub.reported = false; // its resync is reported, changed or not
          sub.floor = -1; // the new watch's seq starts again from 0
          this._unchecked.add(sub);
        }
      }
    }
    if (this._subs.size > 0 && this._retryTimer === null) {
      this._backoff = Math.min(MAX_BACKOFF_MS, this._backoff * 2 || 50);
      this._retryTimer = setTimeout(() => {
        this._retryTimer = null;
        this._kick();
      }, this._backoff);
    }
  }

  /** Watch and subscribe what is wanted, unwatch what is not, check new subscribers. */
  async _reconcile() {
    clearTimeout(this._idleTimer);
    this._idleTimer = null;
    if (this._subs.size === 0) {
      if (this._conns !== null) {
        for (const key of [...this._keys.keys()]) await this._unwatch(key);
        this._idleTimer = setTimeout(() => {
          this._chain = this._chain.then(() => {
            if (this._subs.size === 0) this._close();
          });
        }, IDLE_CLOSE_MS);
        this._idleTimer.unref();
      }
      return;
    }
    if (this._retryTimer !== null) return; // reconnecting later
    if (this._conns === null) await this._connect();
    this._backoff = 0;
    for (const key of [...this._subs.keys()]) {
      if (!this._keys.has(key)) await this._watch(key);
    }
    for (const key of [...this._keys.keys()]) {
      if (!this._subs.has(key)) await this._unwatch(key);
    }
    // Subscribers of keys synced already: check each against a state read of its own.
    for (const sub of [...this._unchecked]) {
      if (sub.done || !sub.keys().every((k) => this._keys.has(k) && this._keys.get(k).seq !== null)) continue;
      this._unchecked.delete(sub);
      for (const key of sub.keys()) {
        if (sub.done) break;
        await this._sync(key, [sub]);
      }
      this._replay(sub);
    }
  }

  async _watch(key) {
    const { watch, sub } = this._conns;
    let reply;
    try {
      reply = await watch.call(['LOCK.WATCH', key]);
    } catch (error) {
      if (this._conns !== null && this._conns.watch !== watch) return;
      if (this._following(error)) return this._handOver(this._take([key]), error);
      if (/unknown command/i.test(String(error.message))) this.unsupported = error;
      if (!/^(ERR|WRONGTYPE)/.test(String(error.message)) && this.unsupported === null) throw error;
      // Refused: holders are dropped silently (the watchdog or session still reports),
      // observers get the error.
      for (const s of [...(this._subs.get(key) || [])]) {
        this._remove(s);
        if (s.kind === 'observer') s.push(error);
      }
      return;
    }
    const channel = String(reply[0]);
    // claims: subscriber -> what a message claimed, until a state read confirms it;
    // recent: seq -> message of those applied since the last state read.
    this._keys.set(key, { channel, seq: null, pending: [], claims: new Map(), recent: new Map() });
    this._channels.set(channel, key);
    try {
      await sub.subscribe(channel, (ch, data) => this._message(String(ch), data));
    } catch (error) {
      if (!this._following(error) || this._keys.get(key) === undefined) throw error;
      return this._handOver(this._take([key]), error);
    }
    await this._sync(key);
  }

  async _unwatch(key) {
    const state = this._keys.get(key);
    this._keys.delete(key);
    if (state === undefined) return;
    this._channels.delete(state.channel);
    await this._conns.watch.call(['LOCK.UNWATCH', key]);
    await this._conns.sub.unsubscribe(state.channel);
  }

  /**
   * Read `key`'s state. `only`: check those subscribers; else every subscriber of the key, whose
   * seq it sets (the first read after the watch, or a resynchronisation).
   */
  async _sync(key, only) {
    const st = this._keys.get(key);
    if (st === undefined) return;
    if (only === undefined && st.pending === null) {
      st.seq = null;
      st.pending = [];
    }
    const sentAt = now();
    const { watch } = this._conns;
    const replies = [
      watch.call(['MULTI']),
      watch.call(['LOCK.WATCH', key]),
      watch.call(['LOCK.INFO', key]),
      watch.call(['EXEC']),
    ];
    const state = stateOf(await Promise.allSettled(replies));
    if (this._keys.get(key) !== st) return;
    if (state === REPLICA && this._cluster !== null) {
      // A cluster node that turned replica: the slot has a new master, where the holds are (a
      // failover keeps them) and the key's feed now is.
      return this._handOver(this._take([key]), new Error('READONLY the node is a replica now'));
    }
    const subs = only !== undefined ? only : [...(this._subs.get(key) || [])];
    let claims = new Map();
    if (only === undefined) {
      st.seq = state.seq === null ? 0 : state.seq;
      claims = st.claims;
      st.claims = new Map();
      st.recent = new Map();
      for (const sub of subs) this._unchecked.delete(sub);
    }
    for (const sub of subs) {
      if (sub.done) continue;
      sub.followUntil = undefined; // on its key's master: a hand-over (if any) is complete
      const effect = sub.onState(key, state, sentAt, claims.get(sub));
      if (effect !== null) {
        if (sub.kind === 'hold') this._remove(sub);
        this._report(sub, effect);
      }
    }
    if (only === undefined) {
      const pending = st.pending;
      st.pending = null;
      for (const data of pending) this._message(st.channel, data);
      for (const sub of subs) this._replay(sub);
    }
  }

  /** Messages a subscriber missed while it waited for its check, applied now. */
  _replay(sub) {
    const pending = sub.pending;
    sub.pending = [];
    for (const [key, msg] of pending) {
      if (sub.done) return;
      this._apply(sub, key, msg);
    }
  }

  /** What `msg` claims for `sub` is kept, and the state read to confirm it. */
  _apply(sub, key, msg) {
    const claim = sub.onMessage(key, msg);
    if (claim === null) return;
    const st = this._keys.get(key);
    if (st === undefined) return;
    if (!st.claims.has(sub)) st.claims.set(sub, claim);
    this._resync(key, st);
  }

  /** Read `key`'s state again (unless a read is on its way); messages meanwhile wait for it. */
  _resync(key, st) {
    if (st.pending !== null) return;
    st.seq = null;
    st.pending = [];
    this._chain = this._chain
      .then(() => (this._keys.get(key) === st ? this._sync(key) : undefined))
      .catch((error) => this._disconnected(error));
  }

  // --- a failover in a cluster (issue 34) ---

  /** Whether `error` on this feed's node means its slots may have moved (in a cluster). */
  _following(error) {
    return this._cluster !== null && error !== undefined && movedAway(error);
  }

  /** The server unsubscribed `channel` unasked (a planned CLUSTER FAILOVER): its key moved. */
  _slotLeft(channel) {
    const key = this._channels.get(channel);
    if (key === undefined) return;
    this._handOver(this._take([key]), new Error(`sunsubscribe: the slot of ${JSON.stringify(key)} left this node`));
  }

  /**
   * Take every subscriber of `keys` out of this feed (not ended: its deadline timer runs on) and
   * forget those keys here. Nothing is sent: the node may be a replica now, or dead; its watches
   * end with the connections.
   */
  _take(keys) {
    const taken = new Set();
    for (const key of keys) for (const sub of this._subs.get(key) || []) taken.add(sub);
    for (const sub of taken) {
      this._unchecked.delete(sub);
      for (const key of sub.keys()) {
        const set = this._subs.get(key);
        if (set === undefined) continue;
        set.delete(sub);
        if (set.size === 0) this._subs.delete(key);
      }
    }
    for (const key of keys) {
      if (this._subs.has(key)) continue;
      const st = this._keys.get(key);
      if (st === undefined) continue;
      this._keys.delete(key);
      this._channels.delete(st.channel);
    }
    if (taken.size > 0) this._kick(); // idle-close the connections if nothing is left here
    return [...taken];
  }

  /**
   * Give `subs` (taken from this feed) to the feeds of their keys' masters now, once the slot
   * table names one: there each is a new subscriber, checked against LOCK.INFO, so a hold is
   * reported lost only if the new master lacks its token, and an observer reports the leader
   * there (`resync: true`). Given up after HANDOVER_PATIENCE_MS without a master.
   */
  _handOver(subs, error) {
    subs = subs.filter((s) => !s.done);
    if (subs.length === 0) return;
    const start = now();
    for (const sub of subs) if (sub.followUntil === undefined) sub.followUntil = start + HANDOVER_PATIENCE_MS;
    const cluster = this._cluster;
    const run = async () => {
      let pending = subs;
      let first = true;
      let last = error;
      let pause = 50;
      while (pending.length > 0) {
        await cluster.refresh(pending[0].keys()[0]);
        const left = [];
        for (const sub of pending) {
          if (sub.done) continue;
          let found;
          try {
            found = feedFor(cluster.client, sub.keys()[0]);
          } catch (e) {
            last = e; // no master known for the slot yet
            left.push(sub);
            continue;
          }
          if (found === this && first) {
            left.push(sub); // the table still names this node: look again once (not decided yet?)
            continue;
          }
          found._adopt(sub);
        }
        pending = left;
        first = false;
        const t = now();
        for (const sub of pending.filter((s) => t >= s.followUntil)) {
          sub.done = true;
          clearTimeout(sub.timer);
          const message = last && last.message ? last.message : String(last);
          this._report(sub, sub.kind === 'hold' ? `feed connection lost: ${message}` : last);
        }
        pending = pending.filter((s) => !s.done);
        if (pending.length > 0) await new Promise((resolve) => setTimeout(resolve, pause));
        pause = Math.min(HANDOVER_RETRY_MS, pause * 2);
      }
    };
    run().catch(() => {});
  }

  /** `sub`, handed over by another feed, subscribes here and is checked as a new subscriber. */
  _adopt(sub) {
    sub.feed = this;
    sub.pending = [];
    if (sub.kind === 'hold') {
      sub.floor = new Map(sub.keys().map((k) => [k, -1]));
      sub.checked = new Set();
    } else {
      sub.floor = -1; // the new master's watch numbers from its own seq
      sub.reported = false; // its resync is reported, changed or not
    }
    if (this.unsupported !== null) {
      sub.done = true;
      clearTimeout(sub.timer);
      this._report(sub, sub.kind === 'hold' ? `feed connection lost: ${this.unsupported.message}` : this.unsupported);
      return;
    }
    this._add(sub);
  }

  _message(channel, data) {
    const key = this._channels.get(channel);
    if (key === undefined) return;
    const st = this._keys.get(key);
    if (st.pending !== null) {
      st.pending.push(data); // a state read is in flight: after it
      return;
    }
    const msg = parseMessage(data);
    if (msg === null) return;
    const text = Buffer.isBuffer(data) ? data.toString('latin1') : String(data);
    if (msg.seq <= st.seq) {
      const seen = st.recent.get(msg.seq);
      if (seen === undefined || seen === text) return; // already in a state read since
      // Two messages with one seq: one was not the server's. Read the state.
      for (const sub of [...(this._subs.get(key) || [])]) {
        if (!sub.done && !this._unchecked.has(sub)) this._apply(sub, key, msg);
      }
      this._resync(key, st);
      return;
    }
    if (msg.seq > st.seq + 1) {
      // Messages were lost (or a forged one skipped ahead): read the state again (and keep what
      // arrives meanwhile). This one is in that read: the server published it before it runs
      // the read sent after it.
      this._resync(key, st);
      return;
    }
    st.seq = msg.seq;
    st.recent.set(msg.seq, text);
    if (st.recent.size > RECENT) st.recent.delete(st.recent.keys().next().value);
    for (const sub of [...(this._subs.get(key) || [])]) {
      if (sub.done) continue;
      if (this._unchecked.has(sub)) sub.pending.push([key, msg]);
      else this._apply(sub, key, msg);
    }
  }
}

/**
 * The four replies to the state read (`Promise.allSettled`) as {seq, holders}; REPLICA when the
 * server refused LOCK.WATCH as a replica (READONLY: it was demoted).
 */
function stateOf(settled) {
  const errors = settled.filter((r) => r.status === 'rejected').map((r) => r.reason);
  if (errors.some((e) => /^READONLY/.test(String(e && e.message)))) return REPLICA;
  if (errors.length > 0) throw errors[0];
  const exec = settled[3].value;
  if (!Array.isArray(exec)) throw new Error('EXEC of the feed\'s state read was aborted');
  for (const item of exec) if (item instanceof Error) throw item;
  return { ...parseInfo(exec[1]), seq: Number(exec[0][1]) };
}

module.exports = { feedFor, Feed, Hold, Observer, parseMessage, parseInfo, stateOf, REPLICA, margin, IDLE_CLOSE_MS };
