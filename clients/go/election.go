package redislock

import (
	"context"
	"sync"

	"github.com/redis/go-redis/v9"
)

// Leader is who leads an election: the value it campaigned with and its term (the grant's
// fencing token, larger for every new leader). A zero Leader (Term 0): nobody leads.
type Leader struct {
	Value string
	Term  int64
}

// Election is leader election on one lock key, in a session (etcd's concurrency.Election
// shape). A candidate campaigns with LOCK.ACQUIRE name value ttl SESSION id BLOCK (ttl 0 in an
// explicit Session): it waits in the key's FIFO queue and leads once granted, until it resigns
// or its session ends (a bound session ends the moment the leader's process dies, plus its
// grace, and the next candidate leads).
//
// There is no Proclaim: the value is the hold's owner, which the server does not let a holder
// change; resign and campaign again to publish another value.
type Election struct {
	s    Scope
	name string

	mu   sync.Mutex
	lead *Mutex // this candidate's leadership, once won
}

// NewElection is an election on the key name, whose leaderships live in s: a *Session, or a
// *Client, whose leaderships are holds with a ttl of their own (DefaultTTL, renewed by the
// watchdog) in the go-redis client's default session, so that the next candidate leads within
// DefaultSessionGrace of the leader's process dying.
func NewElection(s Scope, name string) *Election { return &Election{s: s, name: name} }

func (e *Election) client() redis.UniversalClient {
	rdb, _, _, _ := e.s.scope()
	return rdb
}

// Key is the election's key.
func (e *Election) Key() string { return e.name }

// Campaign waits until this candidate leads, publishing val (the hold's owner: keep it unique
// among candidates). When ctx ends first nothing stays held and the error matches ctx's.
func (e *Election) Campaign(ctx context.Context, val string) error {
	m := NewMutex(e.s, e.name, WithOwner(val))
	if err := m.Lock(ctx); err != nil {
		return err
	}
	e.mu.Lock()
	e.lead = m
	e.mu.Unlock()
	return nil
}

// Term is this candidate's term while it leads (its fencing token); 0 otherwise.
func (e *Election) Term() int64 {
	if m := e.leadership(); m != nil {
		return m.Token()
	}
	return 0
}

// Done is closed when this candidate's leadership ends (resigned or lost); closed while it
// does not lead.
func (e *Election) Done() <-chan struct{} {
	if m := e.leadership(); m != nil {
		return m.Done()
	}
	c := make(chan struct{})
	close(c)
	return c
}

// Fenced runs `command key args...` only while this candidate's term is the live one.
func (e *Election) Fenced(ctx context.Context, command, key string, args ...any) (any, error) {
	m := e.leadership()
	if m == nil {
		return nil, newError([]error{ErrStaleToken}, "redislock: not leading %q", e.name)
	}
	return m.Fenced(ctx, command, key, args...)
}

func (e *Election) leadership() *Mutex {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.lead
}

// Resign steps down: the next candidate in the queue leads. ErrNotOwned if it did not lead.
func (e *Election) Resign(ctx context.Context) error {
	e.mu.Lock()
	m := e.lead
	e.lead = nil
	e.mu.Unlock()
	if m == nil {
		return newError([]error{ErrNotOwned}, "redislock: not leading %q", e.name)
	}
	return m.Unlock(ctx)
}

// Leader reads who leads now (LOCK.INFO); ErrNoLeader when nobody does.
func (e *Election) Leader(ctx context.Context) (Leader, error) {
	info, err := Inspect(ctx, e.client(), e.name)
	if err != nil {
		return Leader{}, err
	}
	l := leaderOf(info)
	if l.Term == 0 {
		return l, newError([]error{ErrNoLeader}, "redislock: nobody leads %q", e.name)
	}
	return l, nil
}

func leaderOf(info *Info) Leader {
	if info == nil || len(info.Holders) == 0 {
		return Leader{}
	}
	return Leader{Value: info.Holders[0].Owner, Term: info.Holders[0].Token}
}

// Observe reports every change of leader until ctx ends (then the channel is closed): first
// who leads when it starts, then each new leader, and a zero Leader when nobody leads. It
// follows the key's change feed as Watch does (each message confirmed by LOCK.INFO).
func (e *Election) Observe(ctx context.Context) <-chan Leader {
	return observe(ctx, e.client(), e.name, leaderOf)
}
