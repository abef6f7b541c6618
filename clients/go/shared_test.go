package redislock_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	redislock "redis-lock/clients/go"
	"redis-lock/clients/go/internal/testserver"
)

func TestSemaphore(t *testing.T) {
	ctx := testserver.Ctx(t, 20*time.Second)
	rdb := testserver.New(t).Client(t)
	c := redislock.New(rdb)
	a := redislock.NewSemaphore(c, "payments-api", 2, redislock.WithOwner("worker-a"))
	b := redislock.NewSemaphore(c, "payments-api", 2, redislock.WithOwner("worker-b"))
	w := redislock.NewSemaphore(c, "payments-api", 2, redislock.WithOwner("worker-c"))
	for _, s := range []*redislock.Semaphore{a, b} {
		if err := s.TryAcquire(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if a.Token() == b.Token() || a.Token() <= 0 || b.Token() <= 0 {
		t.Fatalf("tokens %d %d", a.Token(), b.Token())
	}
	if err := w.TryAcquire(ctx); !errors.Is(err, redislock.ErrNotObtained) {
		t.Fatalf("third permit: %v", err)
	}
	// Another limit on the same key is the server's error, as is.
	other := redislock.NewSemaphore(c, "payments-api", 3)
	if err := other.TryAcquire(ctx); err == nil || !strings.Contains(err.Error(), "held SHARED with LIMIT 2") {
		t.Fatalf("limit mismatch: %v", err)
	}
	got := make(chan error, 1)
	go func() { got <- w.Acquire(ctx) }()
	testserver.WaitBlocked(t, rdb, 1)
	if err := a.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-got; err != nil {
		t.Fatal(err)
	}
	info, _ := c.Info(ctx, "payments-api")
	if info.Mode != "shared" || info.Limit != 2 || len(info.Holders) != 2 ||
		info.Holders[0].Owner != "worker-b" || info.Holders[1].Owner != "worker-c" || info.Holders[1].Token != w.Token() {
		t.Fatalf("LOCK.INFO %+v", info)
	}
}

func TestRWMutex(t *testing.T) {
	ctx := testserver.Ctx(t, 20*time.Second)
	rdb := testserver.New(t).Client(t)
	c := redislock.New(rdb)
	r1 := redislock.NewRWMutex(c, "report", redislock.WithOwner("r1"))
	r2 := redislock.NewRWMutex(c, "report", redislock.WithOwner("r2"))
	r3 := redislock.NewRWMutex(c, "report", redislock.WithOwner("r3"))
	w := redislock.NewRWMutex(c, "report", redislock.WithOwner("w"))
	if err := r1.RLock(ctx); err != nil {
		t.Fatal(err)
	}
	if err := r2.TryRLock(ctx); err != nil {
		t.Fatal(err)
	}
	if err := w.TryLock(ctx); !errors.Is(err, redislock.ErrNotObtained) {
		t.Fatalf("writer while read-held: %v", err)
	}
	wrote := make(chan error, 1)
	go func() { wrote <- w.Lock(ctx) }()
	testserver.WaitBlocked(t, rdb, 1)
	// A reader arriving after the queued writer does not overtake it.
	if err := r3.TryRLock(ctx); !errors.Is(err, redislock.ErrNotObtained) {
		t.Fatalf("reader behind a queued writer: %v", err)
	}
	if err := r1.RUnlock(ctx); err != nil {
		t.Fatal(err)
	}
	if err := r2.RUnlock(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-wrote; err != nil {
		t.Fatal(err)
	}
	info, _ := c.Info(ctx, "report")
	if info.Mode != "exclusive" || info.Holders[0].Owner != "w:write" || info.Token != w.Writer().Token() {
		t.Fatalf("LOCK.INFO %+v", info)
	}
	if w.Writer().Token() <= r1.Reader().Token() {
		t.Fatal("writer's token not above the readers'")
	}
	if err := w.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
}

func TestMultiLock(t *testing.T) {
	ctx := testserver.Ctx(t, 20*time.Second)
	rdb := testserver.New(t).Client(t)
	c := redislock.New(rdb)
	clerk := redislock.NewMutex(c, "sku:2", redislock.WithOwner("clerk"))
	if err := clerk.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	order := redislock.NewMultiLock(c, []string{"sku:1", "sku:2"}, redislock.WithOwner("order-7"))
	if err := order.TryLock(ctx); !errors.Is(err, redislock.ErrNotObtained) {
		t.Fatalf("TryLock with sku:2 held: %v", err)
	}
	if n, _ := rdb.Exists(ctx, "sku:1").Result(); n != 0 {
		t.Fatal("a refused MultiLock took sku:1")
	}
	got := make(chan error, 1)
	go func() { got <- order.Lock(ctx) }()
	testserver.WaitBlocked(t, rdb, 1)
	if err := clerk.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-got; err != nil {
		t.Fatal(err)
	}
	tokens := order.Tokens()
	if len(tokens) != 2 || tokens[0] != fence(t, rdb, "sku:1") || tokens[1] != fence(t, rdb, "sku:2") {
		t.Fatalf("tokens %v", tokens)
	}
	if err := order.Extend(ctx, time.Minute); err != nil {
		t.Fatal(err)
	}
	if ttl, _ := rdb.PTTL(ctx, "sku:2").Result(); ttl < 50*time.Second {
		t.Fatalf("sku:2 PTTL %v after Extend(1m)", ttl)
	}
	// One key of the set is lost meanwhile: Unlock releases the other and says so.
	if err := rdb.Del(ctx, "sku:1").Err(); err != nil {
		t.Fatal(err)
	}
	if err := order.Unlock(ctx); !errors.Is(err, redislock.ErrNotOwned) || !strings.Contains(err.Error(), "1 of 2 keys") {
		t.Fatalf("Unlock of a half-lost set: %v", err)
	}
	if fence(t, rdb, "sku:1") != 0 || fence(t, rdb, "sku:2") != 0 {
		t.Fatal("held after Unlock")
	}
	if err := redislock.NewMultiLock(c, []string{"sku:1", "sku:1"}).TryLock(ctx); err == nil || !strings.Contains(err.Error(), "duplicate key 'sku:1'") {
		t.Fatalf("duplicate key: %v", err)
	}
}
