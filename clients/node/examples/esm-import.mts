// Not in the README: checks that the types also hold for ES-module TypeScript (nodenext).
import Redlock, { ResourceLockedError, ExecutionError } from "redislock-native/redlock";
import { Lock, Locks, DurabilityError } from "redislock-native";
import { createClient as createClient4, createCluster as createCluster4 } from "redis4";
import { createClient as createClient5, createCluster as createCluster5 } from "redis";
import { Redis as IORedis, Cluster as IORedisCluster } from "ioredis";

export function types(client: ConstructorParameters<typeof Lock>[0]) {
  const redlock: Redlock = new Redlock([client], { retryCount: 0 });
  const locks = new Locks(client);
  return { redlock, locks, errors: [ResourceLockedError, ExecutionError, DurabilityError] };
}

// Every client library's client is accepted where a client is expected.
export const accepted = [new Lock(createClient4(), "k", 1000), new Lock(createClient5(), "k", 1000), new Lock(new IORedis({ lazyConnect: true }), "k", 1000)];

// And every cluster client (inside a function: nothing is made at import).
const roots = [{ socket: { host: "127.0.0.1", port: 7000 } }];
export const acceptedClusters = () => [
  new Lock(createCluster4({ rootNodes: roots }), "k", 1000),
  new Lock(createCluster5({ rootNodes: roots }), "k", 1000),
  new Lock(new IORedisCluster([{ host: "127.0.0.1", port: 7000 }], { lazyConnect: true }), "k", 1000),
];
