'use strict';
// MultiLock: exclusive locks on several keys, all or none (LOCK.MACQUIRE / LOCK.MRELEASE).
// There is no multi-key extend command: extend(), owned(), locked() and the watchdog's renewals
// run one script over the keys (one atomic step on the server).

const { Lock } = require('./lock');
const wire = require('./wire');

// KEYS the locks, ARGV their tokens: 1 if every token is live.
const OWNED_ALL_LUA = `for i, key in ipairs(KEYS) do
    if redis.call('LOCK.FENCE', key, ARGV[i]) ~= 1 then
        return 0
    end
end
return 1
`;

// KEYS the locks: 1 if any of them is held.
const ANY_HELD_LUA = `for _, key in ipairs(KEYS) do
    if redis.call('LOCK.FENCE', key) then
        return 1
    end
end
return 0
`;

class MultiLock extends Lock {
  /** Exclusive locks on every key of `names` or none. In a cluster the keys need one hash tag. */
  constructor(client, names, ttl, options) {
    const list = Array.from(names);
    if (list.length === 0) throw new RangeError('names must not be empty');
    if (options !== undefined && options.lockDelay !== undefined) {
      throw new RangeError('LOCK.MACQUIRE takes no LOCKDELAY: lockDelay is for Lock, Semaphore and ReadWriteLock');
    }
    super(client, list[0], ttl, options);
    this.names = list;
    this._tokens = null;
  }

  /** One fencing token per key, in the order of `names`; null when not held. */
  get tokens() {
    return this._tokens;
  }

  _keys() {
    return this.names;
  }

  _acquireArgs(blockMs) {
    const args = ['LOCK.MACQUIRE', this.names.length, ...this.names, this.owner, this._ttl, ...this._sessionArgs()];
    return blockMs === undefined ? args : [...args, 'BLOCK', blockMs];
  }

  _feedTokens() {
    return new Map(this.names.map((name, i) => [name, this._tokens[i]]));
  }

  _releaseArgs() {
    return ['LOCK.MRELEASE', this.names.length, ...this.names, this.owner];
  }

  _extendArgs() {
    return ['EVAL', wire.EXTEND_ALL_LUA, this.names.length, ...this.names, this.owner, this._ttl];
  }

  _renewed(reply) {
    return reply === this.names.length;
  }

  _released(reply) {
    return reply === this.names.length;
  }

  /** `token` is the largest of `tokens`. */
  _granted(reply) {
    this._tokens = reply.map(wire.toToken);
    this._token = Math.max(...this._tokens);
    return this._token;
  }

  _forget() {
    this._token = null;
    this._tokens = null;
  }

  async owned() {
    if (this._tokens === null) return false;
    const reply = await this._call(['EVAL', OWNED_ALL_LUA, this.names.length, ...this.names, ...this._tokens]);
    return reply === 1;
  }

  async locked() {
    return (await this._call(['EVAL', ANY_HELD_LUA, this.names.length, ...this.names])) === 1;
  }

  fenced() {
    return Promise.reject(new Error('fence each key with its own token: fencedCall(client, key, token, ...)'));
  }
}

module.exports = { MultiLock };
