package redislock_test

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	redislock "redis-lock/clients/go"
	"redis-lock/clients/go/internal/testserver"
)

// The replies as RESP2 gives them (flat arrays for LOCK.INFO and LOCK.SESSION INFO): the same
// state read, the same leaders observed.
func TestRESP2(t *testing.T) {
	ctx := testserver.Ctx(t, 20*time.Second)
	srv := testserver.New(t)
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr(), Protocol: 2})
	t.Cleanup(func() { _ = rdb.Close() })
	s, err := redislock.NewSession(ctx, rdb)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close(ctx)
	sem := redislock.NewSemaphore(s, "r2", 2, redislock.WithOwner("a"))
	if err := sem.Acquire(ctx); err != nil {
		t.Fatal(err)
	}
	info, err := redislock.Inspect(ctx, rdb, "r2")
	if err != nil || info.Mode != "shared" || info.Limit != 2 || len(info.Holders) != 1 ||
		info.Holders[0].Owner != "a" || info.Holders[0].Token != sem.Token() || !info.Holders[0].Session {
		t.Fatalf("LOCK.INFO over RESP2: %+v %v", info, err)
	}
	si, err := s.Info(ctx)
	if err != nil || si.Holds != 1 || si.Bound == 0 || si.TTL <= 0 {
		t.Fatalf("LOCK.SESSION INFO over RESP2: %+v %v", si, err)
	}
	e := redislock.NewElection(s, "r2:leader")
	octx, stop := context.WithCancel(ctx)
	defer stop()
	changes := e.Observe(octx)
	if l := next(t, changes); l != (redislock.Leader{}) {
		t.Fatalf("first: %+v", l)
	}
	if err := e.Campaign(ctx, "me"); err != nil {
		t.Fatal(err)
	}
	if l := next(t, changes); l.Value != "me" || l.Term != e.Term() {
		t.Fatalf("leader %+v, term %d", l, e.Term())
	}
}
