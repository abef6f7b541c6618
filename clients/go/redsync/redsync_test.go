package redsync_test

import (
	"context"
	"errors"
	"os"
	"strings"
	"testing"
	"time"

	goredislib "github.com/redis/go-redis/v9"

	redislock "redis-lock/clients/go"
	"redis-lock/clients/go/internal/testserver"
	"redis-lock/clients/go/redsync"
	"redis-lock/clients/go/redsync/redis"
	"redis-lock/clients/go/redsync/redis/goredis/v9"
)

func pool(t *testing.T) (redis.Pool, *goredislib.Client) {
	c := testserver.New(t).Client(t)
	return goredis.NewPool(c), c
}

func TestLockWaitsInTheQueue(t *testing.T) {
	ctx := testserver.Ctx(t, 20*time.Second)
	p, rdb := pool(t)
	rs := redsync.New(p)
	a := rs.NewMutex("my-global-mutex")
	b := rs.NewMutex("my-global-mutex")
	if err := a.Lock(); err != nil {
		t.Fatal(err)
	}
	if a.Value() == "" || a.Token() <= 0 || time.Until(a.Until()) < 7*time.Second {
		t.Fatalf("value %q token %d until %v", a.Value(), a.Token(), a.Until())
	}
	var taken *redsync.ErrTaken
	if err := b.TryLock(); !errors.As(err, &taken) || len(taken.Nodes) != 1 {
		t.Fatalf("TryLock on a held mutex: %v", err)
	}
	got := make(chan error, 1)
	go func() { got <- b.Lock() }()
	testserver.WaitBlocked(t, rdb, 1) // one LOCK.ACQUIRE ... BLOCK, no polling
	if ok, err := a.Unlock(); !ok || err != nil {
		t.Fatalf("Unlock: %v %v", ok, err)
	}
	if err := <-got; err != nil {
		t.Fatal(err)
	}
	if b.Token() <= a.Token() {
		t.Fatalf("tokens %d then %d", a.Token(), b.Token())
	}
	if ok, err := b.ValidContext(ctx); !ok || err != nil {
		t.Fatalf("Valid: %v %v", ok, err)
	}
	if ok, err := b.ExtendContext(ctx); !ok || err != nil {
		t.Fatalf("Extend: %v %v", ok, err)
	}
	// Unlocked from elsewhere by its value (WithValue).
	other := rs.NewMutex("my-global-mutex", redsync.WithValue(b.Value()))
	if ok, err := other.UnlockContext(ctx); !ok || err != nil {
		t.Fatalf("Unlock by value: %v %v", ok, err)
	}
	if ok, err := b.Unlock(); ok || !errors.Is(err, redsync.ErrLockAlreadyExpired) {
		t.Fatalf("Unlock of a released lock: %v %v", ok, err)
	}
	if ok, err := b.Extend(); ok || err == nil {
		t.Fatalf("Extend of a released lock: %v %v", ok, err)
	}
}

func TestLockContextCancelled(t *testing.T) {
	ctx := testserver.Ctx(t, 20*time.Second)
	p, rdb := pool(t)
	rs := redsync.New(p)
	a := rs.NewMutex("job")
	if err := a.LockContext(ctx); err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithCancel(ctx)
	got := make(chan error, 1)
	go func() { got <- rs.NewMutex("job").LockContext(wctx) }()
	testserver.WaitBlocked(t, rdb, 1)
	cancel()
	err := <-got
	if !errors.Is(err, redsync.ErrFailed) || !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled LockContext: %v", err)
	}
	testserver.WaitBlocked(t, rdb, 0)
	// The wait is what the tries' delays add up to: 3 tries of 50 ms, 100 ms.
	start := time.Now()
	err = rs.NewMutex("job", redsync.WithTries(3), redsync.WithRetryDelay(50*time.Millisecond)).Lock()
	var taken *redsync.ErrTaken
	if !errors.As(err, &taken) {
		t.Fatalf("Lock past its tries: %v", err)
	}
	if waited := time.Since(start); waited < 100*time.Millisecond || waited > 2*time.Second {
		t.Fatalf("waited %v", waited)
	}
	if ok, err := a.Unlock(); !ok || err != nil {
		t.Fatal(ok, err)
	}
}

func TestQuorumOfPools(t *testing.T) {
	var pools []redis.Pool
	var clients []*goredislib.Client
	for i := 0; i < 3; i++ {
		p, c := pool(t)
		pools = append(pools, p)
		clients = append(clients, c)
	}
	rs := redsync.New(pools...)
	ctx := testserver.Ctx(t, 20*time.Second)
	// One server held by someone else: a quorum (2 of 3) is still had.
	if err := clients[0].Do(ctx, "LOCK.ACQUIRE", "q", "intruder", 30000).Err(); err != nil {
		t.Fatal(err)
	}
	m := rs.NewMutex("q")
	if err := m.Lock(); err != nil {
		t.Fatal(err)
	}
	// Two held by someone else: no quorum, and nothing stays held by the loser.
	if ok, err := m.Unlock(); !ok || err != nil {
		t.Fatalf("Unlock: %v %v", ok, err)
	}
	if err := clients[1].Do(ctx, "LOCK.ACQUIRE", "q", "intruder", 30000).Err(); err != nil {
		t.Fatal(err)
	}
	loser := rs.NewMutex("q", redsync.WithTries(2), redsync.WithRetryDelay(10*time.Millisecond))
	var taken *redsync.ErrTaken
	if err := loser.Lock(); !errors.As(err, &taken) || len(taken.Nodes) != 2 {
		t.Fatalf("Lock without a quorum: %v", err)
	}
	if n, _ := clients[2].Exists(ctx, "q").Result(); n != 0 {
		t.Fatal("the loser kept its hold on the third server")
	}
}

// go-redsync's README example, with its imports switched to this package and its address to a
// test server's, runs as a program.
func TestReadmeExample(t *testing.T) {
	if testing.Short() {
		t.Skip("builds a program")
	}
	srv := testserver.New(t)
	src, err := os.ReadFile("testdata/readme/main.go.txt")
	if err != nil {
		t.Fatal(err)
	}
	code := string(src)
	for old, repl := range map[string]string{
		`"github.com/go-redsync/redsync/v4/redis/goredis/v9"`: `"redis-lock/clients/go/redsync/redis/goredis/v9"`,
		`"github.com/go-redsync/redsync/v4"`:                  `"redis-lock/clients/go/redsync"`,
		`"localhost:6379"`:                                    `"` + srv.Addr() + `"`,
	} {
		if !strings.Contains(code, old) {
			t.Fatalf("the example has no %s", old)
		}
		code = strings.Replace(code, old, repl, 1)
	}
	ctx := testserver.Ctx(t, 240*time.Second) // a cold build cache compiles go-redis first
	testserver.GoProgram(t, ctx, code, true)
	// It locked and unlocked: the lock was granted once and released once.
	rdb := srv.Client(t)
	info, _ := rdb.Info(ctx, "lock").Result()
	if !strings.Contains(info, "lock_acquired:1\r\n") || !strings.Contains(info, "lock_released:1\r\n") {
		t.Fatalf("INFO lock after the example:\n%s", info)
	}
}

// The drop-in's lock is in the go-redis client's default session (freed when the holder's
// process dies), with its expiry as its own deadline; WithDefaultSession(false) keeps
// go-redsync's expiry-only lock.
func TestDefaultSession(t *testing.T) {
	ctx := testserver.Ctx(t, 20*time.Second)
	p, rdb := pool(t)
	rs := redsync.New(p)
	in := rs.NewMutex("in-session", redsync.WithExpiry(5*time.Second))
	out := rs.NewMutex("ttl-only", redsync.WithExpiry(5*time.Second), redsync.WithDefaultSession(false))
	for _, m := range []*redsync.Mutex{in, out} {
		if err := m.LockContext(ctx); err != nil {
			t.Fatal(err)
		}
	}
	s, err := redislock.DefaultSession(ctx, rdb, "in-session")
	if err != nil {
		t.Fatal(err)
	}
	a, _ := redislock.Inspect(ctx, rdb, "in-session")
	b, _ := redislock.Inspect(ctx, rdb, "ttl-only")
	if a == nil || a.Holders[0].SessionSerial != s.Serial() || a.Holders[0].TTL <= 0 || a.Holders[0].TTL > 5*time.Second {
		t.Fatalf("in the default session: %+v (session %d)", a, s.Serial())
	}
	if b == nil || b.Holders[0].Session || b.Holders[0].TTL <= 0 {
		t.Fatalf("opted out: %+v", b)
	}
	if ok, err := in.ExtendContext(ctx); !ok || err != nil {
		t.Fatalf("Extend in the session: %v %v", ok, err)
	}
	if err := redislock.Close(ctx, rdb); err != nil {
		t.Fatal(err)
	}
	if ok, _ := in.ValidContext(ctx); ok {
		t.Fatal("Valid after the default session was closed")
	}
	if info, _ := redislock.Inspect(ctx, rdb, "in-session"); info != nil {
		t.Fatalf("held after the default session was closed: %+v", info)
	}
	if ok, err := out.ValidContext(ctx); !ok || err != nil {
		t.Fatalf("the opted-out lock after Close: %v %v", ok, err)
	}
}
