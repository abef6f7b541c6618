package redislock

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// DefaultSessionTTL is how long a session lives without a keepalive unless WithSessionTTL says
// otherwise (its keepalive runs every third of it unless WithKeepalivePeriod says otherwise).
const DefaultSessionTTL = 10 * time.Second

// Session is one lease for many holds (LOCK.SESSION), as an etcd session is one lease: one
// keepalive goroutine renews it however many locks it holds, and Done() is closed when it ends.
//
// By default it is BOUND: opened on a connection of its own, which the server ends the session
// with the moment it closes (the process died, the network dropped), so another process is
// granted its locks at once. That connection carries only the keepalives; when it drops, the
// session is looked for again on a new connection (LOCK.SESSION ATTACH): with WithGrace the
// server keeps it that long for this, without it the server has ended it and the session is
// lost. Locks made from a Client (New) join the client's default session (DefaultSession).
type Session struct {
	client    redis.UniversalClient
	key       string        // WithSessionKey: the key whose node serves the session (a cluster)
	node      *redis.Client // the session's own client, for the node that serves it
	conn      *redis.Conn   // a bound session's connection
	id        string
	serial    int64 // learnt by a bound session when it opens (0: not known)
	ttl       time.Duration
	period    time.Duration // between two keepalives (WithKeepalivePeriod, or a third of the ttl)
	lockDelay time.Duration
	bound     bool
	owner     redis.UniversalClient // a default session's go-redis client; nil for NewSession's

	done      chan struct{}
	mu        sync.Mutex
	err       error  // why it ended: ErrLost or ErrSessionClosed
	why       string // the loss reason, for the holds' errors
	closing   bool
	keepalive chan struct{} // closed when the keepalive goroutine has returned
	stop      chan struct{}
	raw       atomic.Pointer[net.Conn] // a bound session's socket, as dialled
	connMu    sync.Mutex               // held by each call on conn (or node), and by closing them
	lastOK    time.Time                // when the last keepalive that succeeded was sent (keepalive goroutine)
	waits     *waits                   // idle wait connections of its locks
	feed      *feed                    // the change feed its holds' losses are reported by
}

// A SessionOption configures a session.
type SessionOption func(*sessionOptions)

type sessionOptions struct {
	ttl       time.Duration
	period    time.Duration // WithKeepalivePeriod; 0: not given (a third of the ttl)
	periodSet bool
	lockDelay time.Duration
	unbound   bool
	key       string
	grace     time.Duration
	owner     redis.UniversalClient // a default session's go-redis client
}

// withOwner makes the session rdb's default session: its keepalive ends it (Close(ctx, rdb))
// when it finds rdb closed.
func withOwner(rdb redis.UniversalClient) SessionOption {
	return func(o *sessionOptions) { o.owner = rdb }
}

// WithSessionTTL sets how long the session lives without a keepalive (default 10 s).
func WithSessionTTL(ttl time.Duration) SessionOption {
	return func(o *sessionOptions) { o.ttl = ttl }
}

// WithKeepalivePeriod sends the session's keepalive every d instead of every third of its ttl
// (at least 1 ms). d must be positive and shorter than the ttl (NewSession refuses it with
// ErrInvalidArgument otherwise). The keepalive call itself must be answered within it. A
// planned failover (the old master demoted, its connections left open) is noticed by the next
// keepalive, which meets MOVED or READONLY: a shorter period finds the session on its new node
// sooner, for a keepalive more often.
func WithKeepalivePeriod(d time.Duration) SessionOption {
	return func(o *sessionOptions) { o.period, o.periodSet = d, true }
}

// WithSessionLockDelay: after the session is lost uncleanly (expired, or its bound connection
// closed), nobody is granted what its holds had for d more (0 to 60 s).
func WithSessionLockDelay(d time.Duration) SessionOption {
	return func(o *sessionOptions) { o.lockDelay = d }
}

// WithGrace lets a BOUND session outlive its connection by d (LOCK.SESSION OPEN ... BOUND
// GRACE ms; 0 to 60 s, at most the ttl): when the connection drops while the process lives (a
// CLIENT KILL, a proxy or the network closing it) the server keeps the session detached for d,
// and the keepalive, which sees the close within 50 ms, binds it to a new connection
// (LOCK.SESSION ATTACH) with every hold. Without it (the default for NewSession) a dropped
// connection ends the session at once. The client's default session has DefaultSessionGrace.
func WithGrace(d time.Duration) SessionOption { return func(o *sessionOptions) { o.grace = d } }

// WithUnbound opens a session that lives by its ttl alone (not BOUND to a connection).
func WithUnbound() SessionOption { return func(o *sessionOptions) { o.unbound = true } }

// WithSessionKey names a key the session will lock: in a cluster a session belongs to one node,
// the node that serves this key (and every key it locks must be served there).
func WithSessionKey(key string) SessionOption { return func(o *sessionOptions) { o.key = key } }

// NewSession opens a session (LOCK.SESSION OPEN ttl [BOUND] [LOCKDELAY ms]) and starts its
// keepalive.
func NewSession(ctx context.Context, client redis.UniversalClient, opts ...SessionOption) (*Session, error) {
	o := sessionOptions{ttl: DefaultSessionTTL}
	for _, f := range opts {
		f(&o)
	}
	if o.ttl <= 0 {
		return nil, invalid("the session ttl must be positive")
	}
	period := max(o.ttl/3, time.Millisecond)
	if o.periodSet {
		if o.period <= 0 {
			return nil, invalid(fmt.Sprintf("the keepalive period must be positive, got %v", o.period))
		}
		if o.period >= o.ttl {
			return nil, invalid(fmt.Sprintf("the keepalive period must be shorter than the session ttl (%v), got %v", o.ttl, o.period))
		}
		period = max(o.period, time.Millisecond)
	}
	if _, ok := client.(*redis.ClusterClient); ok && o.key == "" {
		return nil, invalid("a session in a cluster belongs to one node: name a key it will lock (WithSessionKey)")
	}
	s := &Session{client: client, owner: o.owner, key: o.key, ttl: o.ttl, period: period, lockDelay: o.lockDelay, bound: !o.unbound,
		done: make(chan struct{}), stop: make(chan struct{}), keepalive: make(chan struct{}), waits: &waits{}, feed: &feed{client: client}}
	node, err := s.newNode(ctx, "")
	if err != nil {
		return nil, err
	}
	s.node = node
	args := []any{"LOCK.SESSION", "OPEN", ms(o.ttl)}
	if s.bound {
		args = append(args, "BOUND")
		if o.grace > 0 {
			args = append(args, "GRACE", ms(o.grace))
		}
		s.conn = s.node.Conn()
	}
	opened := time.Now()
	if o.lockDelay > 0 {
		args = append(args, "LOCKDELAY", ms(o.lockDelay))
	}
	id, err := s.call(ctx, args...).Text()
	if err != nil {
		s.closeConns()
		return nil, err
	}
	s.id = id
	s.lastOK = opened
	if s.bound {
		s.nameAfterSerial(ctx, s.conn)
	}
	go s.keepAlive()
	return s, nil
}

// newNode is a one-connection client for the node that serves the session (the user's client's
// node, a failover client's current primary, a cluster's master for the session's key). A
// bound session's socket is kept as it is dialled, so that the keepalive goroutine sees it
// close at once (a CLIENT KILL, the server gone, a failover), not at the next keepalive. at,
// when not "", is the address a cluster node's MOVED named: that node instead of the map's.
func (s *Session) newNode(ctx context.Context, at string) (*redis.Client, error) {
	o, err := nodeOptions(ctx, s.client, s.key, at)
	if err != nil {
		return nil, err
	}
	// The user's ReadTimeout/WriteTimeout is for the user's commands: a shorter one would cut
	// the session's own calls (an OPEN, a CLOSE with no deadline), and a cut call closes a bound
	// session's connection. Its calls are bounded by their contexts, and by the ttl at most.
	for _, t := range []*time.Duration{&o.ReadTimeout, &o.WriteTimeout} {
		if *t > 0 && *t < s.ttl {
			*t = s.ttl
		}
	}
	if s.bound {
		dial := o.Dialer
		o.Dialer = func(ctx context.Context, network, addr string) (net.Conn, error) {
			c, err := dial(ctx, network, addr)
			if err == nil {
				s.raw.Store(&c)
			}
			return c, err
		}
	}
	return dedicatedFrom(o, false), nil
}

func (s *Session) scope() (redis.UniversalClient, *Session, *waits, *feed) {
	return s.client, s, s.waits, s.feed
}

func (s *Session) call(ctx context.Context, args ...any) *redis.Cmd {
	s.connMu.Lock()
	defer s.connMu.Unlock()
	if s.conn != nil {
		return s.conn.Do(ctx, args...)
	}
	return s.node.Do(ctx, args...)
}

func (s *Session) closeConns() {
	s.waits.close()
	s.feed.close()
	// After any call in flight on the connection (go-redis's Close must not race its use).
	s.connMu.Lock()
	defer s.connMu.Unlock()
	if s.conn != nil {
		_ = s.conn.Close()
	}
	_ = s.node.Close()
}

// nameAfterSerial names the bound connection redislock-session-<serial> (the serial from
// LOCK.SESSION INFO; never the id), so that CLIENT LIST says whose it is. Best effort: a server
// without the serial, or a user refused CLIENT SETNAME, leaves it unnamed.
func (s *Session) nameAfterSerial(ctx context.Context, conn *redis.Conn) {
	c, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.ttl)
	defer cancel()
	reply, err := conn.Do(c, "LOCK.SESSION", "INFO", s.id).Result()
	if err != nil {
		return
	}
	serial, ok := fields(reply)["serial"]
	if !ok {
		return
	}
	s.serial = toInt(serial)
	setName(c, conn, fmt.Sprintf("%s%d", sessionName, s.serial))
}

// Serial is the session's serial, what LOCK.SESSION LIST and LOCK.INFO show (never the id): a
// bound session learns it when it opens and names its connection redislock-session-<serial>.
// 0 for an unbound session, or a server that does not say it.
func (s *Session) Serial() int64 { return s.serial }

// ID is the session id (a secret: whoever knows it can lock in the session's name).
func (s *Session) ID() string { return s.id }

// TTL is how long the session lives without a keepalive.
func (s *Session) TTL() time.Duration { return s.ttl }

// Done is closed when the session ends: lost, or closed.
func (s *Session) Done() <-chan struct{} { return s.done }

// Err is nil while the session lives; then an error matching ErrLost (with the reason) or
// ErrSessionClosed.
func (s *Session) Err() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.err
}

func (s *Session) reason() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.why
}

// live: not ended and not being closed (a default session fit for new holds).
func (s *Session) live() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.err == nil && !s.closing
}

func (s *Session) usable() error {
	if err := s.Err(); err != nil {
		return err
	}
	return nil
}

// connCheckEvery is how often a bound session looks whether its connection was closed by the
// server (a non-blocking peek at the socket: no traffic).
const connCheckEvery = 50 * time.Millisecond

func (s *Session) keepAlive() {
	defer close(s.keepalive)
	period := s.period
	t := time.NewTicker(period)
	defer t.Stop()
	var check <-chan time.Time
	if s.bound {
		c := time.NewTicker(connCheckEvery)
		defer c.Stop()
		check = c.C
	}
	for {
		select {
		case <-s.stop:
			return
		case <-check:
			if raw := s.raw.Load(); raw != nil && closedByPeer(*raw) {
				if !s.follow("its bound connection was closed", io.EOF) {
					return
				}
			}
			continue
		case <-t.C:
		}
		if s.ownerClosed() {
			go s.closeWithOwner()
			return
		}
		sent := time.Now()
		ctx, cancel := context.WithTimeout(context.Background(), period)
		_, err := s.call(ctx, "LOCK.SESSION", "KEEPALIVE", s.id).Int64()
		cancel()
		select {
		case <-s.stop: // closed meanwhile: not a loss
			return
		default:
		}
		switch {
		case err == nil:
			s.lastOK = sent
		case errors.Is(err, redis.Nil):
			s.end("ended (expired, closed elsewhere, or its bound connection closed)", nil)
			return
		case followable(err):
			if !s.follow("keepalive failed: "+err.Error(), err) {
				return
			}
		default:
			s.end("keepalive failed: "+err.Error(), err)
			return
		}
	}
}

// followRetry is how long the session waits between two tries to find its server again.
const followRetry = 100 * time.Millisecond

// follow finds the session again after its connection failed or its server answered as one
// that no longer serves it (READONLY, MOVED, UNBLOCKED: a failover), on a new connection to the
// node that serves it now: a failover client's current primary (asked of its Sentinels), a
// cluster's master for the session's key (the node the last MOVED named, if any: go-redis
// reloads its map of the slots in the background, not again within 200 ms of a reload, so the
// map may name the old master for a few tries), or the same server. A bound session asks to be
// bound to the new connection (LOCK.SESSION ATTACH), an unbound one sends its keepalive. The
// server decides: nil is a loss (a live primary ends a bound session the moment its connection
// closes, so a killed connection is a lost session), OK means it lives there, with every hold.
// Tried until the session's ttl from its last keepalive; any other refusal (ATTACH while the
// server still sees the old connection open) is a loss. False when the session ended.
func (s *Session) follow(why string, cause error) bool {
	deadline := s.lastOK.Add(s.ttl)
	for {
		select {
		case <-s.stop: // closed meanwhile: not a loss
			return false
		default:
		}
		if s.ownerClosed() {
			s.end(why+"; its go-redis client was closed", redis.ErrClosed)
			return false
		}
		if !time.Now().Before(deadline) {
			s.end(why+"; no server took the session back within its ttl (last: "+cause.Error()+")", cause)
			return false
		}
		if cc, ok := s.client.(*redis.ClusterClient); ok {
			cc.ReloadState(context.Background())
		}
		// Each try within a keepalive period (a write-paused old primary would hold it the
		// whole ttl), and within the ttl.
		ctx, cancel := context.WithDeadline(context.Background(), deadline)
		ctx, cancelTry := context.WithTimeout(ctx, max(s.period, followRetry))
		go func() { // Close does not wait for a try's deadline
			select {
			case <-s.stop:
				cancel()
			case <-ctx.Done():
			}
		}()
		at := ""
		if _, ok := s.client.(*redis.ClusterClient); ok {
			at = movedTo(cause)
		}
		sent := time.Now()
		node, conn, err := s.rebind(ctx, at)
		cancelTry()
		cancel()
		switch {
		case err == nil:
			s.connMu.Lock()
			old, oldConn := s.node, s.conn
			s.node, s.conn = node, conn
			s.connMu.Unlock()
			if oldConn != nil {
				_ = oldConn.Close()
			}
			_ = old.Close()
			s.lastOK = sent
			return true
		case errors.Is(err, redis.Nil):
			s.end(why+"; the server has ended the session", cause)
			return false
		case !followable(err):
			s.end(why+"; the server refused it back: "+err.Error(), err)
			return false
		}
		cause = err
		select {
		case <-s.stop:
			return false
		case <-time.After(followRetry):
		}
	}
}

// rebind opens a connection to the node that serves the session now (at, if not "": the node a
// MOVED named) and binds the session to it (ATTACH; an unbound session's KEEPALIVE). The
// connections are closed on an error.
func (s *Session) rebind(ctx context.Context, at string) (*redis.Client, *redis.Conn, error) {
	node, err := s.newNode(ctx, at)
	if err != nil {
		return nil, nil, err
	}
	if !s.bound {
		if err := node.Do(ctx, "LOCK.SESSION", "KEEPALIVE", s.id).Err(); err != nil {
			_ = node.Close()
			return nil, nil, err
		}
		return node, nil, nil
	}
	conn := node.Conn()
	if err := conn.Do(ctx, "LOCK.SESSION", "ATTACH", s.id).Err(); err != nil {
		_ = conn.Close()
		_ = node.Close()
		return nil, nil, err
	}
	s.nameAfterSerial(ctx, conn)
	return node, conn, nil
}

// ownerClosed: a default session whose go-redis client was closed (go-redis has no close
// hook: a PING through it answers ErrClosed without a round trip once it is closed).
func (s *Session) ownerClosed() bool {
	if s.owner == nil {
		return false
	}
	ctx, cancel := context.WithTimeout(context.Background(), followRetry)
	defer cancel()
	return errors.Is(s.owner.Ping(ctx).Err(), redis.ErrClosed)
}

// closeWithOwner closes the default sessions of a go-redis client found closed (from a
// goroutine of its own: Close waits for the keepalive to return).
func (s *Session) closeWithOwner() {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	_ = Close(ctx, s.owner)
	_ = s.Close(ctx) // if it was no longer in the registry
}

// end records the session's loss once and closes Done().
func (s *Session) end(reason string, cause error) {
	s.mu.Lock()
	if s.err != nil {
		s.mu.Unlock()
		return
	}
	errs := []error{ErrLost}
	if cause != nil {
		errs = append(errs, cause)
	}
	s.why = reason
	s.err = newError(errs, "redislock: session lost: %s", reason)
	s.mu.Unlock()
	s.closeConns() // the server ends a bound session it still had
	close(s.done)
}

// Close ends the session (LOCK.SESSION CLOSE): every hold of it is released, with no
// lock-delay. Done() is closed.
func (s *Session) Close(ctx context.Context) error {
	_, err := s.CloseCount(ctx)
	return err
}

// CloseCount is Close, with how many holds the server released (0 if the session had ended
// before, or was closed already).
func (s *Session) CloseCount(ctx context.Context) (int64, error) {
	s.mu.Lock()
	if s.err != nil || s.closing {
		s.mu.Unlock()
		return 0, nil
	}
	s.closing = true
	s.mu.Unlock()
	close(s.stop)
	<-s.keepalive
	released, err := s.call(ctx, "LOCK.SESSION", "CLOSE", s.id).Int64()
	if errors.Is(err, redis.Nil) {
		released, err = 0, nil
	}
	s.mu.Lock()
	lostMeanwhile := s.err != nil
	if !lostMeanwhile {
		s.why = "closed"
		s.err = newError([]error{ErrSessionClosed}, "redislock: session closed")
	}
	s.mu.Unlock()
	if !lostMeanwhile {
		s.closeConns()
		close(s.done)
	}
	if err != nil {
		return 0, fmt.Errorf("redislock: LOCK.SESSION CLOSE: %w", err)
	}
	return released, nil
}

// SessionInfo is LOCK.SESSION INFO's reply.
type SessionInfo struct {
	TTL       time.Duration
	Bound     int64 // the bound client's id; 0: not bound
	LockDelay time.Duration
	Holds     int64
	Serial    int64         // what LOCK.SESSION LIST and LOCK.INFO show for it
	Grace     time.Duration // BOUND GRACE (0: none)
	// Detached is how long a connection still has to ATTACH the session while it is detached
	// (its bound connection closed, its grace running); -1 while it is not detached.
	Detached time.Duration
}

// Info reads the session's state from the server; nil if the server has no such session. It
// runs on the session's own connection and waits for the reply however ctx ends (up to the
// session's ttl), since cutting a bound session's connection ends the session.
func (s *Session) Info(ctx context.Context) (*SessionInfo, error) {
	// Not cut by ctx: on a bound session's connection a cancelled call would close the
	// connection, and the server would end the session with it.
	c, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.ttl)
	defer cancel()
	reply, err := s.call(c, "LOCK.SESSION", "INFO", s.id).Result()
	if errors.Is(err, redis.Nil) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	f := fields(reply)
	detached := -time.Millisecond
	if d, ok := f["detached"]; ok && d != nil {
		detached = time.Duration(toInt(d)) * time.Millisecond
	}
	return &SessionInfo{
		TTL:       time.Duration(toInt(f["ttl"])) * time.Millisecond,
		Bound:     toInt(f["bound"]),
		LockDelay: time.Duration(toInt(f["lockdelay"])) * time.Millisecond,
		Holds:     toInt(f["holds"]),
		Serial:    toInt(f["serial"]),
		Grace:     time.Duration(toInt(f["grace"])) * time.Millisecond,
		Detached:  detached,
	}, nil
}
