package redislock_test

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	redislock "redis-lock/clients/go"
	"redis-lock/clients/go/internal/testserver"
)

func infoLock(t *testing.T, rdb redis.UniversalClient, field string) int64 {
	t.Helper()
	s, err := rdb.Info(context.Background(), "lock").Result()
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(s, "\r\n") {
		if v, ok := strings.CutPrefix(line, field+":"); ok {
			n, _ := strconv.ParseInt(v, 10, 64)
			return n
		}
	}
	t.Fatalf("no %s in INFO lock", field)
	return 0
}

func TestSessionLossEndsItsHolds(t *testing.T) {
	ctx := testserver.Ctx(t, 20*time.Second)
	rdb := testserver.New(t).Client(t)
	s, err := redislock.NewSession(ctx, rdb, redislock.WithSessionTTL(600*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	m := redislock.NewMutex(s, "leased")
	if err := m.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	info, _ := redislock.Inspect(ctx, rdb, "leased")
	if !info.Holders[0].Session || info.Holders[0].TTL != -time.Millisecond {
		t.Fatalf("a session hold: %+v", info.Holders[0])
	}
	si, err := s.Info(ctx)
	if err != nil || si.Holds != 1 || si.Bound == 0 {
		t.Fatalf("LOCK.SESSION INFO %+v %v", si, err)
	}
	// The bound connection is killed: the server ends the session, and the client sees its
	// socket closed (a peek every 50 ms) rather than waiting for the next keepalive.
	if err := rdb.Do(ctx, "CLIENT", "KILL", "ID", si.Bound).Err(); err != nil {
		t.Fatal(err)
	}
	if fence(t, rdb, "leased") != 0 {
		t.Fatal("the hold outlived its bound connection")
	}
	select {
	case <-s.Done():
	case <-ctx.Done():
		t.Fatal("Done not closed")
	}
	if !errors.Is(s.Err(), redislock.ErrLost) {
		t.Fatalf("session Err %v", s.Err())
	}
	<-m.Done()
	if !errors.Is(m.Err(), redislock.ErrLost) || m.Token() != 0 {
		t.Fatalf("mutex Err %v token %d", m.Err(), m.Token())
	}
	if err := m.Lock(ctx); !errors.Is(err, redislock.ErrLost) {
		t.Fatalf("Lock in a lost session: %v", err)
	}
}

func TestSessionCloseReleases(t *testing.T) {
	ctx := testserver.Ctx(t, 20*time.Second)
	rdb := testserver.New(t).Client(t)
	s, err := redislock.NewSession(ctx, rdb, redislock.WithSessionLockDelay(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	a := redislock.NewMutex(s, "a")
	b := redislock.NewSemaphore(s, "b", 3)
	if err := a.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	if err := b.Acquire(ctx); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(ctx); err != nil {
		t.Fatal(err)
	}
	<-s.Done()
	if !errors.Is(s.Err(), redislock.ErrSessionClosed) {
		t.Fatalf("Err %v", s.Err())
	}
	// CLOSE is clean: no lock-delay, both free at once.
	for _, k := range []string{"a", "b"} {
		if info, err := redislock.Inspect(ctx, rdb, k); info != nil || err != nil {
			t.Fatalf("%s after Close: %+v %v", k, info, err)
		}
	}
	// Its holds ended cleanly: Done closed, Err says the session was closed (not a loss).
	<-a.Done()
	if !errors.Is(a.Err(), redislock.ErrSessionClosed) || errors.Is(a.Err(), redislock.ErrLost) || a.Token() != 0 {
		t.Fatalf("a.Err %v, token %d", a.Err(), a.Token())
	}
}

func TestWatchdogRenewsAndReportsLoss(t *testing.T) {
	ctx := testserver.Ctx(t, 20*time.Second)
	rdb := testserver.New(t).Client(t)
	lostc := make(chan error, 1)
	m := redislock.NewMutex(redislock.New(rdb), "renewed", redislock.WithTTL(300*time.Millisecond),
		redislock.WithOnLost(func(err error) { lostc <- err }), redislock.WithLossFeed(false))
	if err := m.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	token := m.Token()
	// Held past several ttls: the watchdog's LOCK.EXTEND calls keep it.
	testserver.Eventually(t, 5*time.Second, "4 renewals", func() bool { return infoLock(t, rdb, "lock_extended") >= 4 })
	if fence(t, rdb, "renewed") != token {
		t.Fatal("the renewed hold is not live")
	}
	// Someone deletes the key: the next renewal answers 0, and the loss is reported.
	if err := rdb.Del(ctx, "renewed").Err(); err != nil {
		t.Fatal(err)
	}
	var err error
	select {
	case err = <-lostc:
	case <-ctx.Done():
		t.Fatal("no loss reported")
	}
	if !errors.Is(err, redislock.ErrLost) || !strings.Contains(err.Error(), "not held") || strings.Contains(err.Error(), "feed") {
		t.Fatalf("loss: %v", err)
	}
	<-m.Done()
	if !errors.Is(m.Err(), redislock.ErrLost) {
		t.Fatal(m.Err())
	}
	if err := m.Unlock(ctx); !errors.Is(err, redislock.ErrNotOwned) {
		t.Fatalf("Unlock after the loss: %v", err)
	}
}

func TestFenced(t *testing.T) {
	ctx := testserver.Ctx(t, 20*time.Second)
	rdb := testserver.New(t).Client(t)
	c := redislock.New(rdb)
	a := redislock.NewMutex(c, "invoice:42", redislock.WithTTL(time.Second), redislock.WithWatchdog(false))
	if err := a.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	old := a.Token()
	if reply, err := a.Fenced(ctx, "SET", "invoice:42:total", 100); err != nil || reply != "OK" {
		t.Fatalf("fenced SET: %v %v", reply, err)
	}
	if err := rdb.Del(ctx, "invoice:42").Err(); err != nil {
		t.Fatal(err)
	}
	b := redislock.NewMutex(c, "invoice:42")
	if err := b.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	_, err := redislock.Fenced(ctx, rdb, "invoice:42", old, "SET", "invoice:42:total", 200)
	if !errors.Is(err, redislock.ErrStaleToken) {
		t.Fatalf("stale write: %v", err)
	}
	if v, _ := rdb.Get(ctx, "invoice:42:total").Result(); v != "100" {
		t.Fatalf("total %q", v)
	}
}

// A context that ends during Info does not cut the bound session's connection (which would
// end the session): the server is paused so that the reply comes after the context's deadline.
func TestSessionInfoContextEnds(t *testing.T) {
	ctx := testserver.Ctx(t, 20*time.Second)
	rdb := testserver.New(t).Client(t)
	s, err := redislock.NewSession(ctx, rdb)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close(ctx)
	if err := rdb.Do(ctx, "CLIENT", "PAUSE", 300, "ALL").Err(); err != nil {
		t.Fatal(err)
	}
	short, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancel()
	if si, err := s.Info(short); err != nil || si == nil || si.Bound == 0 {
		t.Fatalf("Info across its context's deadline: %+v %v", si, err)
	}
	// The session and its connection are still there.
	if si, err := s.Info(ctx); err != nil || si == nil {
		t.Fatalf("Info after: %+v %v", si, err)
	}
	if n := infoLock(t, rdb, "lock_sessions_disconnected"); n != 0 {
		t.Fatalf("%d bound sessions ended by a disconnect", n)
	}
}

// WithKeepalivePeriod is the period the keepalive runs at: with a 30 s ttl the default period is
// 10 s, so three keepalives within 5 s of the open are the option's.
func TestSessionKeepalivePeriod(t *testing.T) {
	ctx := testserver.Ctx(t, 20*time.Second)
	rdb := testserver.New(t).Client(t)
	before := commandCalls(t, rdb, "lock.session|keepalive")
	s, err := redislock.NewSession(ctx, rdb, redislock.WithSessionTTL(30*time.Second),
		redislock.WithKeepalivePeriod(50*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close(ctx)
	testserver.Eventually(t, 5*time.Second, "3 keepalives (the default period is 10 s)", func() bool {
		return commandCalls(t, rdb, "lock.session|keepalive") >= before+3
	})
	if s.Err() != nil {
		t.Fatalf("session Err %v", s.Err())
	}
}

// A keepalive period that is not positive, or not shorter than the ttl, is refused before
// anything is sent.
func TestSessionKeepalivePeriodRefused(t *testing.T) {
	ctx := testserver.Ctx(t, 20*time.Second)
	rdb := testserver.New(t).Client(t)
	for _, c := range []struct {
		ttl, period time.Duration
		want        string
	}{
		{3 * time.Second, 0, "redislock: the keepalive period must be positive, got 0s"},
		{3 * time.Second, -time.Second, "redislock: the keepalive period must be positive, got -1s"},
		{3 * time.Second, 3 * time.Second, "redislock: the keepalive period must be shorter than the session ttl (3s), got 3s"},
		{3 * time.Second, 5 * time.Second, "redislock: the keepalive period must be shorter than the session ttl (3s), got 5s"},
		{redislock.DefaultSessionTTL, time.Minute, "redislock: the keepalive period must be shorter than the session ttl (10s), got 1m0s"},
	} {
		opts := []redislock.SessionOption{redislock.WithKeepalivePeriod(c.period)}
		if c.ttl != redislock.DefaultSessionTTL {
			opts = append(opts, redislock.WithSessionTTL(c.ttl))
		}
		s, err := redislock.NewSession(ctx, rdb, opts...)
		if s != nil || !errors.Is(err, redislock.ErrInvalidArgument) || err.Error() != c.want {
			t.Errorf("ttl %v, period %v: %v %v, want %q", c.ttl, c.period, s, err, c.want)
		}
	}
	if n := commandCalls(t, rdb, "lock.session|open"); n != 0 {
		t.Fatalf("%d LOCK.SESSION OPEN sent for refused periods", n)
	}
}
