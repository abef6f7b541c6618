package redislock

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// hold is what every lock type is made of: the commands for its keys and mode, the grant, and
// what watches it while held (its session, or the watchdog and the deadline of a plain hold).
type hold struct {
	client    redis.UniversalClient
	session   *Session      // nil: a plain hold with a deadline of its own
	waits     *waits        // its scope's idle wait connections
	feed      *feed         // its scope's change feed (WithLossFeed)
	keys      []string      // one key, or a MultiLock's keys (the first routes the commands)
	multi     bool          // LOCK.MACQUIRE / LOCK.MRELEASE
	owner     string        // unique per hold object
	shared    bool          // SHARED
	limit     int           // LIMIT n (a semaphore); 0: none
	lockDelay time.Duration // plain holds only: LOCKDELAY
	opts      options
	bare      bool // Acquire: the grant is the caller's to keep; no monitor
	// inDefault: made from a Client without WithDefaultSession(false) or WithLockDelay: each
	// grant is in the go-redis client's default session (dsess), with the hold's own ttl too.
	inDefault bool

	mu       sync.Mutex
	token    int64         // the live hold's token (the largest for a MultiLock); 0: not held
	tokens   []int64       // a MultiLock's tokens, one per key
	done     chan struct{} // closed when the hold ends (released or lost)
	err      error         // why done was closed: nil after a release, else ErrLost
	stop     chan struct{} // closed to stop the monitor goroutine
	stopped  chan struct{} // closed when the monitor goroutine has returned
	deadline time.Time     // a plain hold's deadline as this process knows it
	dsess    *Session      // the default session of the last acquire (inDefault)
}

func newHold(s Scope, keys []string, opts []Option) *hold {
	client, session, w, f := s.scope()
	h := &hold{client: client, session: session, waits: w, feed: f, keys: keys, opts: defaults(session != nil)}
	for _, o := range opts {
		o(&h.opts)
	}
	h.owner = h.opts.owner
	if h.owner == "" {
		h.owner = newOwner()
	}
	h.lockDelay = h.opts.lockDelay
	h.inDefault = session == nil && !h.opts.noDefault && h.lockDelay <= 0
	h.done = make(chan struct{})
	close(h.done) // not held yet: Done() is closed
	return h
}

func (h *hold) key() string { return h.keys[0] }

func (h *hold) acquireArgs(blockMs int64) []any {
	var args []any
	if h.multi {
		args = []any{"LOCK.MACQUIRE", len(h.keys)}
		for _, k := range h.keys {
			args = append(args, k)
		}
		args = append(args, h.owner, ms(h.opts.ttl))
	} else {
		args = []any{"LOCK.ACQUIRE", h.key(), h.owner, ms(h.opts.ttl)}
		if h.shared {
			args = append(args, "SHARED")
			if h.limit > 0 {
				args = append(args, "LIMIT", h.limit)
			}
		}
	}
	if h.session != nil {
		args = append(args, "SESSION", h.session.id)
	} else if ds := h.defaultSession(); ds != nil {
		args = append(args, "SESSION", ds.id)
	} else if h.lockDelay > 0 && !h.multi {
		args = append(args, "LOCKDELAY", ms(h.lockDelay))
	}
	if blockMs >= 0 {
		args = append(args, "BLOCK", blockMs)
	}
	return args
}

func (h *hold) releaseArgs() []any {
	if !h.multi {
		return []any{"LOCK.RELEASE", h.key(), h.owner}
	}
	args := []any{"LOCK.MRELEASE", len(h.keys)}
	for _, k := range h.keys {
		args = append(args, k)
	}
	return append(args, h.owner)
}

func (h *hold) extendArgs(ttl time.Duration) []any {
	if !h.multi {
		return []any{"LOCK.EXTEND", h.key(), h.owner, ms(ttl)}
	}
	args := []any{"EVAL", extendAllLua, len(h.keys)}
	for _, k := range h.keys {
		args = append(args, k)
	}
	return append(args, h.owner, ms(ttl))
}

func (h *hold) check() error {
	if h.session != nil {
		if err := h.session.usable(); err != nil {
			return err
		}
		if h.opts.ttl < 0 {
			return invalid("ttl must not be negative")
		}
		return nil
	}
	if h.opts.ttl <= 0 {
		return invalid("a lock outside a session needs a positive ttl (WithTTL)")
	}
	return nil
}

func (h *hold) defaultSession() *Session {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.dsess
}

// acquire is acquireOnce, in the default session for a hold that joins it: the session of the
// live hold for a retry by its holder, else the go-redis client's live one (opened if need
// be). When the server says that session ended (before the acquire, or while it waited), the
// acquire is made again in a new one, within ctx.
func (h *hold) acquire(ctx context.Context, wait bool) error {
	if !h.inDefault {
		return h.acquireOnce(ctx, wait)
	}
	if err := h.check(); err != nil {
		return err
	}
	var err error
	for attempt := 0; attempt < defaultAttempts; attempt++ {
		h.mu.Lock()
		s := h.dsess
		keep := h.token != 0 && s != nil && s.live()
		h.mu.Unlock()
		if !keep {
			if s, err = DefaultSession(ctx, h.client, h.key()); err != nil {
				if ctx.Err() != nil {
					return waitEnded(ctx, h.key())
				}
				return err
			}
			h.mu.Lock()
			h.dsess = s
			h.mu.Unlock()
		}
		err = h.acquireOnce(ctx, wait)
		if !sessionGone(err) || ctx.Err() != nil {
			return err
		}
		retire(h.client, s)
	}
	return err
}

// acquireOnce takes the hold: one try on the user's client, then (wait) one LOCK.ACQUIRE ... BLOCK
// on a connection of its own, bounded by ctx's deadline. A wait that ctx ends leaves no grant
// behind: its connection is closed (the server drops the waiter, and revokes a grant it could
// not deliver) and a grant that arrived anyway is released.
func (h *hold) acquireOnce(ctx context.Context, wait bool) error {
	if err := h.check(); err != nil {
		return err
	}
	if ctx.Err() != nil {
		return waitEnded(ctx, h.key())
	}
	h.mu.Lock()
	heldBefore := h.token != 0
	h.mu.Unlock()
	if h.opts.durable > 0 {
		return h.acquireDurable(ctx, wait, heldBefore)
	}
	reply, err := h.client.Do(ctx, h.acquireArgs(-1)...).Result()
	if errors.Is(err, redis.Nil) {
		reply, err = nil, nil
	}
	if err != nil {
		if !isReplyError(err) && !heldBefore {
			h.cleanup(ctx)
		}
		if ctx.Err() != nil {
			return waitEnded(ctx, h.key())
		}
		return err
	}
	if reply == nil {
		if !wait {
			return newError([]error{ErrNotObtained}, "redislock: %q is held by another owner", h.key())
		}
		for {
			blockMs := int64(0)
			if dl, ok := ctx.Deadline(); ok {
				if blockMs = ms(time.Until(dl)); blockMs <= 0 {
					return waitEnded(ctx, h.key())
				}
			}
			// The try answered nil, so this object holds nothing there: a grant that raced the
			// end of ctx is this call's own, and cleanup may release it.
			reply, err = waitCall(ctx, h.waits, h.client, h.key(), h.acquireArgs(blockMs))
			if ctx.Err() != nil {
				h.cleanup(ctx)
				return waitEnded(ctx, h.key())
			}
			if err != nil && followable(err) {
				// The server that queued this wait failed over (UNBLOCKED or READONLY on a demoted
				// primary, MOVED, its connection killed by Sentinel or lost): queue again on the
				// node that serves the key now, within ctx, after giving back a grant that may
				// have been made unseen.
				h.cleanup(ctx)
				if cc, ok := h.client.(*redis.ClusterClient); ok {
					cc.ReloadState(ctx)
				}
				select {
				case <-ctx.Done():
					return waitEnded(ctx, h.key())
				case <-time.After(requeueDelay):
				}
				continue
			}
			break
		}
		if err != nil {
			return err
		}
		if reply == nil {
			// The server's BLOCK timeout, computed from ctx's deadline, came a moment first.
			return newError([]error{ErrTimeout, ErrNotObtained, context.DeadlineExceeded},
				"redislock: %q not obtained: %v", h.key(), context.DeadlineExceeded)
		}
	}
	return h.granted(reply)
}

// requeueDelay is how long a wait whose server failed over waits before it queues again.
const requeueDelay = 100 * time.Millisecond

// cleanup releases what an interrupted acquire may have been granted (best effort, bounded).
func (h *hold) cleanup(ctx context.Context) {
	c, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
	defer cancel()
	_ = h.client.Do(c, h.releaseArgs()...).Err()
}

func (h *hold) granted(reply any) error {
	var token int64
	var tokens []int64
	if h.multi {
		list, ok := reply.([]any)
		if !ok || len(list) != len(h.keys) {
			return fmt.Errorf("redislock: unexpected LOCK.MACQUIRE reply %v", reply)
		}
		for _, v := range list {
			t, err := toToken(v)
			if err != nil {
				return err
			}
			tokens = append(tokens, t)
			token = max(token, t)
		}
	} else {
		t, err := toToken(reply)
		if err != nil {
			return err
		}
		token = t
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	h.token, h.tokens = token, tokens
	if h.bare {
		return nil
	}
	if h.session == nil {
		// A hold sent now lasts until now + ttl at the latest (a wait's grant is later still).
		h.deadline = time.Now().Add(h.opts.ttl)
	}
	if h.stop != nil {
		return nil // an idempotent retry of the live hold: its monitor goes on
	}
	h.done = make(chan struct{})
	h.err = nil
	h.stop = make(chan struct{})
	h.stopped = make(chan struct{})
	go h.monitor(h.stop, h.stopped)
	if h.feed != nil && (h.opts.lossFeed == feedOn || h.opts.lossFeed == feedDefault && h.opts.onLost != nil) {
		go h.feed.watch(h)
	}
	return nil
}

// tokenFor is the live hold's token on key (0: none).
func (h *hold) tokenFor(key string) int64 {
	h.mu.Lock()
	defer h.mu.Unlock()
	if !h.multi {
		return h.token
	}
	for i, k := range h.keys {
		if k == key && i < len(h.tokens) {
			return h.tokens[i]
		}
	}
	return 0
}

// feedLost: the feed's LOCK.INFO read no longer lists this hold's token on key.
func (h *hold) feedLost(key string) {
	h.mu.Lock()
	stop := h.stop
	h.mu.Unlock()
	if stop != nil {
		h.lose(stop, "feed: not held (LOCK.INFO no longer lists its token on "+key+")", nil)
	}
}

// monitor watches a live hold until stop is closed: its session's end, or for a plain hold the
// watchdog's renewals (LOCK.EXTEND every ttl/3) and its deadline.
func (h *hold) monitor(stop, stopped chan struct{}) {
	defer close(stopped)
	if h.session != nil {
		select {
		case <-stop:
		case <-h.session.Done():
			if errors.Is(h.session.Err(), ErrSessionClosed) {
				// CLOSE released the hold cleanly: it ended, it was not lost.
				h.end(stop, newError([]error{ErrSessionClosed}, "redislock: %q released: its session was closed", h.key()))
				return
			}
			h.lose(stop, "session lost: "+h.session.reason(), h.session.Err())
		}
		return
	}
	h.mu.Lock()
	deadline, ttl0 := h.deadline, h.opts.ttl
	var sessionDone <-chan struct{} // nil (never ready) outside the default session
	ds := h.dsess
	if h.inDefault && ds != nil {
		sessionDone = ds.Done()
	}
	h.mu.Unlock()
	expiry := time.NewTimer(time.Until(deadline))
	defer expiry.Stop()
	var tick <-chan time.Time
	period := h.opts.renewEvery
	if period <= 0 {
		period = max(ttl0/3, time.Millisecond)
	}
	if h.opts.watchdog {
		t := time.NewTicker(period)
		defer t.Stop()
		tick = t.C
	}
	for {
		select {
		case <-stop:
			return
		case <-sessionDone:
			// The hold's default session ended: the server has ended the hold with it.
			if errors.Is(ds.Err(), ErrSessionClosed) {
				h.end(stop, newError([]error{ErrSessionClosed}, "redislock: %q released: its default session was closed", h.key()))
				return
			}
			h.lose(stop, "session lost: "+ds.reason(), ds.Err())
			return
		case <-expiry.C:
			h.mu.Lock()
			d := h.deadline
			h.mu.Unlock()
			if wait := time.Until(d); wait > 0 { // an Extend moved it
				expiry.Reset(wait)
				continue
			}
			h.lose(stop, "expired: no renewal succeeded before its deadline", nil)
			return
		case <-tick:
			h.mu.Lock()
			ttl := h.opts.ttl
			h.mu.Unlock()
			sent := time.Now()
			ctx, cancel := context.WithTimeout(context.Background(), period)
			n, err := h.client.Do(ctx, h.extendArgs(ttl)...).Int64()
			cancel()
			if err != nil && followable(err) {
				continue // a failover or a lost connection: the next renewal tries again, the deadline bounds it
			}
			if err != nil {
				h.lose(stop, "extend failed: "+err.Error(), err)
				return
			}
			if !h.renewed(n) {
				h.lose(stop, "not held", nil)
				return
			}
			h.mu.Lock()
			if d := sent.Add(ttl); d.After(h.deadline) {
				h.deadline = d
			}
			h.mu.Unlock()
		}
	}
}

func (h *hold) renewed(n int64) bool {
	if h.multi {
		return n == int64(len(h.keys))
	}
	return n == 1
}

// lose ends the hold stop belongs to, once, and reports it.
func (h *hold) lose(stop chan struct{}, reason string, cause error) {
	err := lost(h.key(), reason, cause)
	if !h.end(stop, err) {
		return
	}
	if h.feed != nil {
		h.feed.unwatch(h)
	}
	if h.opts.onLost != nil {
		h.opts.onLost(err)
	}
}

// end ends the hold stop belongs to with err (Done closed, Err set); false if it had ended.
func (h *hold) end(stop chan struct{}, err error) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.stop != stop {
		return false
	}
	h.err = err
	h.token, h.tokens, h.stop = 0, nil, nil
	close(h.done)
	return true
}

// release gives the hold back. ErrNotOwned if this owner held nothing live there.
func (h *hold) release(ctx context.Context) error {
	h.mu.Lock()
	stop, stopped, done := h.stop, h.stopped, h.done
	h.stop = nil
	h.token, h.tokens = 0, nil
	h.mu.Unlock()
	if stop != nil {
		close(stop)
		<-stopped // no renewal in flight from here on
		h.mu.Lock()
		close(done)
		h.mu.Unlock()
		if h.feed != nil {
			h.feed.unwatch(h)
		}
	}
	n, err := h.client.Do(ctx, h.releaseArgs()...).Int64()
	if err != nil {
		return err
	}
	if !h.renewed(n) { // every key of a MultiLock, else some was lost meanwhile
		return newError([]error{ErrNotOwned}, "redislock: %q is not held by %s (%d of %d keys released)", h.key(), h.owner, n, len(h.keys))
	}
	return nil
}

// extend sets a plain hold's deadline to now + ttl (and the watchdog's ttl from then on).
func (h *hold) extend(ctx context.Context, ttl time.Duration) error {
	if h.session != nil {
		return invalid("a hold in a session has no deadline to extend: the session's keepalive covers it")
	}
	if ttl <= 0 {
		return invalid("ttl must be positive")
	}
	sent := time.Now()
	n, err := h.client.Do(ctx, h.extendArgs(ttl)...).Int64()
	if err != nil {
		return err
	}
	h.mu.Lock()
	stop := h.stop
	if h.renewed(n) {
		h.opts.ttl = ttl
		h.deadline = sent.Add(ttl)
		h.mu.Unlock()
		return nil
	}
	h.mu.Unlock()
	if stop != nil {
		h.lose(stop, "not held", nil)
	}
	return newError([]error{ErrNotOwned}, "redislock: %q is not held by %s", h.key(), h.owner)
}

func (h *hold) currentToken() int64 {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.token
}

func (h *hold) doneChan() <-chan struct{} {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.done
}

func (h *hold) lossErr() error {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.err
}

// owned: this hold's token is live (LOCK.FENCE key token).
func (h *hold) owned(ctx context.Context) (bool, error) {
	t := h.currentToken()
	if t == 0 {
		return false, nil
	}
	n, err := h.client.Do(ctx, "LOCK.FENCE", h.key(), t).Int64()
	return n == 1, err
}

// Fenced runs `command key args...` only while token is the live hold on lockKey, atomically
// (LOCK.FENCE inside one EVAL); ErrStaleToken otherwise. The command's reply is returned.
func Fenced(ctx context.Context, client redis.UniversalClient, lockKey string, token int64, command, key string, args ...any) (any, error) {
	if token == 0 {
		return nil, newError([]error{ErrStaleToken}, "redislock: no token: %q is not held", lockKey)
	}
	all := append([]any{"EVAL", fencedCallLua, 2, lockKey, key, token, command}, args...)
	reply, err := client.Do(ctx, all...).Result()
	if errors.Is(err, redis.Nil) {
		return nil, nil
	}
	if err != nil && strings.HasPrefix(err.Error(), "STALE ") {
		return nil, newError([]error{ErrStaleToken, err}, "redislock: %s", err.Error())
	}
	return reply, err
}
