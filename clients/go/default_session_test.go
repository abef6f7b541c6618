package redislock_test

// The default session (defaultsession.go) against a real server: a lock made from a Client
// joins the go-redis client's one BOUND GRACE session. A holder process killed with SIGKILL
// hands its lock on when the server sees its connection close (plus the grace), long before
// the hold's own ttl; WithDefaultSession(false) keeps the ttl-only hold; one session per
// go-redis client whatever the number of locks; a CLIENT KILL of its connection keeps every
// hold; Close closes it; an acquire whose session ended queues again in a new one.
//
// Whether a hold was handed on by the session or by its ttl is read from the server's clock
// (TIME) and the old hold's ttl (LOCK.INFO), never from how long the test waited.

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

// defaultHolder is the child process of the killed-holder tests (REDISLOCK_HELPER=default-holder):
// it takes its lock as clients/go/README.md's first example does (a Mutex from
// redislock.New(rdb), the default ttl), or with WithDefaultSession(false) when
// REDISLOCK_MODE=ttl-only, prints its token and waits to be killed.
func defaultHolder() {
	ctx := context.Background()
	rdb := redis.NewClient(&redis.Options{Addr: os.Getenv("REDISLOCK_ADDR")})
	var opts []redislock.Option
	if os.Getenv("REDISLOCK_MODE") == "ttl-only" {
		opts = append(opts, redislock.WithDefaultSession(false))
	}
	mu := redislock.NewMutex(redislock.New(rdb), os.Getenv("REDISLOCK_KEY"), opts...)
	if err := mu.Lock(ctx); err != nil {
		fmt.Println("error", err)
		os.Exit(1)
	}
	fmt.Println("held", mu.Token())
	select {}
}

// SpawnDefaultHolder starts the holder process for key on addr and returns it with its token.
func spawnDefaultHolder(t testing.TB, addr, key, mode string) (*exec.Cmd, int64) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), "REDISLOCK_HELPER=default-holder", "REDISLOCK_ADDR="+addr,
		"REDISLOCK_KEY="+key, "REDISLOCK_MODE="+mode)
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
		t.Fatalf("holder: %q %v", line, err)
	}
	token, _ := strconv.ParseInt(strings.TrimSpace(strings.TrimPrefix(line, "held ")), 10, 64)
	return cmd, token
}

// serverMs is the server's clock in ms (TIME).
func serverMs(t testing.TB, rdb redis.UniversalClient) int64 {
	t.Helper()
	now, err := rdb.Time(context.Background()).Result()
	if err != nil {
		t.Fatal(err)
	}
	return now.UnixMilli()
}

// sessionList is LOCK.SESSION LIST on one server, every page: one field map per session.
func sessionList(t testing.TB, rdb redis.UniversalClient) []map[string]any {
	t.Helper()
	var all []map[string]any
	cursor := "0"
	for {
		reply, err := rdb.Do(context.Background(), "LOCK.SESSION", "LIST", cursor, "COUNT", 1000).Slice()
		if err != nil {
			t.Fatal(err)
		}
		entries, _ := reply[1].([]any)
		for _, e := range entries {
			all = append(all, fieldMap(e))
		}
		if cursor = fmt.Sprint(reply[0]); cursor == "0" {
			return all
		}
	}
}

// fieldMap reads a RESP2 flat array or a RESP3 map.
func fieldMap(v any) map[string]any {
	out := map[string]any{}
	switch m := v.(type) {
	case []any:
		for i := 0; i+1 < len(m); i += 2 {
			out[fmt.Sprint(m[i])] = m[i+1]
		}
	case map[any]any:
		for k, x := range m {
			out[fmt.Sprint(k)] = x
		}
	}
	return out
}

// sessionInfo is LOCK.SESSION INFO id through rdb (not the session's own connection); nil
// when the server has no such session.
func sessionInfo(t testing.TB, rdb redis.UniversalClient, id string) map[string]any {
	t.Helper()
	reply, err := rdb.Do(context.Background(), "LOCK.SESSION", "INFO", id).Result()
	if errors.Is(err, redis.Nil) {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	return fieldMap(reply)
}

func asInt(v any) int64 {
	n, _ := strconv.ParseInt(fmt.Sprint(v), 10, 64)
	return n
}

// A holder process made as the README's first example is killed with SIGKILL: the waiter is
// granted while the dead hold's own ttl (30 s) still had most of its time left, by the
// server's clock.
func TestDefaultSessionKilledHolder(t *testing.T) {
	ctx := testserver.Ctx(t, 60*time.Second)
	srv := testserver.New(t)
	rdb := srv.Client(t)
	child, token := spawnDefaultHolder(t, srv.Addr(), "nightly", "default")
	info, err := redislock.Inspect(ctx, rdb, "nightly")
	if err != nil || info == nil || len(info.Holders) != 1 || info.Holders[0].Token != token ||
		!info.Holders[0].Session || info.Holders[0].TTL <= 0 {
		t.Fatalf("the holder's hold: %+v %v", info, err)
	}
	waiter := redislock.NewMutex(redislock.New(rdb), "nightly", redislock.WithDefaultSession(false))
	got := make(chan error, 1)
	go func() { got <- waiter.Lock(ctx) }()
	testserver.WaitBlocked(t, rdb, 1)
	left := info.Holders[0].TTL
	if now, _ := redislock.Inspect(ctx, rdb, "nightly"); now != nil && len(now.Holders) == 1 {
		left = now.Holders[0].TTL
	}
	killedAt := serverMs(t, rdb)
	if err := child.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	if err := <-got; err != nil {
		t.Fatal(err)
	}
	took := time.Duration(serverMs(t, rdb)-killedAt) * time.Millisecond
	t.Logf("granted %v after the kill by the server's clock; the dead hold had %v of its ttl left", took, left)
	if took >= left/2 {
		t.Fatalf("granted %v after the kill: not before half of the dead hold's %v left", took, left)
	}
	if waiter.Token() <= token || waiter.Token() != fence(t, rdb, "nightly") {
		t.Fatalf("waiter token %d, the dead holder's %d", waiter.Token(), token)
	}
	if n := infoLock(t, rdb, "lock_sessions_grace_expired"); n != 1 {
		t.Fatalf("lock_sessions_grace_expired %d, want 1 (the dead holder's session)", n)
	}
	if err := waiter.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
}

// WithDefaultSession(false) keeps the ttl-only hold: no session is opened, and a killed
// holder's hold stays after the server has closed its connections.
func TestDefaultSessionOptOutKeepsTTL(t *testing.T) {
	ctx := testserver.Ctx(t, 30*time.Second)
	srv := testserver.New(t)
	rdb := srv.Client(t)
	clients := func() int64 {
		s, _ := rdb.Info(ctx, "clients").Result()
		for _, line := range strings.Split(s, "\r\n") {
			if v, ok := strings.CutPrefix(line, "connected_clients:"); ok {
				n, _ := strconv.ParseInt(v, 10, 64)
				return n
			}
		}
		return -1
	}
	before := clients()
	child, token := spawnDefaultHolder(t, srv.Addr(), "ttl-only", "ttl-only")
	info, err := redislock.Inspect(ctx, rdb, "ttl-only")
	if err != nil || info == nil || len(info.Holders) != 1 || info.Holders[0].Session || info.Holders[0].TTL <= 0 {
		t.Fatalf("an opted-out hold: %+v %v", info, err)
	}
	if n := infoLock(t, rdb, "lock_sessions_opened"); n != 0 {
		t.Fatalf("%d sessions opened by an opted-out lock", n)
	}
	if err := child.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	testserver.Eventually(t, 10*time.Second, "the killed holder's connections closed", func() bool { return clients() == before })
	if fence(t, rdb, "ttl-only") != token {
		t.Fatal("the ttl-only hold did not outlive its holder's connections")
	}
	if info, _ := redislock.Inspect(ctx, rdb, "ttl-only"); info == nil || info.Holders[0].TTL <= 0 || info.Holders[0].Session {
		t.Fatalf("after the kill: %+v", info)
	}
	// A lock-delay lock joins no session either (its delay is its own).
	m := redislock.NewMutex(redislock.New(rdb), "delayed", redislock.WithLockDelay(time.Second))
	if err := m.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	if info, _ := redislock.Inspect(ctx, rdb, "delayed"); info == nil || info.Holders[0].Session {
		t.Fatalf("a lock-delay lock: %+v", info)
	}
	if n := len(sessionList(t, rdb)); n != 0 {
		t.Fatalf("%d sessions", n)
	}
}

// Every kind of lock made from Clients on one go-redis client shares one default session, each
// hold with its own ttl; Close closes it (the holds end with ErrSessionClosed, the keys are
// free) and the next lock opens a new one.
func TestDefaultSessionOnePerClient(t *testing.T) {
	ctx := testserver.Ctx(t, 30*time.Second)
	rdb := testserver.New(t).Client(t)
	c, c2 := redislock.New(rdb), redislock.New(rdb)
	m := redislock.NewMutex(c, "m")
	sem := redislock.NewSemaphore(c, "sem", 2)
	rw := redislock.NewRWMutex(c, "rw")
	rw2 := redislock.NewRWMutex(c2, "rw2")
	multi := redislock.NewMultiLock(c, []string{"x", "y"})
	other := redislock.NewMutex(c2, "other", redislock.WithTTL(5*time.Second))
	e := redislock.NewElection(c, "leader")
	for _, lock := range []func(context.Context) error{m.Lock, sem.Acquire, rw.RLock, rw2.Lock, multi.Lock, other.Lock} {
		if err := lock(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if err := e.Campaign(ctx, "node-1"); err != nil {
		t.Fatal(err)
	}
	s, err := redislock.DefaultSession(ctx, rdb, "m")
	if err != nil {
		t.Fatal(err)
	}
	list := sessionList(t, rdb)
	if len(list) != 1 || asInt(list[0]["serial"]) != s.Serial() || asInt(list[0]["holds"]) != 8 {
		t.Fatalf("LOCK.SESSION LIST %v, want one session (serial %d) with 8 holds", list, s.Serial())
	}
	for _, key := range []string{"m", "sem", "rw", "rw2", "x", "y", "other", "leader"} {
		info, _ := redislock.Inspect(ctx, rdb, key)
		if info == nil || len(info.Holders) != 1 || info.Holders[0].SessionSerial != s.Serial() || info.Holders[0].TTL <= 0 {
			t.Fatalf("%s: %+v, want a hold of session %d with a ttl of its own", key, info, s.Serial())
		}
	}
	si := sessionInfo(t, rdb, s.ID())
	if asInt(si["grace"]) != 500 || si["detached"] != nil || asInt(si["bound"]) == 0 {
		t.Fatalf("LOCK.SESSION INFO %v", si)
	}
	names := clientNames(t, rdb.ClientList(ctx).Val())
	if want := fmt.Sprintf("redislock-session-%d", s.Serial()); strings.Join(names, " ") != want {
		t.Fatalf("CLIENT LIST names %q, want only %s", names, want)
	}
	// The hold's own ttl still works on top: Extend moves it, and Done is open.
	if err := other.Extend(ctx, time.Minute); err != nil {
		t.Fatal(err)
	}
	if ttl, _ := rdb.PTTL(ctx, "other").Result(); ttl < 50*time.Second {
		t.Fatalf("PTTL %v after Extend(1m)", ttl)
	}

	if err := redislock.Close(ctx, rdb); err != nil {
		t.Fatal(err)
	}
	<-s.Done()
	if !errors.Is(s.Err(), redislock.ErrSessionClosed) {
		t.Fatalf("session Err %v", s.Err())
	}
	for _, done := range []struct {
		done func() <-chan struct{}
		err  func() error
	}{{m.Done, m.Err}, {rw2.Writer().Done, rw2.Writer().Err}, {multi.Done, multi.Err}} {
		select {
		case <-done.done():
		case <-ctx.Done():
			t.Fatal("a hold's Done not closed after Close")
		}
		if err := done.err(); !errors.Is(err, redislock.ErrSessionClosed) || errors.Is(err, redislock.ErrLost) {
			t.Fatalf("Err after Close: %v", err)
		}
	}
	<-e.Done()
	if keys, _ := rdb.Keys(ctx, "*").Result(); len(keys) != 0 {
		t.Fatalf("keys after Close: %v", keys)
	}
	if n := infoLock(t, rdb, "lock_sessions"); n != 0 {
		t.Fatalf("lock_sessions %d after Close", n)
	}
	// The next lock opens a new one.
	if err := m.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	info, _ := redislock.Inspect(ctx, rdb, "m")
	if info.Holders[0].SessionSerial == s.Serial() || !info.Holders[0].Session {
		t.Fatalf("after Close: %+v (old session %d)", info.Holders[0], s.Serial())
	}
	if err := c.Close(); err != nil { // Client.Close closes it too
		t.Fatal(err)
	}
	if n := infoLock(t, rdb, "lock_sessions"); n != 0 || fence(t, rdb, "m") != 0 {
		t.Fatalf("lock_sessions %d after Client.Close", n)
	}
}

// A go-redis client closed without redislock.Close: the default session's keepalive finds it
// closed (within a keepalive period, 3.3 s) and closes the session, releasing its holds.
func TestDefaultSessionClosedWithItsClient(t *testing.T) {
	ctx := testserver.Ctx(t, 30*time.Second)
	srv := testserver.New(t)
	rdb := srv.Client(t)
	own := redis.NewClient(&redis.Options{Addr: srv.Addr()})
	m := redislock.NewMutex(redislock.New(own), "closed-with-rdb")
	if err := m.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	if n := infoLock(t, rdb, "lock_sessions"); n != 1 {
		t.Fatalf("lock_sessions %d", n)
	}
	if err := own.Close(); err != nil {
		t.Fatal(err)
	}
	testserver.Eventually(t, 10*time.Second, "the default session closed", func() bool {
		return infoLock(t, rdb, "lock_sessions_closed") == 1
	})
	if fence(t, rdb, "closed-with-rdb") != 0 {
		t.Fatal("held after its session was closed")
	}
	<-m.Done()
	if !errors.Is(m.Err(), redislock.ErrSessionClosed) {
		t.Fatalf("Err %v", m.Err())
	}
}

// A CLIENT KILL of the default session's connection, the process alive: the keepalive
// ATTACHes the session on a new connection within the grace, and every hold is kept with its
// token.
func TestDefaultSessionBlipKeepsHolds(t *testing.T) {
	ctx := testserver.Ctx(t, 30*time.Second)
	rdb := testserver.New(t).Client(t)
	c := redislock.New(rdb)
	defer c.Close()
	m := redislock.NewMutex(c, "a")
	sem := redislock.NewSemaphore(c, "b", 3)
	multi := redislock.NewMultiLock(c, []string{"c", "d"})
	for _, lock := range []func(context.Context) error{m.Lock, sem.Acquire, multi.Lock} {
		if err := lock(ctx); err != nil {
			t.Fatal(err)
		}
	}
	s, err := redislock.DefaultSession(ctx, rdb, "a")
	if err != nil {
		t.Fatal(err)
	}
	old := asInt(sessionInfo(t, rdb, s.ID())["bound"])
	if err := rdb.Do(ctx, "CLIENT", "KILL", "ID", old).Err(); err != nil {
		t.Fatal(err)
	}
	testserver.Eventually(t, 10*time.Second, "the session bound to a new connection", func() bool {
		si := sessionInfo(t, rdb, s.ID())
		return si != nil && asInt(si["bound"]) != 0 && asInt(si["bound"]) != old && si["detached"] == nil
	})
	holds := map[string]int64{"a": m.Token(), "b": sem.Token(), "c": multi.Tokens()[0], "d": multi.Tokens()[1]}
	for key, token := range holds {
		if n, err := rdb.Do(ctx, "LOCK.FENCE", key, token).Int64(); err != nil || n != 1 || token == 0 {
			t.Fatalf("%s: token %d not live after the blip (%d %v)", key, token, n, err)
		}
	}
	for _, done := range []<-chan struct{}{m.Done(), sem.Done(), multi.Done()} {
		select {
		case <-done:
			t.Fatalf("a hold ended by the blip: %v %v %v", m.Err(), sem.Err(), multi.Err())
		default:
		}
	}
	if s.Err() != nil {
		t.Fatalf("session Err %v", s.Err())
	}
	for field, want := range map[string]int64{"lock_sessions_detached": 1, "lock_sessions_reattached": 1, "lock_sessions_grace_expired": 0} {
		if n := infoLock(t, rdb, field); n != want {
			t.Fatalf("%s %d, want %d", field, n, want)
		}
	}
	names := clientNames(t, rdb.ClientList(ctx).Val())
	if want := fmt.Sprintf("redislock-session-%d", s.Serial()); strings.Join(names, " ") != want {
		t.Fatalf("CLIENT LIST names %q after the blip, want %s", names, want)
	}
	// The session goes on: a new lock joins it, and the holds release normally.
	n := redislock.NewMutex(c, "e")
	if err := n.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	if info, _ := redislock.Inspect(ctx, rdb, "e"); info.Holders[0].SessionSerial != s.Serial() {
		t.Fatalf("a new lock after the blip: %+v", info.Holders[0])
	}
	for _, unlock := range []func(context.Context) error{m.Unlock, sem.Release, multi.Unlock, n.Unlock} {
		if err := unlock(ctx); err != nil {
			t.Fatal(err)
		}
	}
}

// A waiter whose default session ends while it waits (closed by someone who knew its id)
// queues again in a new default session within its context, and is granted there.
func TestDefaultSessionEndedWaiterRequeues(t *testing.T) {
	ctx := testserver.Ctx(t, 30*time.Second)
	rdb := testserver.New(t).Client(t)
	c := redislock.New(rdb)
	defer c.Close()
	holder := redislock.NewMutex(c, "q", redislock.WithDefaultSession(false))
	if err := holder.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	waiter := redislock.NewMutex(c, "q")
	got := make(chan error, 1)
	go func() { got <- waiter.Lock(ctx) }()
	testserver.WaitBlocked(t, rdb, 1)
	s, err := redislock.DefaultSession(ctx, rdb, "q")
	if err != nil {
		t.Fatal(err)
	}
	if err := rdb.Do(ctx, "LOCK.SESSION", "CLOSE", s.ID()).Err(); err != nil {
		t.Fatal(err)
	}
	testserver.Eventually(t, 10*time.Second, "the waiter queued again in a new session", func() bool {
		list := sessionList(t, rdb)
		info, _ := redislock.Inspect(ctx, rdb, "q")
		return len(list) == 1 && asInt(list[0]["serial"]) != s.Serial() && info != nil && info.Waiters == 1
	})
	if err := holder.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-got; err != nil {
		t.Fatal(err)
	}
	info, _ := redislock.Inspect(ctx, rdb, "q")
	if info.Holders[0].Token != waiter.Token() || !info.Holders[0].Session || info.Holders[0].SessionSerial == s.Serial() {
		t.Fatalf("granted %+v, waiter token %d, old session %d", info.Holders[0], waiter.Token(), s.Serial())
	}
	if err := waiter.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
}
