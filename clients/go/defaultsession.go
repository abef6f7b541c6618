package redislock

import (
	"context"
	"errors"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// The default session: what a lock made from a Client (New) joins.
//
// Every Mutex, Semaphore, RWMutex side, MultiLock and Election made from a *Client, and the
// bare Acquire (so the redsync drop-in), holds in the default session of the go-redis client
// it was made on: one BOUND session per go-redis client and node (per cluster master, opened
// there with the key's slot), opened by the first acquire that needs it and kept alive by one
// keepalive goroutine for all its holds. So a process that dies (exits, crashes, kill -9)
// frees everything it held the moment the server sees its connection close, plus the grace,
// instead of when each hold's ttl runs out.
//
// Nothing else changes for the lock: it sends its own ttl with SESSION id (LOCK.ACQUIRE key
// owner ttl-ms SESSION id), so the hold keeps its own deadline, and the watchdog, Extend and
// WithDurable work as without a session. WithDefaultSession(false) keeps the ttl-only hold
// exactly; WithLockDelay also means no default session (a session's lock-delay is the
// session's, one for all its holds, and a hold in a session cannot have its own: such a lock
// holds by its ttl alone, as before).
//
// The session has ttl DefaultSessionTTL (10 s; a keepalive every third: the bound for a
// holder whose host vanished without closing its connection) and GRACE DefaultSessionGrace:
// when its connection drops while the process lives, the server keeps it detached that long
// and the keepalive, which peeks at the connection every 50 ms, ATTACHes it on a new one, so
// every hold is kept. If the server has ended it by then (ATTACH answers nil) it is lost and
// every hold in it reports the loss (Done, Err matching ErrLost, WithOnLost); the next acquire
// opens a new one. A server without GRACE (its OPEN answers a syntax error naming it) gets the
// OPEN without it, remembered per go-redis client and node.
//
// go-redis clients have no close hook, so the sessions live in a registry keyed by the go-redis
// client (a finalizer-free design): Close(ctx, rdb), or Client.Close of any Client made on rdb,
// closes them (LOCK.SESSION CLOSE: every hold released at once, no lock-delay). A go-redis
// client closed without it is found closed by the keepalive (a PING through rdb before each
// keepalive, answered ErrClosed locally once it is closed), which closes them then: within a
// keepalive period (3.3 s). A process that exits without closing them ends them all the same:
// the server sees the connection close and ends the session after the grace.

// DefaultSessionGrace is the default session's GRACE: how long the server keeps it after its
// connection drops, for the keepalive to ATTACH it again; also how much longer than the close
// of a killed holder's connection its holds stay taken.
const DefaultSessionGrace = 500 * time.Millisecond

// defaultAttempts is how many times an acquire in the default session is made when the session
// ended under it (no such session, or it ended while the acquire waited).
const defaultAttempts = 3

// defaultSessions are the default sessions of one go-redis client, by node address ("" for a
// single server or a failover client).
type defaultSessions struct {
	mu      sync.Mutex
	byNode  map[string]*Session
	retired []*Session      // found gone by an acquire before their keepalive did; closed with the rest
	noGrace map[string]bool // nodes whose OPEN refused GRACE
}

var registry struct {
	sync.Mutex
	m map[redis.UniversalClient]*defaultSessions
}

func sessionsOf(rdb redis.UniversalClient, create bool) *defaultSessions {
	registry.Lock()
	defer registry.Unlock()
	ds := registry.m[rdb]
	if ds == nil && create {
		if registry.m == nil {
			registry.m = map[redis.UniversalClient]*defaultSessions{}
		}
		ds = &defaultSessions{byNode: map[string]*Session{}, noGrace: map[string]bool{}}
		registry.m[rdb] = ds
	}
	return ds
}

// nodeOf is the registry's key for the node that serves key: its address in a cluster, "" else.
func nodeOf(ctx context.Context, rdb redis.UniversalClient, key string) (string, error) {
	cc, ok := rdb.(*redis.ClusterClient)
	if !ok {
		return "", nil
	}
	node, err := cc.MasterForKey(ctx, key)
	if err != nil {
		return "", err
	}
	return node.Options().Addr, nil
}

// DefaultSession is rdb's default session for the node that serves key (key matters only for a
// cluster), opened now if there is none alive: what the locks made from a Client on rdb hold
// in. Its Serial, Info and Done are the session's; closing it here is allowed (the next
// acquire opens a new one), but Close(ctx, rdb) is the way to end them all.
func DefaultSession(ctx context.Context, rdb redis.UniversalClient, key string) (*Session, error) {
	node, err := nodeOf(ctx, rdb, key)
	if err != nil {
		return nil, err
	}
	ds := sessionsOf(rdb, true)
	ds.mu.Lock()
	defer ds.mu.Unlock()
	if s := ds.byNode[node]; s != nil {
		if s.live() {
			return s, nil
		}
		delete(ds.byNode, node) // ended: its conns are closed; nothing left to close
	}
	opts := []SessionOption{WithSessionTTL(DefaultSessionTTL), WithSessionKey(key), withOwner(rdb)}
	if !ds.noGrace[node] {
		opts = append(opts, WithGrace(DefaultSessionGrace))
	}
	s, err := NewSession(ctx, rdb, opts...)
	if err != nil && !ds.noGrace[node] && refusesGrace(err) {
		ds.noGrace[node] = true
		s, err = NewSession(ctx, rdb, opts[:3]...)
	}
	if err != nil {
		return nil, err
	}
	ds.byNode[node] = s
	return s, nil
}

// refusesGrace: the OPEN of a module that does not know GRACE.
func refusesGrace(err error) bool {
	return isReplyError(err) && strings.Contains(err.Error(), "syntax") && strings.Contains(err.Error(), "GRACE")
}

// sessionGone: an acquire's error that says its session ended (before it, or while it waited).
func sessionGone(err error) bool {
	if err == nil || !isReplyError(err) {
		return false
	}
	msg := err.Error()
	return strings.Contains(msg, "no such session") || strings.Contains(msg, "session ended while the client waited")
}

// retire: an acquire was told s is gone; the next acquire opens a new session. s is kept to
// be closed with the others (in a cluster it may be alive elsewhere).
func retire(rdb redis.UniversalClient, s *Session) {
	ds := sessionsOf(rdb, false)
	if ds == nil {
		return
	}
	ds.mu.Lock()
	defer ds.mu.Unlock()
	for node, live := range ds.byNode {
		if live == s {
			delete(ds.byNode, node)
			ds.retired = append(ds.retired, s)
		}
	}
}

// Close closes rdb's default sessions (LOCK.SESSION CLOSE on each: every hold in them is
// released at once, with no lock-delay, and ends with an error matching ErrSessionClosed). Call
// it when done with rdb, before rdb.Close() (go-redis has no close hook); Client.Close does it
// too. The next lock acquired through rdb opens a new default session. Without it, a process
// that exits ends them all the same, DefaultSessionGrace after its connections close.
func Close(ctx context.Context, rdb redis.UniversalClient) error {
	registry.Lock()
	ds := registry.m[rdb]
	delete(registry.m, rdb)
	registry.Unlock()
	if ds == nil {
		return nil
	}
	ds.mu.Lock()
	all := ds.retired
	for _, s := range ds.byNode {
		all = append(all, s)
	}
	ds.byNode, ds.retired = map[string]*Session{}, nil
	ds.mu.Unlock()
	var errs []error
	for _, s := range all {
		if err := s.Close(ctx); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}
