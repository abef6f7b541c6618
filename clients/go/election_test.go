package redislock_test

import (
	"context"
	"errors"
	"testing"
	"time"

	redislock "redis-lock/clients/go"
	"redis-lock/clients/go/internal/testserver"
)

func next(t *testing.T, ch <-chan redislock.Leader) redislock.Leader {
	t.Helper()
	select {
	case l, ok := <-ch:
		if !ok {
			t.Fatal("Observe's channel closed")
		}
		return l
	case <-time.After(10 * time.Second):
		t.Fatal("no leadership change reported within 10 s")
	}
	return redislock.Leader{}
}

func TestElectionObserve(t *testing.T) {
	ctx := testserver.Ctx(t, 30*time.Second)
	rdb := testserver.New(t).Client(t)
	s1, err := redislock.NewSession(ctx, rdb)
	if err != nil {
		t.Fatal(err)
	}
	defer s1.Close(ctx)
	s2, err := redislock.NewSession(ctx, rdb)
	if err != nil {
		t.Fatal(err)
	}
	defer s2.Close(ctx)
	e1 := redislock.NewElection(s1, "leader")
	e2 := redislock.NewElection(s2, "leader")

	if _, err := e1.Leader(ctx); !errors.Is(err, redislock.ErrNoLeader) {
		t.Fatalf("Leader with nobody leading: %v", err)
	}
	octx, stop := context.WithCancel(ctx)
	defer stop()
	changes := e1.Observe(octx)
	if l := next(t, changes); l != (redislock.Leader{}) {
		t.Fatalf("first report %+v, want nobody", l)
	}
	if err := e1.Campaign(ctx, "10.0.0.1:8080"); err != nil {
		t.Fatal(err)
	}
	if l := next(t, changes); l.Value != "10.0.0.1:8080" || l.Term != e1.Term() || l.Term == 0 {
		t.Fatalf("report %+v, e1 term %d", l, e1.Term())
	}
	won := make(chan error, 1)
	go func() { won <- e2.Campaign(ctx, "10.0.0.2:8080") }()
	testserver.WaitBlocked(t, rdb, 1)

	// A forged feed message names a leader that does not exist: not reported (LOCK.INFO is
	// read first and shows e1 still leading, as reported).
	watch, err := rdb.Do(ctx, "LOCK.WATCH", "leader").Slice()
	if err != nil {
		t.Fatal(err)
	}
	if err := rdb.SPublish(ctx, watch[0].(string), "999 handoff 1 0 mallory").Err(); err != nil {
		t.Fatal(err)
	}

	first := e1.Term()
	if err := e1.Resign(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-won; err != nil {
		t.Fatal(err)
	}
	l := next(t, changes)
	if l.Value != "10.0.0.2:8080" || l.Term != e2.Term() || l.Term <= first {
		t.Fatalf("after e1 resigned: %+v (e2 term %d, e1's was %d)", l, e2.Term(), first)
	}
	if got, err := e2.Leader(ctx); err != nil || got != l {
		t.Fatalf("Leader() %+v %v", got, err)
	}
	select {
	case <-e1.Done():
	default:
		t.Fatal("e1's Done open after Resign")
	}
	if _, err := e1.Fenced(ctx, "SET", "config", "x"); !errors.Is(err, redislock.ErrStaleToken) {
		t.Fatalf("fenced write by a resigned leader: %v", err)
	}
	if err := e2.Resign(ctx); err != nil {
		t.Fatal(err)
	}
	if l := next(t, changes); l != (redislock.Leader{}) {
		t.Fatalf("after e2 resigned: %+v, want nobody", l)
	}
	stop()
	for range changes { // closed once its context ends
	}
}

// The leader's process dies (its bound session's connection closes): the next candidate leads.
func TestElectionLeaderSessionLost(t *testing.T) {
	ctx := testserver.Ctx(t, 30*time.Second)
	rdb := testserver.New(t).Client(t)
	s1, err := redislock.NewSession(ctx, rdb, redislock.WithSessionTTL(600*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	s2, err := redislock.NewSession(ctx, rdb)
	if err != nil {
		t.Fatal(err)
	}
	defer s2.Close(ctx)
	e1 := redislock.NewElection(s1, "primary")
	e2 := redislock.NewElection(s2, "primary")
	if err := e1.Campaign(ctx, "a"); err != nil {
		t.Fatal(err)
	}
	won := make(chan error, 1)
	go func() { won <- e2.Campaign(ctx, "b") }()
	testserver.WaitBlocked(t, rdb, 1)
	si, _ := s1.Info(ctx)
	if err := rdb.Do(ctx, "CLIENT", "KILL", "ID", si.Bound).Err(); err != nil {
		t.Fatal(err)
	}
	if err := <-won; err != nil {
		t.Fatal(err)
	}
	if l, _ := e2.Leader(ctx); l.Value != "b" {
		t.Fatalf("leader %+v", l)
	}
	<-e1.Done()
	<-s1.Done()
	if !errors.Is(s1.Err(), redislock.ErrLost) {
		t.Fatal(s1.Err())
	}
}
