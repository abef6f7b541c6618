// Types for redislock-native (hand-written; the source is plain JavaScript).
//
// Tokens are JavaScript numbers, exact: the module mints tokens below 2^53 (until the year 2109,
// see "Fencing tokens" in the module's README), and every token read is checked with
// Number.isSafeInteger (a RangeError otherwise, never a rounded number).

/** An ioredis 5 `Redis` or `Cluster`, or a node-redis 4/5 `createClient()` or `createCluster()`. */
export type RedisClient =
  | { call(command: string, ...args: any[]): Promise<unknown>; duplicate(...args: any[]): any }
  | { sendCommand(args: any[], ...rest: any[]): Promise<unknown>; duplicate(...args: any[]): any }
  | {
      sendCommand(firstKey: any, isReadonly: any, args: any[], ...rest: any[]): Promise<unknown>;
      getSlotMaster(slot: number): any;
      nodeClient(node: any): any;
    };

export interface LockOptions {
  /** Who holds it (default: host:pid:uuid, new for every lock object). */
  owner?: string;
  /** Renew the hold every `watchdogPeriod` ms (default ttl/3) while it is held. */
  watchdog?: boolean;
  watchdogPeriod?: number;
  /**
   * Called once when the hold is lost (also `lock.signal` aborts). With it (and `feed`, on by
   * default) the key is watched through the client's change feed while held, so a loss the
   * server causes is reported at once.
   */
  onLost?: (lock: Lock, error: LockLostError) => void | Promise<void>;
  /** With `onLost`: watch the key through the change feed while held (default true). */
  feed?: boolean;
  /**
   * Not given: the hold joins the client's default session (one bound session per client and
   * server, `GRACE` 500 ms: the lock is freed within milliseconds of this process dying) and keeps
   * its own ttl, watchdog and extend(). `null`: the hold lives by its ttl alone. A Session: hold it
   * in that session (`SESSION id`): no watchdog; a ttl of 0 means no deadline of its own.
   */
  session?: Session | null;
  /**
   * ms (0 to 60000) nobody is granted what this hold had once it expired (`LOCKDELAY`): time for
   * a holder that missed its loss to stop. A release is clean (no delay). Not with `session` (its
   * holds have the session's) nor on a MultiLock (LOCK.MACQUIRE takes none): a RangeError.
   */
  lockDelay?: number;
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
  /**
   * "not held", "extend failed: ...", "expired" (the watchdog, the ttl); "session lost: ...";
   * "feed: <event>" (released, expired, lost, deleted, flushed, swapped, demoted),
   * `feed: acquired to "OWNER"`, `feed: handoff to "OWNER"` (the owner as JSON), "feed: not held
   * (LOCK.INFO)", "deadline passed: no renewal succeeded", "feed connection lost: ..."; or null.
   */
  readonly lostReason: string | null;
  /** The session the hold is in: the given one, the client's default one once acquired, or undefined. */
  readonly session: Session | undefined;
  /** The `lockDelay` option in ms, or undefined. */
  readonly lockDelay: number | undefined;
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
  constructor(client: RedisClient, names: Iterable<string>, ttl: number, options?: Omit<LockOptions, 'lockDelay'>);
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
  multi(names: Iterable<string>, ttl: number, options?: Omit<LockOptions, 'lockDelay'>): MultiLock;
  /** Acquire `name` (watchdog on), run `fn(signal)`, release on every exit path. */
  using<T>(name: string, ttl: number, fn: (signal: AbortSignal) => Promise<T> | T): Promise<T>;
  using<T>(name: string, ttl: number, options: UsingOptions, fn: (signal: AbortSignal) => Promise<T> | T): Promise<T>;
}

export interface SessionOptions {
  /** The session also ends the moment its dedicated connection closes (the process dies). */
  bound?: boolean;
  /** ms (0 to 60000) nobody is granted what a hold had after the session was lost uncleanly. */
  lockDelay?: number;
  /** With a cluster client: a key the session will lock (its node opens the session). */
  key?: string;
  /** Called once when the session is lost (then each of its holds reports "session lost: ..."). */
  onLost?: (session: Session) => void | Promise<void>;
  /** ms between keepalives (default ttl/3). */
  keepalivePeriod?: number;
}

export interface SessionInfo {
  /** ms left. */
  ttl: number;
  /** The bound connection's client id, or null. */
  bound: number | null;
  lockdelay: number;
  holds: number;
  /** The session's public handle (LOCK.SESSION LIST, LOCK.INFO, CLIENT LIST's name). */
  serial: number;
  /** ms the session outlives its bound connection's close (`GRACE`; 0 without). */
  grace: number;
  /** While detached (its connection closed, within the grace): ms left to ATTACH it; else null. */
  detached: number | null;
}

/** One lease (LOCK.SESSION) for many holds, kept alive by one keepalive timer. */
export class Session {
  constructor(client: RedisClient, ttl: number, options?: SessionOptions);
  readonly client: RedisClient;
  readonly bound: boolean;
  /** The session id (a secret), or null before open(). */
  readonly id: string | null;
  /** A bound session's public serial (LOCK.SESSION LIST, LOCK.INFO), once open; else null. */
  readonly serial: number | null;
  readonly ttl: number;
  readonly lockDelay: number | undefined;
  readonly lost: boolean;
  /** "ended", "keepalive failed: ...", "connection lost: ...", or null. */
  readonly lostReason: string | null;
  readonly closed: boolean;
  /** LOCK.SESSION OPEN, then the keepalive starts; resolves to this session. */
  open(): Promise<this>;
  /** LOCK.SESSION CLOSE: the number of holds released (no lock-delay), or null. */
  close(): Promise<number | null>;
  /** LOCK.SESSION INFO, or null if the server has no such session. */
  info(): Promise<SessionInfo | null>;
}

/** Who leads: what it published (its owner string) and its term (the grant's fencing token). */
export interface Leader {
  value: string;
  term: number;
}

/** A change seen by observe(): `leader` null is "no leader"; `resync` a state read again. */
export interface LeadershipChange {
  leader: Leader | null;
  /** True when read from LOCK.INFO (at the start, after a reconnect or a gap in the feed). */
  resync: boolean;
  seq: number | null;
}

export interface ElectionOptions {
  /** ms a leadership lasts unless renewed (default 10000; with `session` 0: the session covers it). */
  ttl?: number;
  watchdogPeriod?: number;
  /**
   * Hold leaderships in this session (bound: the next candidate leads when this process dies).
   * Not given: the client's default session, with the leadership's ttl and watchdog on top;
   * `null`: the ttl and watchdog alone.
   */
  session?: Session | null;
}

export interface CampaignOptions extends AcquireOptions {
  /** Called once when the leadership is found gone. */
  onLost?: (leadership: Leadership, error: LockLostError) => void | Promise<void>;
}

export class Leadership {
  readonly lock: Lock;
  readonly value: string;
  /** The fencing token of the grant. */
  readonly term: number;
  readonly lost: boolean;
  readonly lostReason: string | null;
  /** Aborts when this leadership is found gone. */
  readonly signal: AbortSignal;
  /** `command key ...args`, run only while this term is the live one; else StaleTokenError. */
  fenced(command: string, key: string, ...args: Array<string | number | Buffer>): Promise<unknown>;
  /** Step down: true if this leadership was live. */
  resign(): Promise<boolean>;
}

/** The changes of an election (`observe()`) or of any lock's holder (`watch()`). */
export class Observation implements AsyncIterableIterator<LeadershipChange> {
  /** The next change; rejects with a TimeoutError (`code: 'ETIMEDOUT'`) after `timeout` ms. */
  get(timeout?: number): Promise<LeadershipChange>;
  /** The iterator protocol: `{value, done: false}`, `{value: undefined, done: true}` once closed. */
  next(timeout?: number): Promise<IteratorResult<LeadershipChange, undefined>>;
  /** Closes it (`break` out of `for await` calls it). */
  return(): Promise<IteratorResult<LeadershipChange, undefined>>;
  close(): void;
  [Symbol.asyncIterator](): this;
}

/**
 * Every change of the exclusive holder of any lock `name`: `leader` is the holder, `{value: owner,
 * term: token}`, or null when nobody holds it; the first change is the state when it started.
 */
export function watch(client: RedisClient, name: string): Observation;

/** The default session's ttl in ms (a keepalive every third). */
export const DEFAULT_SESSION_TTL_MS: number;
/** ms the server keeps a default session whose connection dropped, for the client to re-ATTACH it. */
export const DEFAULT_GRACE_MS: number;
/**
 * Close `client`'s default sessions now (LOCK.SESSION CLOSE: their holds released at once);
 * closing the client (quit(), disconnect(), ...) does it too. The next lock acquired through it
 * opens a new one.
 */
export function closeDefaultSessions(client: RedisClient): Promise<void>;

export class Election {
  constructor(client: RedisClient, name: string, options?: ElectionOptions);
  readonly client: RedisClient;
  readonly name: string;
  /** The `session` option: a Session, null (no session), or undefined (the client's default session). */
  readonly session: Session | null | undefined;
  /** Wait in the queue until leading; null if `timeout` ms passed first. */
  campaign(value: string, options?: CampaignOptions): Promise<Leadership | null>;
  /** Step down from the last leadership this object won. */
  resign(): Promise<boolean>;
  /** Who leads now, or null. */
  leader(): Promise<Leader | null>;
  /** Every change of leader, "no leader" included; the first is the state when it started. */
  observe(): Observation;
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
/** A wait with its own timeout ran out (`Observation.get(timeout)`); `code` is 'ETIMEDOUT'. */
export class TimeoutError extends LockError {
  readonly code: 'ETIMEDOUT';
}
