package redislock_test

import (
	"fmt"
	"os"
	"regexp"
	"sort"
	"strings"
	"testing"
	"time"

	redislock "redis-lock/clients/go"
	"redis-lock/clients/go/internal/testserver"
)

// clientNames are the names in CLIENT LIST, sorted, with the whole list for messages.
func clientNames(t *testing.T, list string) []string {
	t.Helper()
	var names []string
	for _, line := range strings.Split(strings.TrimSpace(list), "\n") {
		for _, f := range strings.Fields(line) {
			if name, ok := strings.CutPrefix(f, "name="); ok && name != "" {
				names = append(names, name)
			}
		}
	}
	sort.Strings(names)
	return names
}

// Issue 32: CLIENT LIST says whose each connection is: the BOUND session's after its serial
// (never its id; the go-redis client's default session's too), the session's feed, an election observer and a waiter. The server is this
// test's own, so every named connection on it is one of these.
func TestConnectionNames(t *testing.T) {
	ctx := testserver.Ctx(t, 20*time.Second)
	rdb := testserver.New(t).Client(t)
	s, err := redislock.NewSession(ctx, rdb)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close(ctx)
	si, err := s.Info(ctx)
	if err != nil || si == nil {
		t.Fatalf("LOCK.SESSION INFO %+v %v", si, err)
	}
	if s.Serial() <= 0 {
		t.Fatalf("a bound session learns its serial: %d", s.Serial())
	}
	held := redislock.NewMutex(s, "names", redislock.WithOnLost(func(error) {}))
	if err := held.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	c := redislock.New(rdb)
	defer c.Close()
	got := make(chan error, 1)
	go func() { got <- redislock.NewMutex(c, "names").Lock(ctx) }()
	testserver.WaitBlocked(t, rdb, 1)
	redislock.NewElection(s, "names-election").Observe(ctx)
	ds, err := redislock.DefaultSession(ctx, rdb, "names") // the waiter's (the Client's locks join it)
	if err != nil {
		t.Fatal(err)
	}
	feed := regexp.MustCompile(fmt.Sprintf(`^redislock-feed-(watch|sub)-(%d-\d+)$`, os.Getpid()))
	var list string
	var names []string
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		list = rdb.ClientList(ctx).Val()
		names = clientNames(t, list)
		if len(names) >= 7 || time.Now().After(deadline) {
			break
		}
	}
	var rest []string
	feeds := map[string][]string{} // feed id -> its connections' kinds
	for _, n := range names {
		if m := feed.FindStringSubmatch(n); m != nil {
			feeds[m[2]] = append(feeds[m[2]], m[1])
		} else {
			rest = append(rest, n)
		}
	}
	want := []string{fmt.Sprintf("redislock-session-%d", s.Serial()), fmt.Sprintf("redislock-session-%d", ds.Serial()), "redislock-waiter"}
	sort.Strings(want)
	if strings.Join(rest, " ") != strings.Join(want, " ") || len(feeds) != 2 {
		t.Fatalf("names %q, want %q and two feeds (the session's, the observer's):\n%s", names, want, list)
	}
	for id, kinds := range feeds {
		sort.Strings(kinds)
		if strings.Join(kinds, " ") != "sub watch" {
			t.Fatalf("feed %s: %q\n%s", id, kinds, list)
		}
	}
	for _, line := range strings.Split(list, "\n") {
		if strings.Contains(line, " flags=b ") && !strings.Contains(line, " name=redislock-waiter ") {
			t.Fatalf("a blocked connection not named redislock-waiter: %s", line)
		}
		if strings.Contains(line, fmt.Sprintf(" name=redislock-session-%d ", s.Serial())) &&
			!strings.HasPrefix(line, fmt.Sprintf("id=%d ", si.Bound)) {
			t.Fatalf("the session's name on another connection than its bound one (%d): %s", si.Bound, line)
		}
	}
	secret := s.ID()[strings.Index(s.ID(), "}")+1:]
	if strings.Contains(list, s.ID()) || strings.Contains(list, secret) {
		t.Fatalf("the session id in CLIENT LIST:\n%s", list)
	}
	if err := held.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-got; err != nil {
		t.Fatal(err)
	}
}
