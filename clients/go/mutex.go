package redislock

import (
	"context"
	"time"
)

// Mutex is an exclusive lock on one key (etcd's concurrency.Mutex shape). Made with a *Session
// its hold ends with the session; made with a *Client it has a ttl of its own and a watchdog.
// A Mutex is one holder: use one per goroutine that competes for the lock.
type Mutex struct{ h *hold }

// NewMutex is an exclusive lock named name, in s (a *Session or a *Client).
func NewMutex(s Scope, name string, opts ...Option) *Mutex {
	return &Mutex{h: newHold(s, []string{name}, opts)}
}

// Lock waits in the key's FIFO queue until granted: one LOCK.ACQUIRE ... BLOCK on a connection
// of its own, for as long as ctx allows. When ctx ends first nothing stays held, and the error
// matches ctx's error (and ErrTimeout for a deadline).
func (m *Mutex) Lock(ctx context.Context) error { return m.h.acquire(ctx, true) }

// TryLock takes the lock if it is free now (nobody holds it and nobody waits); else an error
// matching ErrNotObtained.
func (m *Mutex) TryLock(ctx context.Context) error { return m.h.acquire(ctx, false) }

// Unlock gives the lock back; the first waiter is granted it. ErrNotOwned if this owner did not
// hold it (never taken, or lost meanwhile).
func (m *Mutex) Unlock(ctx context.Context) error { return m.h.release(ctx) }

// Extend sets a plain hold's deadline to now + ttl (the watchdog renews with ttl from then on).
// ErrNotOwned if the hold was lost: acquire again, for a new token.
func (m *Mutex) Extend(ctx context.Context, ttl time.Duration) error { return m.h.extend(ctx, ttl) }

// Key is the lock's key.
func (m *Mutex) Key() string { return m.h.key() }

// Owner is the owner string this Mutex acquires with.
func (m *Mutex) Owner() string { return m.h.owner }

// Token is the live hold's fencing token; 0 when not held.
func (m *Mutex) Token() int64 { return m.h.currentToken() }

// Done is closed when the hold ends (released or lost); closed while not held.
func (m *Mutex) Done() <-chan struct{} { return m.h.doneChan() }

// Err is why the last hold ended: nil after Unlock (or while held), an ErrLost error after a
// loss, ErrSessionClosed after its session's Close released it.
func (m *Mutex) Err() error { return m.h.lossErr() }

// IsOwner asks the server whether this hold's token is live (LOCK.FENCE key token).
func (m *Mutex) IsOwner(ctx context.Context) (bool, error) { return m.h.owned(ctx) }

// Fenced runs `command key args...` only while this hold is live, in one atomic step on the
// server; ErrStaleToken otherwise. In a cluster key must share the lock's slot (a hash tag).
func (m *Mutex) Fenced(ctx context.Context, command, key string, args ...any) (any, error) {
	return Fenced(ctx, m.h.client, m.h.key(), m.Token(), command, key, args...)
}

// Semaphore lets at most limit holders hold the key at once (LOCK.ACQUIRE ... SHARED LIMIT n);
// everyone using the key must give the same limit. Each holder has its own token.
type Semaphore struct{ Mutex }

// NewSemaphore is a counting semaphore of limit permits named name, in s.
func NewSemaphore(s Scope, name string, limit int, opts ...Option) *Semaphore {
	h := newHold(s, []string{name}, opts)
	h.shared, h.limit = true, max(limit, 1)
	return &Semaphore{Mutex{h: h}}
}

// Acquire waits (FIFO) for a permit, as Mutex.Lock.
func (s *Semaphore) Acquire(ctx context.Context) error { return s.h.acquire(ctx, true) }

// TryAcquire takes a permit if one is free now; else ErrNotObtained.
func (s *Semaphore) TryAcquire(ctx context.Context) error { return s.h.acquire(ctx, false) }

// Release gives the permit back.
func (s *Semaphore) Release(ctx context.Context) error { return s.h.release(ctx) }

// RWMutex is a read/write lock on one key: any number of readers (SHARED) or one writer, in
// one FIFO queue (a writer is never overtaken by later readers). Its read and write sides are
// holders of their own (owner:read, owner:write); there is no upgrade or downgrade.
type RWMutex struct {
	r, w *Mutex
}

// NewRWMutex is a read/write lock named name, in s.
func NewRWMutex(s Scope, name string, opts ...Option) *RWMutex {
	r := newHold(s, []string{name}, opts)
	w := newHold(s, []string{name}, opts)
	owner := r.owner
	r.owner, w.owner = owner+":read", owner+":write"
	r.shared = true
	return &RWMutex{r: &Mutex{h: r}, w: &Mutex{h: w}}
}

// Lock waits for the write side (exclusive).
func (rw *RWMutex) Lock(ctx context.Context) error { return rw.w.Lock(ctx) }

// TryLock takes the write side if free now.
func (rw *RWMutex) TryLock(ctx context.Context) error { return rw.w.TryLock(ctx) }

// Unlock releases the write side.
func (rw *RWMutex) Unlock(ctx context.Context) error { return rw.w.Unlock(ctx) }

// RLock waits for the read side (shared).
func (rw *RWMutex) RLock(ctx context.Context) error { return rw.r.Lock(ctx) }

// TryRLock takes the read side if it can be had now.
func (rw *RWMutex) TryRLock(ctx context.Context) error { return rw.r.TryLock(ctx) }

// RUnlock releases the read side.
func (rw *RWMutex) RUnlock(ctx context.Context) error { return rw.r.Unlock(ctx) }

// Writer is the write side as a Mutex (its Token, Done, Err, Fenced).
func (rw *RWMutex) Writer() *Mutex { return rw.w }

// Reader is the read side as a Mutex.
func (rw *RWMutex) Reader() *Mutex { return rw.r }

// MultiLock is exclusive locks on several keys, all or none (LOCK.MACQUIRE): a wait joins every
// key's queue at once, so sets never deadlock. In a cluster the keys need one hash tag.
type MultiLock struct{ h *hold }

// NewMultiLock is exclusive locks on every key of names, in s.
func NewMultiLock(s Scope, names []string, opts ...Option) *MultiLock {
	h := newHold(s, append([]string(nil), names...), opts)
	h.multi = true
	return &MultiLock{h: h}
}

// Lock waits until every key is granted, as Mutex.Lock.
func (m *MultiLock) Lock(ctx context.Context) error {
	if len(m.h.keys) == 0 {
		return invalid("a MultiLock needs at least one key")
	}
	return m.h.acquire(ctx, true)
}

// TryLock takes every key if all are free now; else ErrNotObtained.
func (m *MultiLock) TryLock(ctx context.Context) error {
	if len(m.h.keys) == 0 {
		return invalid("a MultiLock needs at least one key")
	}
	return m.h.acquire(ctx, false)
}

// Unlock releases every key (LOCK.MRELEASE); ErrNotOwned unless all were held.
func (m *MultiLock) Unlock(ctx context.Context) error { return m.h.release(ctx) }

// Extend sets every key's deadline to now + ttl (plain holds).
func (m *MultiLock) Extend(ctx context.Context, ttl time.Duration) error {
	return m.h.extend(ctx, ttl)
}

// Keys are the locks' keys.
func (m *MultiLock) Keys() []string { return append([]string(nil), m.h.keys...) }

// Tokens are the fencing tokens, one per key in the order of Keys; nil when not held.
func (m *MultiLock) Tokens() []int64 {
	m.h.mu.Lock()
	defer m.h.mu.Unlock()
	return append([]int64(nil), m.h.tokens...)
}

// Done is closed when the hold ends.
func (m *MultiLock) Done() <-chan struct{} { return m.h.doneChan() }

// Err is why the last hold ended (nil after Unlock).
func (m *MultiLock) Err() error { return m.h.lossErr() }
