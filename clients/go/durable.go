package redislock

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"
)

// DefaultDurableTimeout is how long a durable grant waits for its replicas unless
// WithDurable says otherwise.
const DefaultDurableTimeout = time.Second

// ErrNotDurable: fewer replicas than asked acknowledged a grant in time (a *DurabilityError
// says how many, and what became of the grant).
var ErrNotDurable = errors.New("redislock: grant not acknowledged by enough replicas")

// ErrDurableUnsupported: durable grants need Redis 7.0.12 or later (before it, WAIT after a
// blocked grant does not count it).
var ErrDurableUnsupported = errors.New("redislock: durable grants need Redis 7.0.12 or later")

// WithDurable makes every grant wait until n replicas have it (WAIT n timeout on the grant's
// connection; timeout 0: DefaultDurableTimeout), so that a failover right after the grant does
// not lose it. When fewer acknowledge in time the grant is released (unless it was a retry of
// a hold this lock already had, which is kept) and the error is a *DurabilityError.
func WithDurable(n int, timeout time.Duration) Option {
	return func(o *options) { o.durable, o.durableTimeout = n, timeout }
}

// DurabilityError is the error of a grant fewer replicas than asked acknowledged in time.
type DurabilityError struct {
	Key          string
	Acknowledged int64 // WAIT's reply (0 if WAIT failed: Err)
	Wanted       int
	Released     bool  // the grant this call made was given back: nothing is held
	HeldBefore   bool  // a retry of a hold this lock already had: that hold is kept
	MayStayHeld  bool  // the release failed too: the lock may stay held until its ttl
	Err          error // WAIT's or the release's error, if any
}

func (e *DurabilityError) Error() string {
	what := fmt.Sprintf("redislock: %q: %d of %d replicas acknowledged the grant", e.Key, e.Acknowledged, e.Wanted)
	switch {
	case e.HeldBefore:
		what += "; the hold this lock already had is kept"
	case e.MayStayHeld:
		what += fmt.Sprintf("; releasing it failed too (%v): it may stay held until its ttl", e.Err)
	default:
		what += "; the grant was released"
	}
	return what
}

func (e *DurabilityError) Unwrap() []error {
	if e.Err != nil {
		return []error{ErrNotDurable, e.Err}
	}
	return []error{ErrNotDurable}
}

var redisVersion = regexp.MustCompile(`redis_version:(\d+)\.(\d+)\.(\d+)`)

func (h *hold) checkDurable(ctx context.Context) error {
	if h.waits != nil && h.waits.durableOK.Load() {
		return nil
	}
	info, err := h.client.Do(ctx, "INFO", "server").Text()
	if err != nil {
		return err
	}
	m := redisVersion.FindStringSubmatch(info)
	if m == nil {
		return newError([]error{ErrDurableUnsupported}, "redislock: durable: no redis_version in INFO server")
	}
	v := [3]int{}
	for i := range v {
		v[i], _ = strconv.Atoi(m[i+1])
	}
	if v[0] < 7 || v[0] == 7 && v[1] == 0 && v[2] < 12 {
		return newError([]error{ErrDurableUnsupported}, "redislock: durable grants need Redis 7.0.12 or later (WAIT after a blocked grant counts it only from 7.0.12); this server reports %s.%s.%s", m[1], m[2], m[3])
	}
	if h.waits != nil {
		h.waits.durableOK.Store(true)
	}
	return nil
}

// acquireDurable is acquire with WAIT after the grant: the try, the wait and WAIT all on one
// connection of its own (WAIT counts the writes of the connection it is sent on).
func (h *hold) acquireDurable(ctx context.Context, wait, heldBefore bool) error {
	if err := h.checkDurable(ctx); err != nil {
		return err
	}
	blockMs := int64(0)
	if dl, ok := ctx.Deadline(); ok && wait {
		if blockMs = ms(time.Until(dl)); blockMs <= 0 {
			return waitEnded(ctx, h.key())
		}
	}
	timeout := h.opts.durableTimeout
	if timeout <= 0 {
		timeout = DefaultDurableTimeout
	}
	acked := int64(0)
	var waitErr error
	reply, err := onOwnConn(ctx, h.waits, h.client, h.key(), func(bg context.Context, c *redis.Client) (any, error) {
		r, err := c.Do(bg, h.acquireArgs(-1)...).Result()
		if errors.Is(err, redis.Nil) {
			r, err = nil, nil
			if wait {
				r, err = c.Do(bg, h.acquireArgs(blockMs)...).Result()
				if errors.Is(err, redis.Nil) {
					r, err = nil, nil
				}
			}
		}
		if err == nil && r != nil {
			acked, waitErr = c.Do(bg, "WAIT", h.opts.durable, ms(timeout)).Int64()
		}
		return r, err
	})
	if ctx.Err() != nil {
		if !heldBefore {
			h.cleanup(ctx)
		}
		return waitEnded(ctx, h.key())
	}
	if err != nil {
		if !isReplyError(err) && !heldBefore {
			h.cleanup(ctx)
		}
		return err
	}
	if reply == nil {
		if !wait {
			return newError([]error{ErrNotObtained}, "redislock: %q is held by another owner", h.key())
		}
		return newError([]error{ErrTimeout, ErrNotObtained, context.DeadlineExceeded},
			"redislock: %q not obtained: %v", h.key(), context.DeadlineExceeded)
	}
	if acked >= int64(h.opts.durable) && waitErr == nil {
		return h.granted(reply)
	}
	derr := &DurabilityError{Key: h.key(), Acknowledged: acked, Wanted: h.opts.durable, Err: waitErr}
	if heldBefore {
		derr.HeldBefore = true
		if err := h.granted(reply); err != nil {
			return err
		}
		return derr
	}
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
	defer cancel()
	if err := h.client.Do(rctx, h.releaseArgs()...).Err(); err != nil {
		derr.MayStayHeld, derr.Err = true, err
		return derr
	}
	derr.Released = true
	return derr
}
