// Package redsync is a drop-in for github.com/go-redsync/redsync/v4 backed by the redis-lock
// module: change the imports
//
//	github.com/go-redsync/redsync/v4                -> redis-lock/clients/go/redsync
//	github.com/go-redsync/redsync/v4/redis/goredis/v9 -> redis-lock/clients/go/redsync/redis/goredis/v9
//
// and the same code takes the lock with LOCK.ACQUIRE. What changes underneath:
//
//   - Lock waits in the server's FIFO queue (one LOCK.ACQUIRE ... BLOCK) instead of polling:
//     its wait is what go-redsync's retries would have taken at most (the sum of the retry
//     delays of tries-1 retries), and a release hands the lock to the first waiter at once.
//   - A context that ends ends the wait, and the error matches the context's error as well as
//     ErrFailed (go-redsync returns ErrFailed alone).
//   - The lock has a fencing token (Mutex.Token), larger for every grant.
//   - The lock is also in the go-redis client's default session (redislock.DefaultSession): a
//     holder process that dies frees it within redislock.DefaultSessionGrace (0.5 s) of its
//     connection closing, not at the expiry; the expiry still bounds it, and Extend, Until and
//     Valid are as before. WithDefaultSession(false) keeps go-redsync's expiry-only lock. Call
//     redislock.Close(ctx, client) at shutdown to end the session at once.
//   - Several pools (independent servers) are still a quorum: each try takes the lock without
//     waiting on each server, as go-redsync does.
//
// WithDriftFactor, WithTimeoutFactor, WithShufflePools, WithSetNXOnExtend and WithFailFast
// are accepted; the drift factor shortens Until as in go-redsync, the others change nothing
// here. A custom Pool (go-redsync's Pool interface) does not carry over: make the pool with
// goredis.NewPool.
package redsync

import (
	"math/rand"
	"time"

	redislock "redis-lock/clients/go"
	"redis-lock/clients/go/redsync/redis"
)

const (
	minRetryDelayMilliSec = 50
	maxRetryDelayMilliSec = 250
)

// Redsync makes mutexes on one pool (or a quorum of pools).
type Redsync struct {
	pools   []redis.Pool
	lockers []*redislock.Client // one per pool: its waits reuse their connections
}

// New creates and returns a new Redsync instance from given Redis connection pools.
func New(pools ...redis.Pool) *Redsync {
	r := &Redsync{pools: pools}
	for _, p := range pools {
		r.lockers = append(r.lockers, redislock.New(p.Client()))
	}
	return r
}

// NewMutex returns a new distributed mutex with given name.
func (r *Redsync) NewMutex(name string, options ...Option) *Mutex {
	m := &Mutex{
		name:   name,
		expiry: 8 * time.Second,
		tries:  32,
		delayFunc: func(tries int) time.Duration {
			return time.Duration(rand.Intn(maxRetryDelayMilliSec-minRetryDelayMilliSec)+minRetryDelayMilliSec) * time.Millisecond
		},
		genValueFunc: genValue,
		driftFactor:  0.01,
		quorum:       len(r.pools)/2 + 1,
		pools:        r.pools,
		lockers:      r.lockers,
	}
	for _, o := range options {
		o.Apply(m)
	}
	return m
}

// An Option configures a mutex.
type Option interface {
	Apply(*Mutex)
}

// OptionFunc is a function that configures a mutex.
type OptionFunc func(*Mutex)

// Apply calls f(mutex)
func (f OptionFunc) Apply(mutex *Mutex) {
	f(mutex)
}

// A DelayFunc is used to decide the amount of time to wait between retries.
type DelayFunc func(tries int) time.Duration

// WithExpiry sets the lock's ttl (default 8 s).
func WithExpiry(expiry time.Duration) Option {
	return OptionFunc(func(m *Mutex) { m.expiry = expiry })
}

// WithTries sets how many tries go-redsync would make (default 32); with the retry delays it
// bounds the wait. 1: no wait (TryLock).
func WithTries(tries int) Option {
	return OptionFunc(func(m *Mutex) { m.tries = tries })
}

// WithRetryDelay sets the delay between go-redsync's tries (default rand(50ms, 250ms)).
func WithRetryDelay(delay time.Duration) Option {
	return OptionFunc(func(m *Mutex) {
		m.delayFunc = func(int) time.Duration { return delay }
	})
}

// WithRetryDelayFunc overrides the delay between tries.
func WithRetryDelayFunc(delayFunc DelayFunc) Option {
	return OptionFunc(func(m *Mutex) { m.delayFunc = delayFunc })
}

// WithDriftFactor sets the clock drift factor (default 0.01): Until is expiry less this share.
func WithDriftFactor(factor float64) Option {
	return OptionFunc(func(m *Mutex) { m.driftFactor = factor })
}

// WithTimeoutFactor is accepted for compatibility; a wait here is bounded by the tries' delays
// and the context.
func WithTimeoutFactor(factor float64) Option {
	return OptionFunc(func(m *Mutex) {})
}

// WithGenValueFunc sets the generator of the lock's value (its owner on the server).
func WithGenValueFunc(genValueFunc func() (string, error)) Option {
	return OptionFunc(func(m *Mutex) { m.genValueFunc = genValueFunc })
}

// WithValue sets the value without locking, so that a lock taken elsewhere with that value can
// be extended or unlocked here.
func WithValue(v string) Option {
	return OptionFunc(func(m *Mutex) { m.value = v })
}

// WithDefaultSession(false) keeps the lock out of the go-redis client's default session (not a
// go-redsync option): it lives by its expiry alone, as go-redsync's do, so a holder that dies
// keeps it until the expiry. By default the lock is also in the client's default session
// (redislock.DefaultSession), and is freed within redislock.DefaultSessionGrace of its process
// dying; the expiry, Extend and Until work as before.
func WithDefaultSession(on bool) Option {
	return OptionFunc(func(m *Mutex) { m.ttlOnly = !on })
}

// WithFailFast is accepted for compatibility.
func WithFailFast(b bool) Option { return OptionFunc(func(m *Mutex) {}) }

// WithShufflePools is accepted for compatibility.
func WithShufflePools(b bool) Option { return OptionFunc(func(m *Mutex) {}) }

// WithSetNXOnExtend is accepted for compatibility: an expired lock is never extended here
// (acquire it again, for a new token).
func WithSetNXOnExtend() Option { return OptionFunc(func(m *Mutex) {}) }
