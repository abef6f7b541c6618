// Types for redislock-native/redlock, the drop-in for node-redlock v5 (its names and shapes).
import { EventEmitter } from "node:events";
import type { RedisClient } from "./index";

declare namespace Redlock {
  export type Client = RedisClient;

  export interface Settings {
    readonly driftFactor: number;
    readonly retryCount: number;
    readonly retryDelay: number;
    readonly retryJitter: number;
    readonly automaticExtensionThreshold: number;
  }

  export type ExecutionStats = {
    readonly membershipSize: number;
    readonly quorumSize: number;
    readonly votesFor: Set<Client>;
    readonly votesAgainst: Map<Client, Error>;
  };

  export type ExecutionResult = {
    attempts: ReadonlyArray<Promise<ExecutionStats>>;
    start: number;
  };

  export type RedlockAbortSignal = AbortSignal & { error?: Error };

  export class Lock {
    constructor(
      redlock: Redlock,
      resources: string[],
      value: string,
      attempts: ReadonlyArray<Promise<ExecutionStats>>,
      expiration: number,
      tokens?: Array<number[] | null>
    );
    readonly redlock: Redlock;
    readonly resources: string[];
    readonly value: string;
    readonly attempts: ReadonlyArray<Promise<ExecutionStats>>;
    expiration: number;
    /** The module's fencing tokens: per client, one per resource, or null where not granted. */
    readonly tokens: Array<number[] | null>;
    release(): Promise<ExecutionResult>;
    extend(duration: number): Promise<Lock>;
    unlock(): Promise<ExecutionResult>;
  }

  export class ResourceLockedError extends Error {
    constructor(message: string);
  }

  export class ExecutionError extends Error {
    constructor(message: string, attempts: ReadonlyArray<Promise<ExecutionStats>>);
    readonly attempts: ReadonlyArray<Promise<ExecutionStats>>;
  }

  export { Redlock as default, Redlock };
}

declare class Redlock extends EventEmitter {
  constructor(clients: Iterable<Redlock.Client>, settings?: Partial<Redlock.Settings>, scripts?: object);
  readonly clients: Set<Redlock.Client>;
  readonly settings: Redlock.Settings;
  quit(): Promise<void>;
  acquire(resources: string[], duration: number, settings?: Partial<Redlock.Settings>): Promise<Redlock.Lock>;
  release(lock: Redlock.Lock, settings?: Partial<Redlock.Settings>): Promise<Redlock.ExecutionResult>;
  extend(existing: Redlock.Lock, duration: number, settings?: Partial<Redlock.Settings>): Promise<Redlock.Lock>;
  using<T>(
    resources: string[],
    duration: number,
    settings: Partial<Redlock.Settings>,
    routine?: (signal: Redlock.RedlockAbortSignal) => Promise<T>
  ): Promise<T>;
  using<T>(
    resources: string[],
    duration: number,
    routine: (signal: Redlock.RedlockAbortSignal) => Promise<T>
  ): Promise<T>;
  /** node-redlock v4 names. */
  lock(resource: string | string[], ttl: number): Promise<Redlock.Lock>;
  unlock(lock: Redlock.Lock): Promise<Redlock.ExecutionResult>;
}

export = Redlock;
