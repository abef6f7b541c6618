package redsync

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"sync"
	"time"

	goredislib "github.com/redis/go-redis/v9"

	redislock "redis-lock/clients/go"
	"redis-lock/clients/go/redsync/redis"
)

// A Mutex is a distributed mutual exclusion lock, held with LOCK.ACQUIRE.
type Mutex struct {
	name   string
	expiry time.Duration

	tries     int
	delayFunc DelayFunc

	driftFactor float64
	quorum      int

	genValueFunc func() (string, error)
	value        string
	until        time.Time
	token        int64

	pools   []redis.Pool
	lockers []*redislock.Client

	ttlOnly bool // WithDefaultSession(false)
}

// lockOptions: the hold in the go-redis client's default session unless WithDefaultSession(false).
func (m *Mutex) lockOptions() []redislock.Option {
	return []redislock.Option{redislock.WithDefaultSession(!m.ttlOnly)}
}

// Name returns mutex name (i.e. the Redis key).
func (m *Mutex) Name() string { return m.name }

// Value returns the current value (the lock's owner on the server). Empty until a lock is
// acquired (or WithValue is used).
func (m *Mutex) Value() string { return m.value }

// Until returns the time of validity of acquired lock. Zero until a lock is acquired.
func (m *Mutex) Until() time.Time { return m.until }

// Token is the fencing token of the last grant (the largest over the pools); 0 before.
func (m *Mutex) Token() int64 { return m.token }

// TryLock only attempts to lock m once and returns immediately regardless of success or failure.
func (m *Mutex) TryLock() error { return m.TryLockContext(context.Background()) }

// TryLockContext only attempts to lock m once and returns immediately regardless of success or
// failure.
func (m *Mutex) TryLockContext(ctx context.Context) error { return m.lockContext(ctx, 1) }

// Lock locks m, waiting in the server's queue for as long as the tries' delays add up to.
func (m *Mutex) Lock() error { return m.LockContext(context.Background()) }

// LockContext locks m, as Lock, and ends the wait when ctx ends.
func (m *Mutex) LockContext(ctx context.Context) error { return m.lockContext(ctx, m.tries) }

// budget is how long go-redsync's tries would have waited between them at most.
func (m *Mutex) budget(tries int) time.Duration {
	var d time.Duration
	for i := 1; i < tries; i++ {
		d += m.delayFunc(i)
	}
	return d
}

func (m *Mutex) lockContext(ctx context.Context, tries int) error {
	if ctx == nil {
		ctx = context.Background()
	}
	value, err := m.genValueFunc()
	if err != nil {
		return err
	}
	if len(m.pools) == 1 {
		return m.lockOne(ctx, tries, value)
	}
	return m.lockQuorum(ctx, tries, value)
}

// lockOne: one server, one wait in its queue.
func (m *Mutex) lockOne(ctx context.Context, tries int, value string) error {
	wait := m.budget(tries)
	start := time.Now()
	wctx, cancel := ctx, context.CancelFunc(func() {})
	if wait > 0 {
		wctx, cancel = context.WithTimeout(ctx, wait)
	}
	defer cancel()
	token, err := m.lockers[0].Acquire(wctx, m.name, value, m.expiry, wait > 0, m.lockOptions()...)
	switch {
	case err == nil:
		m.granted(value, token, start)
		return nil
	case ctx.Err() != nil:
		return &failed{cause: ctx.Err()}
	case errors.Is(err, redislock.ErrNotObtained):
		return &ErrTaken{Nodes: []int{0}}
	}
	return &RedisError{Node: 0, Err: err}
}

func (m *Mutex) granted(value string, token int64, start time.Time) {
	now := time.Now()
	m.value = value
	m.token = token
	m.until = now.Add(m.expiry - now.Sub(start) - time.Duration(float64(m.expiry)*m.driftFactor))
}

// lockQuorum: independent servers, each try without waiting on any, as go-redsync.
func (m *Mutex) lockQuorum(ctx context.Context, tries int, value string) error {
	var lastErr error
	for i := 0; i < tries; i++ {
		if i != 0 {
			t := time.NewTimer(m.delayFunc(i))
			select {
			case <-ctx.Done():
				t.Stop()
				return &failed{cause: ctx.Err()}
			case <-t.C:
			}
		}
		start := time.Now()
		var mu sync.Mutex
		var top int64
		n, err := m.onPools(func(node int, c goredislib.UniversalClient) (bool, error) {
			token, err := redislock.Acquire(ctx, c, m.name, value, m.expiry, false, m.lockOptions()...)
			if errors.Is(err, redislock.ErrNotObtained) && ctx.Err() == nil {
				return false, nil
			}
			mu.Lock()
			top = max(top, token)
			mu.Unlock()
			return err == nil, err
		})
		now := time.Now()
		until := now.Add(m.expiry - now.Sub(start) - time.Duration(float64(m.expiry)*m.driftFactor))
		if n >= m.quorum && now.Before(until) {
			m.granted(value, top, start)
			return nil
		}
		_, _ = m.onPools(func(node int, c goredislib.UniversalClient) (bool, error) {
			return release(context.WithoutCancel(ctx), c, m.name, value)
		})
		lastErr = err
	}
	if lastErr != nil {
		return lastErr
	}
	return ErrFailed
}

// onPools runs act on every pool at once; how many said true, and the errors as go-redsync
// reports them (ErrTaken when a quorum is held by others).
func (m *Mutex) onPools(act func(node int, c goredislib.UniversalClient) (bool, error)) (int, error) {
	type result struct {
		node int
		ok   bool
		err  error
	}
	ch := make(chan result, len(m.pools))
	for node, pool := range m.pools {
		go func(node int, c goredislib.UniversalClient) {
			ok, err := act(node, c)
			ch <- result{node, ok, err}
		}(node, pool.Client())
	}
	n := 0
	var taken []int
	var err error
	for range m.pools {
		r := <-ch
		switch {
		case r.ok:
			n++
		case r.err == ErrLockAlreadyExpired:
			err = errors.Join(err, ErrLockAlreadyExpired)
		case r.err != nil:
			err = errors.Join(err, &RedisError{Node: r.node, Err: r.err})
		default:
			taken = append(taken, r.node)
			err = errors.Join(err, &ErrNodeTaken{Node: r.node})
		}
	}
	if len(taken) >= m.quorum {
		return n, &ErrTaken{Nodes: taken}
	}
	return n, err
}

func release(ctx context.Context, c goredislib.UniversalClient, name, value string) (bool, error) {
	n, err := c.Do(ctx, "LOCK.RELEASE", name, value).Int64()
	if err != nil {
		return false, err
	}
	if n == 0 {
		return false, ErrLockAlreadyExpired
	}
	return true, nil
}

// Unlock unlocks m and returns the status of unlock.
func (m *Mutex) Unlock() (bool, error) { return m.UnlockContext(context.Background()) }

// UnlockContext unlocks m (LOCK.RELEASE: the first waiter is granted it at once).
func (m *Mutex) UnlockContext(ctx context.Context) (bool, error) {
	n, err := m.onPools(func(_ int, c goredislib.UniversalClient) (bool, error) {
		return release(ctx, c, m.name, m.value)
	})
	if n < m.quorum {
		return false, err
	}
	return true, nil
}

// Extend resets the mutex's expiry and returns the status of expiry extension.
func (m *Mutex) Extend() (bool, error) { return m.ExtendContext(context.Background()) }

// ExtendContext resets the mutex's expiry (LOCK.EXTEND); the token stays the same.
func (m *Mutex) ExtendContext(ctx context.Context) (bool, error) {
	start := time.Now()
	n, err := m.onPools(func(_ int, c goredislib.UniversalClient) (bool, error) {
		if m.value == "" {
			return false, nil
		}
		r, err := c.Do(ctx, "LOCK.EXTEND", m.name, m.value, m.expiry.Milliseconds()).Int64()
		return r == 1, err
	})
	if n < m.quorum {
		if err == nil {
			err = ErrExtendFailed
		}
		return false, err
	}
	now := time.Now()
	until := now.Add(m.expiry - now.Sub(start) - time.Duration(float64(m.expiry)*m.driftFactor))
	if now.Before(until) {
		m.until = until
		return true, nil
	}
	return false, ErrExtendFailed
}

// Valid returns true if the lock acquired through m is still held by its value.
//
// Deprecated: Use Until instead (as go-redsync says).
func (m *Mutex) Valid() (bool, error) { return m.ValidContext(context.Background()) }

// ValidContext returns true if m's value holds the lock on a quorum of pools (LOCK.INFO).
//
// Deprecated: Use Until instead (as go-redsync says).
func (m *Mutex) ValidContext(ctx context.Context) (bool, error) {
	n, err := m.onPools(func(_ int, c goredislib.UniversalClient) (bool, error) {
		if m.value == "" {
			return false, nil
		}
		info, err := redislock.Inspect(ctx, c, m.name)
		if err != nil || info == nil {
			return false, err
		}
		for _, h := range info.Holders {
			if h.Owner == m.value {
				return true, nil
			}
		}
		return false, nil
	})
	return n >= m.quorum, err
}

func genValue() (string, error) {
	b := make([]byte, 16)
	if _, err := rand.Read(b); err != nil {
		return "", err
	}
	return base64.StdEncoding.EncodeToString(b), nil
}
