'use strict';
// How commands reach the server, for each kind of client the user can pass in.
//
// Most commands go through the user's own client as usual, with its timeouts and retries. A
// blocking acquire (LOCK.ACQUIRE ... BLOCK) cannot: a command timeout would cut the wait, and a
// client that re-sends unanswered commands after a reconnect (ioredis's default,
// autoResendUnfulfilledCommands) would put the waiter back at the end of the server's queue. So
// every wait gets a connection of its own: a duplicate of the user's client (of the one node that
// owns the key, for a cluster) with no command timeout, no reconnection and no re-sending, closed
// when the wait ends.
//
// Supported: ioredis 5 and 6 (`Redis` and `Cluster`), node-redis 4 and 5 (`createClient` and
// `createCluster`). Every adapter has `call(args, key)` (through the user's client; `key` routes
// it in a node-redis cluster, which needs the first key of every command) and `callOnKey(key,
// args)` (on the connection of the node that owns `key`).

const { slotOf } = require('./slot');

/** A short, recognisable name for the client kinds in error messages and tests. */
const IOREDIS = 'ioredis';
const IOREDIS_CLUSTER = 'ioredis-cluster';
const NODE_REDIS = 'node-redis';
const NODE_REDIS_CLUSTER = 'node-redis-cluster';

/** What `adapt` makes of one user client, cached so that every lock on it shares one. */
const cache = new WeakMap();

function adapt(client) {
  if (client === null || typeof client !== 'object') {
    throw new TypeError('expected an ioredis or node-redis client, got ' + String(client));
  }
  let adapter = cache.get(client);
  if (adapter === undefined) {
    adapter = make(client);
    cache.set(client, adapter);
  }
  return adapter;
}

function make(client) {
  if (client.isCluster === true && typeof client.nodes === 'function') {
    return new IORedisClusterAdapter(client);
  }
  if (typeof client.call === 'function' && typeof client.duplicate === 'function') {
    return new IORedisAdapter(client);
  }
  if (typeof client.getSlotMaster === 'function' && typeof client.nodeClient === 'function') {
    return new NodeRedisClusterAdapter(client);
  }
  if (typeof client.sendCommand === 'function' && typeof client.duplicate === 'function') {
    return new NodeRedisAdapter(client);
  }
  throw new TypeError(
    'expected an ioredis client (Redis or Cluster) or a node-redis client (createClient): ' +
      'it has neither call() nor sendCommand()'
  );
}

/** Every argument as a string: node-redis refuses numbers, and ioredis sends strings anyway. */
function strings(args) {
  return args.map((a) => (typeof a === 'string' || Buffer.isBuffer(a) ? a : String(a)));
}

/** True if `error` is an error reply from the server (the command ran and changed nothing). */
function isReplyError(error) {
  if (!(error instanceof Error)) return false;
  // ioredis: ReplyError (from redis-errors); node-redis 4: ErrorReply; node-redis 5: ErrorReply and
  // its subclasses SimpleError / BlobError.
  for (let p = error; p && p !== Error.prototype; p = Object.getPrototypeOf(p)) {
    const name = p.constructor && p.constructor.name;
    if (name === 'ReplyError' || name === 'ErrorReply') return true;
  }
  return false;
}

const ignore = () => {};

// --- ioredis -------------------------------------------------------------------------------

/** The options that make a duplicate fit for one wait: nothing re-sent, nothing cut short. */
const IOREDIS_WAITER = {
  lazyConnect: false,
  commandTimeout: undefined,
  autoResendUnfulfilledCommands: false,
  autoResubscribe: false,
  maxRetriesPerRequest: 0,
  retryStrategy: () => null,
  reconnectOnError: null,
  enableOfflineQueue: true,
  enableAutoPipelining: false,
  connectionName: 'redislock-waiter',
};

class IORedisAdapter {
  constructor(client) {
    this.client = client;
    this.kind = IOREDIS;
  }

  call(args) {
    const [command, ...rest] = strings(args);
    return this.client.call(command, ...rest);
  }

  /** Run `args` on the connection that serves `key` (the same one for every call). */
  callOnKey(_key, args) {
    return this.call(args);
  }

  waiter(_key) {
    return ioredisWaiter(this.client);
  }

  dedicated(_key, name) {
    return ioredisDedicated(this.client, name);
  }

  /** The client of the one server that serves `key` (this one). */
  nodeClient(_key) {
    return this.client;
  }
}

/**
 * A connection of its own that lives as long as its user wants (a bound session's, the change
 * feed's): made like the user's client, never reconnected and nothing re-sent (a new socket would
 * not be the one the server bound or watched), with `onClose(fn)` called once when it closes.
 */
function ioredisDedicated(node, name) {
  const conn = node.duplicate({ ...IOREDIS_WAITER, connectionName: name });
  const closed = closeOnce();
  const subscribed = new Set(); // channels the server confirmed, until unsubscribed
  conn.on('error', (e) => closed.error(e));
  conn.on('end', () => closed.fire());
  return {
    call(args) {
      const [command, ...rest] = strings(args);
      return conn.call(command, ...rest);
    },
    /** SSUBSCRIBE `channel`, resolving once the server confirmed it; messages go to `onMessage`. */
    async subscribe(channel, onMessage) {
      conn.removeAllListeners('smessage');
      conn.on('smessage', (ch, message) => onMessage(ch, message));
      // ioredis 5 answers a MOVED to SSUBSCRIBE with a 'moved' event and never settles the
      // command (ioredis 6 rejects it too): the 'moved' rejects here instead of waiting forever.
      let onMoved;
      const moved = new Promise((_, reject) => {
        onMoved = () => reject(new Error(`MOVED: SSUBSCRIBE ${channel} was refused (its slot moved)`));
        conn.once('moved', onMoved);
      });
      try {
        await Promise.race([conn.ssubscribe(channel), moved]);
      } finally {
        conn.off('moved', onMoved);
      }
      subscribed.add(channel);
    },
    unsubscribe(channel) {
      subscribed.delete(channel);
      return conn.sunsubscribe(channel);
    },
    /**
     * `fn(channel)` once for each channel the server unsubscribed this connection from unasked:
     * its slot left the node (a cluster failover or migration). ioredis 6 emits 'moved' for such
     * a `sunsubscribe`, ioredis 5 an 'error' ("Command queue state error"); both take the channel
     * out of the connection's subscription set, which is what is compared here.
     */
    onUnsubscribed(fn) {
      const check = () => {
        const set = conn.condition && conn.condition.subscriber;
        const now = set ? new Set(set.channels('ssubscribe')) : new Set();
        for (const channel of [...subscribed]) {
          if (now.has(channel)) continue;
          subscribed.delete(channel);
          fn(channel);
        }
      };
      conn.on('moved', check);
      conn.on('error', check);
    },
    onClose: closed.onClose,
    /** Let the process exit while this connection is open (a default session's). */
    unref() {
      if (conn.stream && typeof conn.stream.unref === 'function') conn.stream.unref();
    },
    close() {
      closed.fire();
      conn.disconnect(false);
    },
  };
}

/** The once-only close notice of a dedicated connection; the last error seen is its reason. */
function closeOnce() {
  let fns = [];
  let lastError = null;
  let fired = false;
  return {
    error(e) {
      lastError = e;
    },
    fire(e) {
      if (fired) return;
      fired = true;
      const reason = e || lastError || new Error('connection closed');
      for (const fn of fns) fn(reason);
      fns = [];
    },
    onClose(fn) {
      if (fired) fn(lastError || new Error('connection closed'));
      else fns.push(fn);
    },
  };
}

function ioredisWaiter(node) {
  const conn = node.duplicate(IOREDIS_WAITER);
  conn.on('error', ignore);
  return {
    call(args) {
      const [command, ...rest] = strings(args);
      return conn.call(command, ...rest);
    },
    close() {
      conn.disconnect(false);
    },
  };
}

/** How many MOVED / ASK redirects one command follows before its error is returned. */
const MAX_REDIRECTS = 5;

/** `MOVED slot host:port` / `ASK slot host:port` as `{ kind, address }`, or null. */
function redirectOf(error) {
  if (!isReplyError(error)) return null;
  const m = /^(MOVED|ASK) \d+ (\S+)$/.exec(error.message);
  return m ? { kind: m[1], address: m[2] } : null;
}

/**
 * An ioredis Cluster. ioredis routes a command by the keys its command table names; the
 * module's commands are not in that table, so `cluster.call()` would send them to a random
 * master and follow the MOVED from there. Two commands of one caller could then reach the key's
 * master out of order: a Redlock round's LOCK.MRELEASE before its own redirected LOCK.MACQUIRE,
 * leaving the grant held with no owner for its whole ttl (issue 28). So every command with a
 * key goes straight to the master of that key's slot (the cluster's slot table), on that
 * master's one connection, where the commands of one caller stay in the order sent.
 */
class IORedisClusterAdapter {
  constructor(cluster) {
    this.client = cluster;
    this.kind = IOREDIS_CLUSTER;
    this.isCluster = true;
  }

  /**
   * The slot table read again (after MOVED, READONLY or a lost connection: a failover). `key`
   * (the key whose slot may have moved) matters only to node-redis's cluster adapter.
   */
  refresh(_key) {
    return this._refreshSlots();
  }

  /**
   * `args` on the master of `key` (through the cluster as usual when there is no key). A MOVED
   * or ASK reply means the command did not run: the slot table is refreshed and the command sent
   * again to the node named, unless `{ redirects: false }`, for a command whose caller may send
   * the command that undoes it before this one's reply (a Redlock round's LOCK.MACQUIRE): sent
   * again later, it could run after its own release. The MOVED error is then returned (a vote
   * against) and the slot table refreshed for the next try.
   */
  call(args, key, options) {
    if (key === undefined) {
      const [command, ...rest] = strings(args);
      return this.client.call(command, ...rest);
    }
    return this.callOnKey(key, args, options);
  }

  /** The master that owns `key`'s slot, from the cluster's own slot table. */
  node(key) {
    const cluster = this.client;
    const owners = cluster.slots && cluster.slots[slotOf(key)];
    const master = owners && owners[0];
    if (master !== undefined) {
      for (const node of cluster.nodes('master')) {
        if (`${node.options.host}:${node.options.port}` === master) return node;
      }
    }
    throw new Error(
      `redislock: no known master for key ${JSON.stringify(key)} (is the cluster client ready?)`
    );
  }

  async callOnKey(key, args, { redirects = true } = {}) {
    const [command, ...rest] = strings(args);
    if (this.client.status !== 'ready') await this._ready();
    let node = this.node(key);
    for (let followed = 0; ; followed++) {
      try {
        return await node.call(command, ...rest);
      } catch (error) {
        const redirect = redirectOf(error);
        if (redirect === null) throw error;
        if (redirect.kind === 'MOVED') await this._refreshSlots();
        if (!redirects || followed >= MAX_REDIRECTS) throw error;
        if (redirect.kind === 'MOVED') {
          node = this.node(key);
        } else {
          // ASK: this one command, on the node importing the slot, after ASKING on the same
          // connection (sent together, in this order).
          node = this._nodeAt(redirect.address);
          node.call('ASKING').catch(ignore);
        }
      }
    }
  }

  /**
   * Until the cluster client is ready (its slot table loaded), as cluster.call() would queue the
   * command: connects a lazyConnect client, rejects if the client ends first.
   */
  async _ready() {
    const cluster = this.client;
    if (cluster.status === 'wait') await cluster.connect();
    if (cluster.status === 'ready') return;
    await new Promise((resolve, reject) => {
      const done = (error) => {
        cluster.off('ready', onReady);
        cluster.off('end', onEnd);
        if (error) reject(error);
        else resolve();
      };
      const onReady = () => done();
      const onEnd = () => done(new Error('redislock: the cluster client ended before it was ready'));
      cluster.on('ready', onReady);
      cluster.on('end', onEnd);
    });
  }

  /** The cluster's slot table read again from the cluster (once for concurrent callers). */
  _refreshSlots() {
    return new Promise((resolve) => this.client.refreshSlotsCache(() => resolve()));
  }

  /** The cluster's client of the master at `address` (host:port). */
  _nodeAt(address) {
    for (const node of this.client.nodes('master')) {
      if (`${node.options.host}:${node.options.port}` === address) return node;
    }
    throw new Error(`redislock: the cluster client has no connection to ${address}`);
  }

  /** A connection to the one master of `key`, not a whole cluster connection. */
  waiter(key) {
    return ioredisWaiter(this.node(key));
  }

  dedicated(key, name) {
    return ioredisDedicated(this.node(key), name);
  }

  /** The client of the master that serves `key` (its feed is that node's: the channel lives there). */
  nodeClient(key) {
    return this.node(key);
  }
}

// --- node-redis ----------------------------------------------------------------------------

class NodeRedisAdapter {
  constructor(client) {
    this.client = client;
    this.kind = NODE_REDIS;
  }

  call(args) {
    return this.client.sendCommand(strings(args));
  }

  callOnKey(_key, args) {
    return this.call(args);
  }

  async waiter(_key) {
    const conn = this._duplicate('redislock-waiter');
    conn.on('error', ignore);
    await conn.connect();
    let closed = false;
    return {
      call: (args) => conn.sendCommand(strings(args)),
      close() {
        if (closed) return;
        closed = true;
        destroy(conn);
      },
    };
  }

  _duplicate(name) {
    const options = this.client.options || {};
    return this.client.duplicate({
      socket: { ...options.socket, reconnectStrategy: false, socketTimeout: undefined },
      disableOfflineQueue: false,
      pingInterval: undefined,
      name,
    });
  }

  /** As ioredisDedicated: node-redis reports an unexpected close as an 'error' (no reconnect). */
  async dedicated(_key, name) {
    const conn = this._duplicate(name);
    const closed = closeOnce();
    conn.on('error', (e) => closed.fire(e));
    conn.on('end', () => closed.fire());
    await conn.connect();
    return {
      call: (args) => conn.sendCommand(strings(args)),
      subscribe: (channel, onMessage) => conn.sSubscribe(channel, (message, ch) => onMessage(ch, message)),
      unsubscribe: (channel) => conn.sUnsubscribe(channel),
      /** As ioredisDedicated's: node-redis 4 and 5 emit 'sharded-channel-moved' for it. */
      onUnsubscribed(fn) {
        conn.on('sharded-channel-moved', (channel) => fn(String(channel)));
      },
      onClose: closed.onClose,
      unref() {
        if (typeof conn.unref === 'function') conn.unref();
      },
      close() {
        closed.fire();
        destroy(conn);
      },
    };
  }

  nodeClient(_key) {
    return this.client;
  }
}

// --- node-redis cluster ---------------------------------------------------------------------

/** ms a live master has to answer where a slot is now (NodeRedisClusterAdapter.refresh). */
const PROBE_MS = 1000;

/** A node-redis node client (not one still connecting: a promise) whose connection is up. */
function nodeReady(client) {
  return client !== undefined && typeof client.then !== 'function' && client.isReady === true;
}

/**
 * A node-redis node client that lost its connection and is reconnecting: node-redis queues every
 * command for it until it is back, which a killed master never is.
 */
function nodeLost(client) {
  return client !== undefined && typeof client.then !== 'function' && client.isOpen === true && client.isReady !== true;
}

/**
 * A node-redis cluster (`createCluster`, 4 and 5). Every command goes with its first key
 * (`sendCommand(key, ...)`): the cluster sends it to the key's master and follows MOVED and ASK
 * with that key (without one it would pick a random node, and after a MOVED another random one).
 * A wait, a feed and a bound session get a connection of their own to the key's master,
 * duplicated from the cluster's client of that master as from one node-redis client.
 *
 * node-redis reads its slot table again only when a command sent through it meets MOVED, and it
 * has no public call for that; it never does after a lost connection, and queues each command for
 * a node whose connection was lost until that node is back. So after a killed master every
 * command for its slots would wait forever, the promoted replica unknown (seen with node-redis 4
 * and 5). Here a command for such a node is refused at once (after one look, `refresh`) and the
 * client's follow loops send it again once the table names the slot's new master.
 */
class NodeRedisClusterAdapter {
  constructor(cluster) {
    this.client = cluster;
    this.kind = NODE_REDIS_CLUSTER;
    this.isCluster = true;
    this._refreshing = new Map(); // slot -> the look at it in flight (shared by concurrent callers)
  }

  /**
   * The slot table read again, as far as node-redis lets anyone ask (see above), for `key`'s
   * slot. Without `key`, nothing; errors are the caller's own retry's to report.
   *
   * - The table's master of the slot is connected (a planned failover): a harmless keyed read
   *   (LOCK.INFO) is sent through the cluster; on the old master, now a replica, it meets MOVED
   *   and node-redis reads the table again. A connection of the adapter's own (a bound
   *   session's, a wait's, the feed's) meets no such MOVED inside node-redis: without this, a
   *   bound session alone kept re-attaching on the old master.
   * - Its connection is lost (a killed master): a live master is asked about the key directly;
   *   its MOVED names the slot's master now. If that is another node (the cluster promoted a
   *   replica), the same read is sent through the cluster routed to that live master (by a key
   *   of its slots): it meets the MOVED there and node-redis reads the table again, drops its
   *   client of the dead node (the commands queued there fail, and their callers' loops send
   *   them again) and connects to the new master. node-redis follows that MOVED up to its
   *   `maxCommandRedirections` (16) times, each time reading the table: tens of ms, once per
   *   failover.
   */
  refresh(key) {
    if (key === undefined) return Promise.resolve();
    const slot = slotOf(key);
    let look = this._refreshing.get(slot);
    if (look === undefined) {
      look = this._refresh(key).catch(ignore).finally(() => this._refreshing.delete(slot));
      this._refreshing.set(slot, look);
    }
    return look;
  }

  async _refresh(key) {
    const info = ['LOCK.INFO', key];
    const master = this.client.getSlotMaster(slotOf(key));
    if (master === undefined || !nodeLost(master.client)) {
      await this.client.sendCommand(key, false, info);
      return;
    }
    for (const other of this.client.masters) {
      if (other === master || !nodeReady(other.client)) continue;
      let moved = null;
      try {
        await withDeadline(other.client.sendCommand(info), PROBE_MS);
        continue; // it serves the slot itself (or did not say): ask another
      } catch (error) {
        moved = redirectOf(error);
      }
      if (moved === null) continue;
      if (moved.address === master.address) return; // no replica promoted yet
      const route = this._keyOf(other);
      if (route !== undefined) await this.client.sendCommand(route, false, info);
      return;
    }
  }

  /** A key whose slot `master` serves in the table (tried in order: a third of keys, for 3). */
  _keyOf(master) {
    for (let i = 0; i < 65536; i++) {
      const key = `{redislock-route-${i}}`;
      if (this.client.getSlotMaster(slotOf(key)) === master) return key;
    }
    return undefined;
  }

  call(args, key) {
    if (key === undefined) {
      throw new TypeError(`redislock: ${String(args[0])} has no key to route it in a node-redis cluster`);
    }
    return this.callOnKey(key, args);
  }

  /**
   * `args` on `key`'s master through the cluster. If the table's master has lost its connection
   * the table is looked at again first (`refresh`); still that node, the command is refused, not
   * queued for a node that may never come back: "the connection to HOST:PORT ... is lost". Never
   * sent, it is safe to send again: the follow loops do, until their deadline.
   */
  async callOnKey(key, args) {
    let master = this.client.getSlotMaster(slotOf(key));
    if (master !== undefined && nodeLost(master.client)) {
      await this.refresh(key);
      master = this.client.getSlotMaster(slotOf(key));
      if (master !== undefined && nodeLost(master.client)) {
        throw new Error(
          `redislock: the connection to ${master.address}, the master of ${JSON.stringify(key)}'s slot in ` +
            'the node-redis cluster client, is lost (node-redis is reconnecting) and no other master of the slot is known yet'
        );
      }
    }
    return this.client.sendCommand(key, false, strings(args));
  }

  /** The cluster's own client of the master that owns `key`'s slot (connected). */
  nodeClient(key) {
    const master = this.client.getSlotMaster(slotOf(key));
    const node = master === undefined ? undefined : this.client.nodeClient(master);
    if (node === undefined || typeof node.then === 'function') {
      throw new Error(`redislock: no connected master for key ${JSON.stringify(key)} (is the cluster client connected?)`);
    }
    return node;
  }

  waiter(key) {
    return adapt(this.nodeClient(key)).waiter(key);
  }

  dedicated(key, name) {
    return adapt(this.nodeClient(key)).dedicated(key, name);
  }
}

/** `promise`, or a rejection after `ms`. */
function withDeadline(promise, ms) {
  let timer;
  const late = new Promise((_, reject) => {
    timer = setTimeout(() => reject(new Error(`no answer within ${ms} ms`)), ms);
  });
  return Promise.race([promise, late]).finally(() => clearTimeout(timer));
}

function destroy(conn) {
  // node-redis 5 has destroy(); 4 has disconnect() (5 still accepts it, deprecated).
  try {
    const p = typeof conn.destroy === 'function' ? conn.destroy() : conn.disconnect();
    if (p && typeof p.catch === 'function') p.catch(ignore);
  } catch {
    // already closed
  }
}

module.exports = { adapt, isReplyError, strings, IOREDIS, IOREDIS_CLUSTER, NODE_REDIS, NODE_REDIS_CLUSTER };
