package redislock_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	redislock "redis-lock/clients/go"
	"redis-lock/clients/go/internal/testserver"
)

func TestDurable(t *testing.T) {
	ctx := testserver.Ctx(t, 30*time.Second)
	primary := testserver.New(t)
	rdb := primary.Client(t)
	c := redislock.New(rdb)
	defer c.Close()

	// No replica: the grant is not acknowledged, and is given back.
	m := redislock.NewMutex(c, "durable", redislock.WithDurable(1, 100*time.Millisecond))
	err := m.TryLock(ctx)
	var derr *redislock.DurabilityError
	if !errors.As(err, &derr) || !errors.Is(err, redislock.ErrNotDurable) || derr.Acknowledged != 0 || !derr.Released || m.Token() != 0 {
		t.Fatalf("durable with no replica: %v (%+v), token %d", err, derr, m.Token())
	}
	if info, _ := c.Info(ctx, "durable"); info != nil {
		t.Fatalf("held after a refused durable grant: %+v", info)
	}

	// With a replica: granted, and the replica has it.
	replica := testserver.NewReplica(t, primary)
	rr := replica.Client(t)
	testserver.Eventually(t, 10*time.Second, "the replica in sync", func() bool {
		s, _ := rdb.Info(ctx, "replication").Result()
		return strings.Contains(s, "connected_slaves:1") && strings.Contains(s, "state=online")
	})
	m = redislock.NewMutex(c, "durable", redislock.WithDurable(1, 5*time.Second))
	if err := m.TryLock(ctx); err != nil {
		t.Fatal(err)
	}
	if got, _ := rr.Do(ctx, "LOCK.FENCE", "durable").Int64(); got != m.Token() {
		t.Fatalf("replica token %d, grant %d", got, m.Token())
	}
	// A wait: granted on release, then WAIT on the wait's connection.
	w := redislock.NewMutex(c, "durable", redislock.WithDurable(1, 5*time.Second))
	got := make(chan error, 1)
	go func() { got <- w.Lock(ctx) }()
	testserver.WaitBlocked(t, rdb, 1)
	if err := m.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-got; err != nil {
		t.Fatal(err)
	}
	if got, _ := rr.Do(ctx, "LOCK.FENCE", "durable").Int64(); got != w.Token() {
		t.Fatalf("replica token %d after the wait's grant %d", got, w.Token())
	}
	// Cancelled during a durable wait: nothing left.
	x := redislock.NewMutex(c, "durable", redislock.WithDurable(1, 5*time.Second))
	wctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- x.Lock(wctx) }()
	testserver.WaitBlocked(t, rdb, 1)
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled durable wait: %v", err)
	}
	if err := w.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	if info, _ := c.Info(ctx, "durable"); info != nil {
		t.Fatalf("held after the cancelled wait: %+v", info)
	}
}
