// Types for redislock-native (hand-written; the source is plain JavaScript).
//
// Tokens are JavaScript numbers, exact: the module mints tokens below 2^53 (until the year 2109,
// see "Fencing tokens" in the module's README), and every token read is checked with
// Number.isSafeInteger (a RangeError otherwise, never a rounded number).

/** An ioredis 5 `Redis` or `Cluster`, or a node-redis 4/5 client from `createClient()`. */
export type RedisClient =
  | { call(command: string, ...args: any[]): Promise<unknown>; duplicate(...args: any[]): any }
  | { sendCommand(args: any[], ...rest: any[]): Promise<unknown>; duplicate(...args: any[]): any };

export interface LockOptions {
  /** Who holds it (default: host:pid:uuid, new for every lock object). */
  owner?: string;
  /** Renew the hold every `watchdogPeriod` ms (default ttl/3) while it is held. */
  watchdog?: boolean;
  watchdogPeriod?: number;
  /** Called once when the hold is lost (also `lock.signal` aborts). */
  onLost?: (lock: Lock, error: LockLostError) => void | Promise<void>;
  /** Succeed only once this many replicas acknowledged the grant (WAIT); Redis 7.0.12+. */
  durable?: number;
  /** How long WAIT waits for them, in ms (default 1000). */
  durableTimeout?: number;
}

export interface AcquireOptions {
  /** How long to wait in the server's queue, in ms: undefined waits without limit, 0 is one try. */
  timeout?: number;
  /** Cancels the wait: the call rejects with the signal's reason and leaves no grant behind. */
  signal?: AbortSignal;
}

export class Lock {
  constructor(client: RedisClient, name: string, ttl: number, options?: LockOptions);
  readonly client: RedisClient;
  readonly name: string;
  readonly owner: string;
  readonly durable: number;
  /** The fencing token of the current hold, or null when not held. */
  readonly token: number | null;
  /** The hold time in ms. */
  readonly ttl: number;
  /** Aborts (with a LockLostError as its reason) when the current hold is lost. */
  readonly signal: AbortSignal;
  readonly lost: boolean;
  /** "not held", "extend failed: ...", "expired", or null. */
  readonly lostReason: string | null;
  /** True if granted, false if the wait ran out. */
  acquire(options?: AcquireOptions): Promise<boolean>;
  /** True if this owner held it. */
  release(): Promise<boolean>;
  /** True if still held (deadline = now + ttl); a given ttl replaces the lock's. */
  extend(ttl?: number): Promise<boolean>;
  /** Anyone holds it. */
  locked(): Promise<boolean>;
  /** This hold is the live one. */
  owned(): Promise<boolean>;
  /** `command key ...args`, run only while this hold is live; else StaleTokenError. */
  fenced(command: string, key: string, ...args: Array<string | number | Buffer>): Promise<unknown>;
  /** Acquire, run `fn(signal)`, release on every exit path; LockBusyError if the wait ran out. */
  using<T>(fn: (signal: AbortSignal) => Promise<T> | T, options?: AcquireOptions): Promise<T>;
}

export class Semaphore extends Lock {
  constructor(client: RedisClient, name: string, limit: number, ttl: number, options?: LockOptions);
  readonly limit: number;
}

export class ReadLock extends Lock {}

export class ReadWriteLock {
  constructor(client: RedisClient, name: string, ttl: number, options?: LockOptions);
  readonly name: string;
  readonly read: ReadLock;
  readonly write: Lock;
}

export class MultiLock extends Lock {
  constructor(client: RedisClient, names: Iterable<string>, ttl: number, options?: LockOptions);
  readonly names: string[];
  /** One token per key, in the order of `names`; null when not held. `token` is the largest. */
  readonly tokens: number[] | null;
}

export interface UsingOptions extends LockOptions, AcquireOptions {}

export class Locks {
  constructor(client: RedisClient, defaults?: LockOptions);
  readonly client: RedisClient;
  lock(name: string, ttl: number, options?: LockOptions): Lock;
  semaphore(name: string, limit: number, ttl: number, options?: LockOptions): Semaphore;
  readWrite(name: string, ttl: number, options?: LockOptions): ReadWriteLock;
  multi(names: Iterable<string>, ttl: number, options?: LockOptions): MultiLock;
  /** Acquire `name` (watchdog on), run `fn(signal)`, release on every exit path. */
  using<T>(name: string, ttl: number, fn: (signal: AbortSignal) => Promise<T> | T): Promise<T>;
  using<T>(name: string, ttl: number, options: UsingOptions, fn: (signal: AbortSignal) => Promise<T> | T): Promise<T>;
}

export function fencedCall(
  client: RedisClient,
  lockKey: string,
  token: number | null,
  command: string,
  key: string,
  ...args: Array<string | number | Buffer>
): Promise<unknown>;

export function fencedScript(
  client: RedisClient,
  body: string
): (keys: string[], args: Array<string | number | Buffer>) => Promise<unknown>;

export const FENCE_CHECK_LUA: string;
export const FENCED_CALL_LUA: string;

export class LockError extends Error {}
export class LockLostError extends LockError {
  readonly reason: string;
}
export class LockBusyError extends LockError {}
export class DurabilityError extends LockError {
  readonly acknowledged: number;
  readonly wanted: number;
  readonly released: boolean;
  readonly heldBefore: boolean;
  readonly mayStayHeld: boolean;
}
export class DurableUnsupportedError extends LockError {}
export class StaleTokenError extends LockError {}
