// Not in the README: checks that the types also hold for ES-module TypeScript (nodenext).
import Redlock, { ResourceLockedError, ExecutionError } from "redislock-native/redlock";
import { Lock, Locks, DurabilityError } from "redislock-native";
import { createClient as createClient4 } from "redis4";
import { createClient as createClient5 } from "redis";
import { Redis as IORedis } from "ioredis";

export function types(client: ConstructorParameters<typeof Lock>[0]) {
  const redlock: Redlock = new Redlock([client], { retryCount: 0 });
  const locks = new Locks(client);
  return { redlock, locks, errors: [ResourceLockedError, ExecutionError, DurabilityError] };
}

// Every client library's client is accepted where a client is expected.
export const accepted = [new Lock(createClient4(), "k", 1000), new Lock(createClient5(), "k", 1000), new Lock(new IORedis({ lazyConnect: true }), "k", 1000)];
