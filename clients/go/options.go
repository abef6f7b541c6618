package redislock

import (
	"context"
	"time"

	"github.com/redis/go-redis/v9"
)

// DefaultTTL is a plain hold's ttl unless WithTTL says otherwise; its watchdog renews it every
// third of it while held.
const DefaultTTL = 30 * time.Second

// Scope is where a lock's holds live: a *Session (the holds end with it; its one keepalive
// covers them all) or a *Client (each hold has a deadline of its own, renewed by a watchdog).
type Scope interface {
	scope() (redis.UniversalClient, *Session, *waits, *feed)
}

// Client makes locks outside an explicit session: each hold has its own ttl, renewed by its
// watchdog while held, and reports a loss on Done()/Err() and WithOnLost. Each hold is also in
// the go-redis client's default session (DefaultSession), so a process that dies frees them
// within DefaultSessionGrace of its connection closing; WithDefaultSession(false) opts out.
type Client struct {
	rdb   redis.UniversalClient
	waits *waits // idle wait connections, reused by the next wait
	feed  *feed  // the change feed its holds' losses are reported by
}

// New wraps a go-redis client (a *redis.Client, a failover client or a *redis.ClusterClient).
// Close it when done: it keeps idle wait connections for the next waits, and Close closes
// rdb's default sessions (shared by every Client made on rdb).
func New(rdb redis.UniversalClient) *Client {
	return &Client{rdb: rdb, waits: &waits{}, feed: &feed{client: rdb}}
}

func (c *Client) scope() (redis.UniversalClient, *Session, *waits, *feed) {
	return c.rdb, nil, c.waits, c.feed
}

// Close closes the idle wait connections, the change feed's, and the default sessions of the
// go-redis client (Close(ctx, rdb), within 2 s; shared by every Client on rdb, so their holds
// end with ErrSessionClosed); not the go-redis client itself. Locks made from it still work:
// their waits dial again, the next acquire opens a new default session, and their losses are
// found by their watchdogs and sessions alone.
func (c *Client) Close() error {
	c.waits.close()
	c.feed.close()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	return Close(ctx, c.rdb)
}

// Info reads a lock's state (LOCK.INFO); nil when it is free.
func (c *Client) Info(ctx context.Context, key string) (*Info, error) {
	return Inspect(ctx, c.rdb, key)
}

// Inspect reads a lock's state (LOCK.INFO); nil when it is free.
func Inspect(ctx context.Context, rdb redis.UniversalClient, key string) (*Info, error) {
	reply, err := rdb.Do(ctx, "LOCK.INFO", key).Result()
	if err == redis.Nil {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	return parseInfo(reply), nil
}

// Acquire takes key for owner with a deadline ttl from now: one try, then, with wait, one
// LOCK.ACQUIRE ... BLOCK on a connection of its own for as long as ctx allows (a wait ctx ends
// leaves nothing held, as Mutex.Lock). It returns the fencing token and watches nothing: the
// caller renews (LOCK.EXTEND key owner ttl) and releases (LOCK.RELEASE key owner) itself. The
// hold is in rdb's default session as well (freed when this process dies) unless opts has
// WithDefaultSession(false); opts may also give WithLockDelay and WithDurable. The building
// block of the redsync package.
func Acquire(ctx context.Context, rdb redis.UniversalClient, key, owner string, ttl time.Duration, wait bool, opts ...Option) (int64, error) {
	c := &Client{rdb: rdb}
	return c.Acquire(ctx, key, owner, ttl, wait, opts...)
}

// Acquire is the package's Acquire, its wait on one of c's wait connections.
func (c *Client) Acquire(ctx context.Context, key, owner string, ttl time.Duration, wait bool, opts ...Option) (int64, error) {
	all := append([]Option{WithOwner(owner), WithTTL(ttl), WithWatchdog(false)}, opts...)
	h := newHold(c, []string{key}, all)
	h.bare = true
	if err := h.acquire(ctx, wait); err != nil {
		return 0, err
	}
	return h.currentToken(), nil
}

// An Option configures a lock.
type Option func(*options)

type options struct {
	owner      string
	ttl        time.Duration
	ttlSet     bool
	lockDelay  time.Duration
	watchdog   bool
	renewEvery time.Duration
	onLost     func(error)

	noDefault      bool          // WithDefaultSession(false)
	lossFeed       int           // feedDefault, feedOn, feedOff
	durable        int           // WAIT for this many replicas after a grant
	durableTimeout time.Duration // how long WAIT waits
}

func defaults(inSession bool) options {
	if inSession {
		return options{} // ttl 0: the hold lasts as long as its session
	}
	return options{ttl: DefaultTTL, watchdog: true}
}

// WithTTL sets the hold's ttl. Outside a session it must be positive (default DefaultTTL); in a
// session it is 0 by default (the hold has no deadline of its own and ends with its session).
func WithTTL(ttl time.Duration) Option {
	return func(o *options) { o.ttl, o.ttlSet = ttl, true }
}

// WithDefaultSession(false) keeps a lock made from a Client out of the go-redis client's
// default session: its holds live by their ttl (and watchdog) alone, as before sessions were
// the default, so a holder that dies keeps them until the ttl runs out. On by default (see
// DefaultSession); it has no effect on a lock made in a Session.
func WithDefaultSession(on bool) Option { return func(o *options) { o.noDefault = !on } }

// WithOwner sets the owner string (default host:pid:random). Keep it unique per holder.
func WithOwner(owner string) Option { return func(o *options) { o.owner = owner } }

// WithLockDelay: after this plain hold expires, nobody is granted what it had for d more
// (LOCKDELAY; 0 to 60 s). A session's holds take the session's (WithSessionLockDelay).
func WithLockDelay(d time.Duration) Option { return func(o *options) { o.lockDelay = d } }

// WithWatchdog turns the watchdog of a plain hold on (the default) or off. Off, the hold ends at
// its ttl unless Extend moves it, and Done() is closed then.
func WithWatchdog(on bool) Option { return func(o *options) { o.watchdog = on } }

// WithRenewEvery sets how often the watchdog renews (default a third of the ttl).
func WithRenewEvery(d time.Duration) Option { return func(o *options) { o.renewEvery = d } }

const (
	feedDefault = iota // on with WithOnLost
	feedOn
	feedOff
)

// WithLossFeed: while held, watch the key's change feed, so that a loss (a DEL, an expiry, a
// takeover) is reported at once rather than at the next renewal. A feed message only makes the
// feed read LOCK.INFO; the hold is lost when that no longer lists its token. On by default
// when WithOnLost is given. It costs each Client or Session two connections per node.
func WithLossFeed(on bool) Option {
	return func(o *options) {
		o.lossFeed = feedOff
		if on {
			o.lossFeed = feedOn
		}
	}
}

// WithOnLost calls f (from the goroutine that found it) once when a hold is lost, with an error
// that matches ErrLost. Done() is closed and Err() set before.
func WithOnLost(f func(error)) Option { return func(o *options) { o.onLost = f } }
