package redislock_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	redislock "redis-lock/clients/go"
	"redis-lock/clients/go/internal/testserver"
)

// TestMain doubles as the killed-holder helper: with REDISLOCK_HELPER=holder the test binary
// takes a lock in a BOUND session, prints its token and waits to be killed.
func TestMain(m *testing.M) {
	switch os.Getenv("REDISLOCK_HELPER") {
	case "holder":
		holder()
		return
	case "default-holder":
		defaultHolder()
		return
	}
	os.Exit(m.Run())
}

func holder() {
	ctx := context.Background()
	rdb := redis.NewClient(&redis.Options{Addr: os.Getenv("REDISLOCK_ADDR")})
	s, err := redislock.NewSession(ctx, rdb, redislock.WithSessionTTL(60*time.Second))
	if err != nil {
		fmt.Println("error", err)
		os.Exit(1)
	}
	m := redislock.NewMutex(s, os.Getenv("REDISLOCK_KEY"))
	if err := m.Lock(ctx); err != nil {
		fmt.Println("error", err)
		os.Exit(1)
	}
	fmt.Println("held", m.Token())
	select {}
}

func fence(t *testing.T, c redis.UniversalClient, key string) int64 {
	t.Helper()
	n, err := c.Do(context.Background(), "LOCK.FENCE", key).Int64()
	if errors.Is(err, redis.Nil) {
		return 0
	}
	if err != nil {
		t.Fatal(err)
	}
	return n
}

func TestMutexTokenTryLockUnlock(t *testing.T) {
	ctx := testserver.Ctx(t, 20*time.Second)
	rdb := testserver.New(t).Client(t)
	c := redislock.New(rdb)
	a := redislock.NewMutex(c, "invoice:42", redislock.WithOwner("worker-a"))
	b := redislock.NewMutex(c, "invoice:42", redislock.WithOwner("worker-b"))
	if err := a.TryLock(ctx); err != nil {
		t.Fatal(err)
	}
	if a.Token() <= 0 || a.Token() != fence(t, rdb, "invoice:42") {
		t.Fatalf("token %d, LOCK.FENCE %d", a.Token(), fence(t, rdb, "invoice:42"))
	}
	info, err := c.Info(ctx, "invoice:42")
	if err != nil {
		t.Fatal(err)
	}
	if info.Mode != "exclusive" || len(info.Holders) != 1 || info.Holders[0].Owner != "worker-a" || info.Holders[0].Token != a.Token() {
		t.Fatalf("LOCK.INFO %+v", info)
	}
	err = b.TryLock(ctx)
	if !errors.Is(err, redislock.ErrNotObtained) || errors.Is(err, redislock.ErrTimeout) {
		t.Fatalf("TryLock on a held lock: %v", err)
	}
	first := a.Token()
	if err := a.TryLock(ctx); err != nil || a.Token() != first {
		t.Fatalf("retry by the holder: %v, token %d then %d", err, first, a.Token())
	}
	if err := a.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	if a.Token() != 0 || fence(t, rdb, "invoice:42") != 0 {
		t.Fatal("still held after Unlock")
	}
	select {
	case <-a.Done():
	default:
		t.Fatal("Done not closed after Unlock")
	}
	if a.Err() != nil {
		t.Fatalf("Err after Unlock: %v", a.Err())
	}
	if err := a.Unlock(ctx); !errors.Is(err, redislock.ErrNotOwned) {
		t.Fatalf("second Unlock: %v", err)
	}
	if err := b.TryLock(ctx); err != nil || b.Token() <= first {
		t.Fatalf("b after release: %v, token %d (a had %d)", err, b.Token(), first)
	}
}

func TestMutexFIFO(t *testing.T) {
	ctx := testserver.Ctx(t, 30*time.Second)
	rdb := testserver.New(t).Client(t)
	c := redislock.New(rdb)
	holder := redislock.NewMutex(c, "fifo")
	if err := holder.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	const n = 4
	order := make(chan int, n)
	errs := make(chan error, n)
	waiters := make([]*redislock.Mutex, n)
	for i := 0; i < n; i++ {
		waiters[i] = redislock.NewMutex(c, "fifo", redislock.WithOwner(fmt.Sprintf("w%d", i)))
		go func(i int) {
			if err := waiters[i].Lock(ctx); err != nil {
				errs <- err
				return
			}
			order <- i
			errs <- waiters[i].Unlock(ctx)
		}(i)
		testserver.WaitBlocked(t, rdb, i+1) // queued in this order
	}
	info, _ := c.Info(ctx, "fifo")
	if info.Waiters != n || info.Queue[0].Owner != "w0" || info.Queue[n-1].Owner != fmt.Sprintf("w%d", n-1) {
		t.Fatalf("queue %+v", info)
	}
	if err := holder.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < n; i++ {
		if got := <-order; got != i {
			t.Fatalf("grant %d went to w%d", i, got)
		}
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
}

func TestLockWaitLongerThanReadTimeout(t *testing.T) {
	ctx := testserver.Ctx(t, 20*time.Second)
	// A client whose ReadTimeout is far shorter than the wait: the wait must not be cut.
	srv := testserver.New(t)
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr(), ReadTimeout: 100 * time.Millisecond})
	t.Cleanup(func() { _ = rdb.Close() })
	c := redislock.New(rdb)
	a := redislock.NewMutex(c, "slow", redislock.WithTTL(400*time.Millisecond), redislock.WithWatchdog(false))
	if err := a.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	b := redislock.NewMutex(c, "slow")
	start := time.Now()
	if err := b.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	if waited := time.Since(start); waited < 250*time.Millisecond {
		t.Fatalf("granted after %v, before a's ttl ran out", waited)
	}
	if b.Token() != fence(t, rdb, "slow") {
		t.Fatal("b's token is not the live one")
	}
	// a's hold expired without a watchdog: its Done is closed and Err says lost.
	select {
	case <-a.Done():
	case <-ctx.Done():
		t.Fatal("a never saw its hold expire")
	}
	if !errors.Is(a.Err(), redislock.ErrLost) {
		t.Fatalf("a.Err() = %v", a.Err())
	}
}

func TestCancelledWaitLeavesNothing(t *testing.T) {
	ctx := testserver.Ctx(t, 20*time.Second)
	rdb := testserver.New(t).Client(t)
	c := redislock.New(rdb)
	a := redislock.NewMutex(c, "job", redislock.WithOwner("a"))
	if err := a.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	b := redislock.NewMutex(c, "job", redislock.WithOwner("b"))
	wctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- b.Lock(wctx) }()
	testserver.WaitBlocked(t, rdb, 1)
	cancel()
	err := <-done
	if !errors.Is(err, context.Canceled) || !errors.Is(err, redislock.ErrNotObtained) || errors.Is(err, redislock.ErrTimeout) {
		t.Fatalf("cancelled Lock: %v", err)
	}
	testserver.WaitBlocked(t, rdb, 0)
	if err := a.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	if info, err := c.Info(ctx, "job"); err != nil || info != nil {
		t.Fatalf("after the cancelled wait and a's release: LOCK.INFO %+v, %v (want nil: nothing held)", info, err)
	}

	// A deadline: ErrTimeout, and the context's error.
	if err := a.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	dctx, dcancel := context.WithTimeout(ctx, 150*time.Millisecond)
	defer dcancel()
	err = b.Lock(dctx)
	if !errors.Is(err, redislock.ErrTimeout) || !errors.Is(err, context.DeadlineExceeded) || !errors.Is(err, redislock.ErrNotObtained) {
		t.Fatalf("Lock past its deadline: %v", err)
	}
	info, _ := c.Info(ctx, "job")
	if len(info.Holders) != 1 || info.Holders[0].Owner != "a" || info.Waiters != 0 {
		t.Fatalf("LOCK.INFO %+v", info)
	}
}

// The grant arrives as the context ends: cancel from inside the grant's wake-up, over and over;
// whichever side wins, nothing may stay held by the cancelled waiter.
func TestCancelRacingGrant(t *testing.T) {
	ctx := testserver.Ctx(t, 60*time.Second)
	rdb := testserver.New(t).Client(t)
	c := redislock.New(rdb)
	a := redislock.NewMutex(c, "race", redislock.WithOwner("a"))
	b := redislock.NewMutex(c, "race", redislock.WithOwner("b"))
	for i := 0; i < 30; i++ {
		if err := a.Lock(ctx); err != nil {
			t.Fatal(err)
		}
		wctx, cancel := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() { done <- b.Lock(wctx) }()
		testserver.WaitBlocked(t, rdb, 1)
		go cancel()
		if err := a.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
		err := <-done
		cancel()
		if err == nil {
			// b won the race cleanly: it holds the lock; give it back.
			if err := b.Unlock(ctx); err != nil {
				t.Fatal(err)
			}
		} else if !errors.Is(err, context.Canceled) {
			t.Fatalf("round %d: %v", i, err)
		}
		testserver.Eventually(t, 5*time.Second, "lock free", func() bool { return fence(t, rdb, "race") == 0 })
	}
}

func TestKilledHolderPassesOnAtOnce(t *testing.T) {
	ctx := testserver.Ctx(t, 60*time.Second)
	srv := testserver.New(t)
	rdb := srv.Client(t)
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), "REDISLOCK_HELPER=holder", "REDISLOCK_ADDR="+srv.Addr(), "REDISLOCK_KEY=crash")
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil || !strings.HasPrefix(line, "held ") {
		t.Fatalf("helper: %q %v", line, err)
	}
	helperToken, _ := strconv.ParseInt(strings.TrimSpace(strings.TrimPrefix(line, "held ")), 10, 64)
	if helperToken != fence(t, rdb, "crash") {
		t.Fatalf("helper token %d, LOCK.FENCE %d", helperToken, fence(t, rdb, "crash"))
	}
	s, err := redislock.NewSession(ctx, rdb)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close(ctx)
	m := redislock.NewMutex(s, "crash")
	granted := make(chan time.Time, 1)
	errc := make(chan error, 1)
	go func() {
		err := m.Lock(ctx)
		granted <- time.Now()
		errc <- err
	}()
	testserver.WaitBlocked(t, rdb, 1)
	killed := time.Now()
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	at := <-granted
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
	handoff := at.Sub(killed)
	t.Logf("killed holder's lock granted to the waiter %v after SIGKILL", handoff)
	if handoff > 2*time.Second { // the session's ttl is 60 s: only BOUND explains a fast handoff
		t.Fatalf("handoff took %v", handoff)
	}
	if m.Token() <= helperToken || m.Token() != fence(t, rdb, "crash") {
		t.Fatalf("waiter token %d, helper's %d, live %d", m.Token(), helperToken, fence(t, rdb, "crash"))
	}
}

// A wait after a wait reuses the first one's connection: no new connection per wait.
func TestWaitConnectionsReused(t *testing.T) {
	ctx := testserver.Ctx(t, 20*time.Second)
	rdb := testserver.New(t).Client(t)
	c := redislock.New(rdb)
	defer c.Close()
	holder := redislock.NewMutex(c, "reuse")
	waiter := redislock.NewMutex(c, "reuse")
	connections := func() int64 {
		s, _ := rdb.Info(ctx, "stats").Result()
		for _, line := range strings.Split(s, "\r\n") {
			if v, ok := strings.CutPrefix(line, "total_connections_received:"); ok {
				n, _ := strconv.ParseInt(v, 10, 64)
				return n
			}
		}
		return -1
	}
	var after1 int64 // connections received after the first waits
	for i := 0; i < 8; i++ {
		if err := holder.Lock(ctx); err != nil {
			t.Fatal(err)
		}
		got := make(chan error, 1)
		go func() { got <- waiter.Lock(ctx) }()
		testserver.WaitBlocked(t, rdb, 1)
		if err := holder.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
		if err := <-got; err != nil {
			t.Fatal(err)
		}
		if err := waiter.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
		if i == 2 { // after the go-redis pool's own connections are made
			after1 = connections()
		}
	}
	if n := connections(); n != after1 {
		t.Fatalf("%d new connections for 5 waits after the first ones", n-after1)
	}
}
