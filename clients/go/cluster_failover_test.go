package redislock_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	redislock "redis-lock/clients/go"
	"redis-lock/clients/go/internal/testserver"
)

// A planned CLUSTER FAILOVER of the shard that serves the test's hash tag (3 masters with a
// replica each), as issue 34 asks of every client: a watchdog hold, a hold in an unbound and
// one in a BOUND session (ttl 3 s), and a waiter queued behind a holder, all on the shard's
// master. After it: the holds are on the new master with their tokens; both sessions are
// renewed there (the unbound one's keepalive follows MOVED to the new master, the bound one is
// ATTACHed on a new connection there); the watchdog renews there; the waiter, answered
// UNBLOCKED (or its connection closed) by the demoted master, queues again there by itself and
// is granted at the release; nothing is reported lost. The loss feed follows the key to the new
// master, also for a client whose map of the slots never learns of the failover (it moves to
// the node the old master's MOVED names, not to the one the map names).
func TestClusterFailover(t *testing.T) {
	ctx := testserver.Ctx(t, 180*time.Second)
	var cl testserver.Cluster
	testserver.StartHarness(t, &cl, "cluster", "--masters", "3", "--replicas", "1")
	var addrs []string
	for _, n := range cl.Nodes {
		addrs = append(addrs, fmt.Sprintf("127.0.0.1:%d", n.Port))
	}
	rdb := redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs})
	t.Cleanup(func() { _ = rdb.Close() })
	c := redislock.New(rdb)
	t.Cleanup(func() { _ = c.Close() })

	tag := "{fo-planned}"
	master, err := rdb.MasterForKey(ctx, tag)
	if err != nil {
		t.Fatal(err)
	}
	oldAddr := master.Options().Addr
	old := redis.NewClient(&redis.Options{Addr: oldAddr})
	t.Cleanup(func() { _ = old.Close() })
	var replica *redis.Client
	for _, a := range addrs {
		n := redis.NewClient(&redis.Options{Addr: a})
		t.Cleanup(func() { _ = n.Close() })
		if role, err := n.Do(ctx, "ROLE").Slice(); err == nil && role[0] == "slave" && fmt.Sprintf("%v:%v", role[1], role[2]) == oldAddr {
			replica = n
		}
	}
	if replica == nil {
		t.Fatalf("no replica of %s", oldAddr)
	}

	lost := make(chan string, 10)
	report := func(what string) func(error) { return func(err error) { lost <- what + ": " + err.Error() } }
	plain := redislock.NewMutex(c, tag+"plain", redislock.WithTTL(3*time.Second), redislock.WithOnLost(report("plain")))
	if err := plain.TryLock(ctx); err != nil {
		t.Fatal(err)
	}
	unbound, err := redislock.NewSession(ctx, rdb, redislock.WithSessionTTL(3*time.Second), redislock.WithSessionKey(tag), redislock.WithUnbound())
	if err != nil {
		t.Fatal(err)
	}
	inUnbound := redislock.NewMutex(unbound, tag+"s1", redislock.WithOnLost(report("unbound hold")))
	if err := inUnbound.TryLock(ctx); err != nil {
		t.Fatal(err)
	}
	bound, err := redislock.NewSession(ctx, rdb, redislock.WithSessionTTL(3*time.Second), redislock.WithSessionKey(tag))
	if err != nil {
		t.Fatal(err)
	}
	inBound := redislock.NewMutex(bound, tag+"s2", redislock.WithOnLost(report("bound hold")))
	if err := inBound.TryLock(ctx); err != nil {
		t.Fatal(err)
	}
	// A hold whose loss only the feed can report in time (its watchdog renews every 20 s).
	watchedLost := make(chan error, 1)
	watched := redislock.NewMutex(c, tag+"watched", redislock.WithTTL(30*time.Second), redislock.WithRenewEvery(20*time.Second),
		redislock.WithOnLost(func(err error) { watchedLost <- err }))
	if err := watched.TryLock(ctx); err != nil {
		t.Fatal(err)
	}
	// The same through a cluster client whose map of the slots stays as it is now (ClusterSlots
	// answers this snapshot at every reload): the map names the old master forever, so a feed
	// that moved to the node the map names would never watch on the new one.
	slots, err := rdb.ClusterSlots(ctx).Result()
	if err != nil {
		t.Fatal(err)
	}
	frozen := redis.NewClusterClient(&redis.ClusterOptions{
		ClusterSlots: func(context.Context) ([]redis.ClusterSlot, error) { return slots, nil },
	})
	t.Cleanup(func() { _ = frozen.Close() })
	fc := redislock.New(frozen)
	t.Cleanup(func() { _ = fc.Close() })
	frozenLost := make(chan error, 1)
	frozenWatched := redislock.NewMutex(fc, tag+"frozen", redislock.WithTTL(30*time.Second), redislock.WithRenewEvery(20*time.Second),
		redislock.WithOnLost(func(err error) { frozenLost <- err }))
	if err := frozenWatched.TryLock(ctx); err != nil {
		t.Fatal(err)
	}
	held := map[string]int64{tag + "frozen": frozenWatched.Token(), tag + "watched": watched.Token(), tag + "plain": plain.Token(), tag + "s1": inUnbound.Token(), tag + "s2": inBound.Token()}

	holder := redislock.NewMutex(c, tag+"busy", redislock.WithTTL(60*time.Second), redislock.WithWatchdog(false))
	if err := holder.TryLock(ctx); err != nil {
		t.Fatal(err)
	}
	holderToken := holder.Token()
	waiter := redislock.NewMutex(c, tag+"busy", redislock.WithTTL(60*time.Second), redislock.WithWatchdog(false))
	waited := make(chan error, 1)
	go func() { waited <- waiter.Lock(ctx) }()
	// An election: alpha leads (in the bound session), beta waits (in the unbound one), and an
	// observer.
	alpha := redislock.NewElection(bound, tag+"leader")
	if err := alpha.Campaign(ctx, "alpha"); err != nil {
		t.Fatal(err)
	}
	alphaTerm := alpha.Term()
	beta := redislock.NewElection(unbound, tag+"leader")
	campaigned := make(chan error, 1)
	go func() { campaigned <- beta.Campaign(ctx, "beta") }()
	obsCtx, stopObserving := context.WithCancel(ctx)
	defer stopObserving()
	observed := alpha.Observe(obsCtx)
	next := func() redislock.Leader {
		select {
		case l := <-observed:
			return l
		case <-time.After(30 * time.Second):
			t.Fatal("no change observed within 30 s")
		}
		return redislock.Leader{}
	}
	if l := next(); l.Value != "alpha" || l.Term != alphaTerm {
		t.Fatalf("observed first %+v, alpha leads with term %d", l, alphaTerm)
	}
	waiters := func(n *redis.Client, key string) int64 {
		info, err := redislock.Inspect(ctx, n, key)
		if err != nil || info == nil {
			return -1
		}
		return info.Waiters
	}
	testserver.Eventually(t, 10*time.Second, "the waiter and the candidate queued on the old master", func() bool {
		return waiters(old, tag+"busy") == 1 && waiters(old, tag+"leader") == 1
	})

	calls := func(n *redis.Client, command string) int64 {
		info, _ := n.Info(ctx, "commandstats").Result()
		for _, line := range strings.Split(info, "\r\n") {
			if rest, ok := strings.CutPrefix(line, "cmdstat_"+command+":calls="); ok {
				var v int64
				fmt.Sscan(strings.SplitN(rest, ",", 2)[0], &v)
				return v
			}
		}
		return 0
	}
	keepalives := calls(replica, "lock.session|keepalive")
	started := time.Now()
	if err := replica.Do(ctx, "CLUSTER", "FAILOVER").Err(); err != nil {
		t.Fatal(err)
	}
	role := func(n *redis.Client) string {
		r, err := n.Do(ctx, "ROLE").Slice()
		if err != nil || len(r) == 0 {
			return ""
		}
		return fmt.Sprint(r[0])
	}
	testserver.Eventually(t, 30*time.Second, "the replica promoted, the old master a replica", func() bool {
		return role(replica) == "master" && role(old) == "slave"
	})
	promoted := time.Since(started)

	// Both sessions renewed on the new master, the bound one ATTACHed there, the watchdog too.
	testserver.Eventually(t, 30*time.Second, "keepalives on the new master", func() bool {
		return calls(replica, "lock.session|keepalive") >= keepalives+4
	})
	testserver.Eventually(t, 30*time.Second, "an extend on the new master", func() bool {
		return calls(replica, "lock.extend") >= 2
	})
	testserver.Eventually(t, 30*time.Second, "the bound session attached on the new master", func() bool {
		reply, err := replica.Do(ctx, "LOCK.SESSION", "INFO", bound.ID()).Result()
		fields, ok := reply.(map[any]any)
		return err == nil && ok && fields["bound"] != nil
	})
	followed := time.Since(started)
	for key, token := range held {
		if got := fence(t, replica, key); got != token {
			t.Fatalf("%s on the new master: token %d, held with %d", key, got, token)
		}
	}
	select {
	case what := <-lost:
		t.Fatalf("reported lost: %s", what)
	case <-unbound.Done():
		t.Fatalf("the unbound session ended: %v", unbound.Err())
	case <-bound.Done():
		t.Fatalf("the bound session ended: %v", bound.Err())
	case <-plain.Done():
		t.Fatalf("the plain hold ended: %v", plain.Err())
	default:
	}

	// The feed followed the key to the new master: a DEL there is reported at once.
	if err := rdb.Del(ctx, tag+"watched").Err(); err != nil {
		t.Fatal(err)
	}
	deleted := time.Now()
	select {
	case err := <-watchedLost:
		if !errors.Is(err, redislock.ErrLost) {
			t.Fatalf("the watched hold's loss: %v", err)
		}
		t.Logf("the DEL on the new master reported by the feed after %v", time.Since(deleted).Round(time.Microsecond))
	case <-time.After(5 * time.Second):
		t.Fatal("the DEL on the new master was not reported within 5 s (the feed did not follow the key)")
	}
	// And through the frozen map: the feed is on the node the MOVED named (its watchdog renews
	// only after 20 s).
	if err := replica.Del(ctx, tag+"frozen").Err(); err != nil {
		t.Fatal(err)
	}
	deleted = time.Now()
	select {
	case err := <-frozenLost:
		if !errors.Is(err, redislock.ErrLost) || !strings.Contains(err.Error(), "feed:") {
			t.Fatalf("the frozen-map hold's loss: %v", err)
		}
		t.Logf("the DEL on the new master reported through the frozen map after %v", time.Since(deleted).Round(time.Microsecond))
	case <-time.After(5 * time.Second):
		t.Fatal("the DEL on the new master was not reported within 5 s through a map that names the old master (the feed moved to the map's node, not the MOVED's)")
	}

	// The waiter was answered by the demoted master and queued again on the new one by itself.
	testserver.Eventually(t, 30*time.Second, "the waiter queued on the new master", func() bool { return waiters(replica, tag+"busy") == 1 })
	if err := holder.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-waited:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the waiter was not granted")
	}
	if got := fence(t, replica, tag+"busy"); got != waiter.Token() || waiter.Token() <= holderToken {
		t.Fatalf("the waiter: token %d, the new master says %d", waiter.Token(), got)
	}

	// The candidate queued again on the new master; alpha still leads there. At alpha's resign
	// beta leads, and the observer, now on the new master, sees it: never two leaders at once
	// (only "nobody" may come between).
	testserver.Eventually(t, 30*time.Second, "the candidate queued on the new master", func() bool { return waiters(replica, tag+"leader") == 1 })
	if got := fence(t, replica, tag+"leader"); got != alphaTerm {
		t.Fatalf("alpha's term on the new master: %d, led with %d", got, alphaTerm)
	}
	if err := alpha.Resign(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-campaigned:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("beta does not lead")
	}
	if beta.Term() <= alphaTerm {
		t.Fatalf("beta's term %d, alpha's %d", beta.Term(), alphaTerm)
	}
	for {
		l := next()
		if l.Value == "beta" && l.Term == beta.Term() {
			break
		}
		if l.Term != 0 {
			t.Fatalf("observed %+v between alpha and beta", l)
		}
	}
	stopObserving()
	if err := beta.Resign(ctx); err != nil {
		t.Fatal(err)
	}
	for _, m := range []*redislock.Mutex{plain, inUnbound, inBound, waiter} {
		if err := m.Unlock(context.Background()); err != nil {
			t.Fatalf("%s: %v", m.Key(), err)
		}
	}
	for _, s := range []*redislock.Session{unbound, bound} {
		if n, err := s.CloseCount(ctx); err != nil || n != 0 {
			t.Fatalf("CloseCount: %d %v", n, err)
		}
	}
	if len(lost) != 0 {
		t.Fatalf("reported lost: %s", <-lost)
	}
	t.Logf("CLUSTER FAILOVER answered; the replica was master after %v, the sessions and the watchdog were renewed there after %v",
		promoted.Round(time.Millisecond), followed.Round(time.Millisecond))
}

// A master killed (SIGKILL) and its replica promoted (CLUSTER FAILOVER FORCE), 3+1 cluster:
// grants taken WithDurable(1) are all on the new master with their tokens, a BOUND session
// (ttl 3 s) is ATTACHed there and renewed, the watchdog renews there, nothing is reported lost.
func TestClusterKilledMaster(t *testing.T) {
	ctx := testserver.Ctx(t, 180*time.Second)
	var cl testserver.Cluster
	testserver.StartHarness(t, &cl, "cluster", "--masters", "3", "--replicas", "1")
	var addrs []string
	for _, n := range cl.Nodes {
		addrs = append(addrs, fmt.Sprintf("127.0.0.1:%d", n.Port))
	}
	rdb := redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs})
	t.Cleanup(func() { _ = rdb.Close() })
	c := redislock.New(rdb)
	t.Cleanup(func() { _ = c.Close() })

	tag := "{fo-killed}"
	master, err := rdb.MasterForKey(ctx, tag)
	if err != nil {
		t.Fatal(err)
	}
	oldAddr := master.Options().Addr
	oldPid := 0
	var replica *redis.Client
	for i, a := range addrs {
		if a == oldAddr {
			oldPid = cl.Nodes[i].Pid
		}
		n := redis.NewClient(&redis.Options{Addr: a})
		t.Cleanup(func() { _ = n.Close() })
		if role, err := n.Do(ctx, "ROLE").Slice(); err == nil && role[0] == "slave" && fmt.Sprintf("%v:%v", role[1], role[2]) == oldAddr {
			replica = n
		}
	}
	if replica == nil || oldPid == 0 {
		t.Fatalf("no replica of %s, or its pid", oldAddr)
	}

	lost := make(chan string, 10)
	report := func(what string) func(error) { return func(err error) { lost <- what + ": " + err.Error() } }
	plain := redislock.NewMutex(c, tag+"plain", redislock.WithTTL(3*time.Second), redislock.WithOnLost(report("plain")))
	if err := plain.TryLock(ctx); err != nil {
		t.Fatal(err)
	}
	session, err := redislock.NewSession(ctx, rdb, redislock.WithSessionTTL(3*time.Second), redislock.WithSessionKey(tag))
	if err != nil {
		t.Fatal(err)
	}
	inSession := redislock.NewMutex(session, tag+"s", redislock.WithOnLost(report("session hold")))
	if err := inSession.TryLock(ctx); err != nil {
		t.Fatal(err)
	}
	held := map[string]int64{tag + "s": inSession.Token()}
	for i := 0; i < 10; i++ {
		m := redislock.NewMutex(c, fmt.Sprintf("%sdurable:%d", tag, i), redislock.WithTTL(60*time.Second),
			redislock.WithWatchdog(false), redislock.WithDurable(1, 5*time.Second))
		if err := m.TryLock(ctx); err != nil {
			t.Fatal(err)
		}
		held[m.Key()] = m.Token()
	}

	if err := syscall.Kill(oldPid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	killed := time.Now()
	if err := replica.Do(ctx, "CLUSTER", "FAILOVER", "FORCE").Err(); err != nil {
		t.Fatal(err)
	}
	testserver.Eventually(t, 30*time.Second, "the replica promoted", func() bool {
		r, err := replica.Do(ctx, "ROLE").Slice()
		return err == nil && r[0] == "master"
	})
	promoted := time.Since(killed)
	for key, token := range held {
		if got := fence(t, replica, key); got != token {
			t.Fatalf("%s on the new master: token %d, granted (durable) with %d", key, got, token)
		}
	}
	testserver.Eventually(t, 30*time.Second, "the session attached on the new master", func() bool {
		reply, err := replica.Do(ctx, "LOCK.SESSION", "INFO", session.ID()).Result()
		fields, ok := reply.(map[any]any)
		return err == nil && ok && fields["bound"] != nil
	})
	followed := time.Since(killed)
	// Two keepalive periods more, and the watchdog's renewal: nothing lost meanwhile.
	pttl := func() int64 { return replica.PTTL(ctx, tag+"plain").Val().Milliseconds() }
	low := pttl()
	testserver.Eventually(t, 10*time.Second, "a renewal on the new master", func() bool { return pttl() > low })
	time.Sleep(2 * time.Second)
	select {
	case what := <-lost:
		t.Fatalf("reported lost: %s", what)
	case <-session.Done():
		t.Fatalf("the session ended: %v", session.Err())
	default:
	}
	if got := fence(t, replica, tag+"plain"); got != plain.Token() {
		t.Fatalf("plain on the new master: %d, held with %d", got, plain.Token())
	}
	if n, err := session.CloseCount(ctx); err != nil || n != 1 {
		t.Fatalf("CloseCount: %d %v", n, err)
	}
	t.Logf("SIGKILL of the master; its replica master after %v, the session attached there after %v",
		promoted.Round(time.Millisecond), followed.Round(time.Millisecond))
}
