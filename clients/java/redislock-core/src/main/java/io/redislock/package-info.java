/**
 * The Java client of the redis-lock module, on Jedis: the same concepts and names as the
 * Python, Node and Rust clients.
 *
 * <h2>Layout</h2>
 *
 * <ul>
 *   <li>{@link io.redislock.LockClient}: the entry point; the Jedis client for ordinary commands,
 *       connections of its own for waits, bound sessions and the feed, the timers.
 *   <li>{@link io.redislock.Lock}: an exclusive lock, a {@code java.util.concurrent.locks.Lock}
 *       owned by the handle; {@link io.redislock.Semaphore}, {@link io.redislock.ReadWriteLock}
 *       and {@link io.redislock.MultiLock} change only the commands it sends.
 *   <li>{@link io.redislock.Session}: one lease for many holds; {@code BOUND} ends it when the
 *       holder's connection closes ({@code GRACE}: unless a new connection re-ATTACHes it in
 *       time). Every lock made without one joins its client's default session
 *       ({@code LockClient.defaultSession}: one {@code BOUND GRACE 500} session per client and
 *       node), so a killed holder's locks are handed on within a second.
 *   <li>{@link io.redislock.Election}: campaign, leader, resign, observe.
 *   <li>{@link io.redislock.Fence}: the fenced-write scripts. {@code Feed} (package-private): the
 *       change feed that reports losses at once. {@link io.redislock.LockInfo}: LOCK.INFO parsed.
 *   <li>The exceptions: {@link io.redislock.LockException} and its kinds (lost, busy, stale
 *       token, durability), {@link io.redislock.LockNotOwnedException}.
 * </ul>
 */
package io.redislock;
