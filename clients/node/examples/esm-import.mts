// Not in the README: checks that the types also hold for ES-module TypeScript (nodenext).
import Redlock, { ResourceLockedError, ExecutionError } from "redislock-native/redlock";
import { Lock, Locks, DurabilityError } from "redislock-native";

export function types(client: ConstructorParameters<typeof Lock>[0]) {
  const redlock: Redlock = new Redlock([client], { retryCount: 0 });
  const locks = new Locks(client);
  return { redlock, locks, errors: [ResourceLockedError, ExecutionError, DurabilityError] };
}
