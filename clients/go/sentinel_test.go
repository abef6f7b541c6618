package redislock_test

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	redislock "redis-lock/clients/go"
	"redis-lock/clients/go/internal/testserver"
)

// A Sentinel failover (SENTINEL FAILOVER, planned) through go-redis's failover client: a
// primary, its replica and one Sentinel (harness sentinel). Before it: a plain hold with its
// watchdog, a hold in a BOUND session, and a waiter queued on the primary behind the plain
// hold, every grant on the replica. After it, what docs/scaling-out.md promises: the holds are
// on the new primary with their tokens; the watchdog renews there; the session is there, bound
// again (the client ATTACHes it on a new connection once Sentinel kills its old one); a new
// lock is taken there with a greater token; the waiter, answered by the demoted primary
// (UNBLOCKED, or its connection killed), queues again on the new primary and is granted there
// at the release, with a greater token. Nothing is reported lost.
//
// The ttls are long (30 s) because the old primary stays a primary until Sentinel repoints it
// (seconds after the promotion): a shorter ttl would let the old primary hand the plain hold to
// the waiter there meanwhile (two primaries for a while: what Sentinel does, not the client).
func TestSentinelFailover(t *testing.T) {
	ctx := testserver.Ctx(t, 120*time.Second)
	primary := testserver.New(t)
	replica := testserver.NewReplica(t, primary)
	pc, rc := primary.Client(t), replica.Client(t)
	testserver.Eventually(t, 20*time.Second, "the replica's link up", func() bool {
		info, _ := rc.Info(ctx, "replication").Result()
		return strings.Contains(info, "master_link_status:up")
	})
	var sentinel testserver.Server
	testserver.StartHarness(t, &sentinel, "sentinel", "--primary-port", fmt.Sprint(primary.Port))
	sc := redis.NewSentinelClient(&redis.Options{Addr: sentinel.Addr()})
	t.Cleanup(func() { _ = sc.Close() })
	testserver.Eventually(t, 30*time.Second, "the Sentinel knows the replica, its link ok", func() bool {
		replicas, err := sc.Replicas(ctx, "mymaster").Result()
		if err != nil || len(replicas) != 1 {
			return false
		}
		return replicas[0]["flags"] == "slave" && replicas[0]["master-link-status"] == "ok" &&
			replicas[0]["port"] == fmt.Sprint(replica.Port)
	})

	rdb := redis.NewFailoverClient(&redis.FailoverOptions{MasterName: "mymaster", SentinelAddrs: []string{sentinel.Addr()}})
	t.Cleanup(func() { _ = rdb.Close() })
	c := redislock.New(rdb)
	t.Cleanup(func() { _ = c.Close() })
	// The plain holds here are ttl-only (WithDefaultSession(false)): this test is about a hold
	// whose ttl outlasts the window in which the demoted primary is still a primary. In the
	// default session such a hold would be freed there DefaultSessionGrace after the bound
	// connection to it closed (the session is ATTACHed on the new primary, and the old one
	// ends its copy after the grace), and the old primary granted its waiter meanwhile (seen
	// here: the waiter's Lock returned nil ~11 s after SENTINEL FAILOVER, on the old primary).
	ttlOnly := redislock.WithDefaultSession(false)
	lost := make(chan error, 10)
	onLost := func(err error) { lost <- err }

	plain := redislock.NewMutex(c, "plain", ttlOnly, redislock.WithTTL(30*time.Second), redislock.WithRenewEvery(300*time.Millisecond), redislock.WithOnLost(onLost))
	if err := plain.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	session, err := redislock.NewSession(ctx, rdb, redislock.WithSessionTTL(30*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	leased := redislock.NewMutex(session, "leased")
	if err := leased.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	waiter := redislock.NewMutex(c, "plain", ttlOnly, redislock.WithTTL(30*time.Second))
	waited := make(chan error, 1)
	go func() { waited <- waiter.Lock(ctx) }()
	testserver.WaitBlocked(t, pc, 1)
	testserver.Eventually(t, 10*time.Second, "the grants on the replica", func() bool {
		return fence(t, rc, "plain") == plain.Token() && fence(t, rc, "leased") == leased.Token()
	})
	plainToken, leasedToken := plain.Token(), leased.Token()
	oldInfo, err := session.Info(ctx)
	if err != nil || oldInfo == nil || oldInfo.Bound == 0 {
		t.Fatalf("LOCK.SESSION INFO before: %+v %v", oldInfo, err)
	}

	started := time.Now()
	if err := sc.Failover(ctx, "mymaster").Err(); err != nil {
		t.Fatal(err)
	}
	testserver.Eventually(t, 30*time.Second, "the Sentinel names the replica primary", func() bool {
		addr, err := sc.GetMasterAddrByName(ctx, "mymaster").Result()
		return err == nil && len(addr) == 2 && addr[1] == fmt.Sprint(replica.Port)
	})
	promoted := time.Since(started)

	// The holds are on the new primary with their tokens.
	if got := fence(t, rc, "plain"); got != plainToken {
		t.Fatalf("plain on the new primary: token %d, held with %d", got, plainToken)
	}
	if got := fence(t, rc, "leased"); got != leasedToken {
		t.Fatalf("leased on the new primary: token %d, held with %d", got, leasedToken)
	}
	// The watchdog renews on the new primary: the key's PTTL there goes back up.
	pttl := func() int64 { return rc.PTTL(ctx, "plain").Val().Milliseconds() }
	low := pttl()
	testserver.Eventually(t, 10*time.Second, "a renewal on the new primary", func() bool { return pttl() > low })
	// A new lock goes to the new primary, with a token greater than every earlier one.
	fresh := redislock.NewMutex(c, "fresh", ttlOnly, redislock.WithTTL(30*time.Second))
	if err := fresh.TryLock(ctx); err != nil {
		t.Fatal(err)
	}
	if got := fence(t, rc, "fresh"); got != fresh.Token() || fresh.Token() <= max(plainToken, leasedToken) {
		t.Fatalf("fresh: token %d, the new primary says %d (earlier tokens %d, %d)", fresh.Token(), got, plainToken, leasedToken)
	}
	// The waiter was answered by the demoted primary (UNBLOCKED, or its connection killed by
	// Sentinel) and queued again on the new primary.
	testserver.Eventually(t, 60*time.Second, "the waiter queued on the new primary", func() bool {
		info, err := redislock.Inspect(ctx, rc, "plain")
		return err == nil && info != nil && info.Waiters == 1
	})
	requeued := time.Since(started)
	// The session is bound again, on the new primary, with its hold: Sentinel killed its
	// connection on the demoted primary, and the client ATTACHed it on a new one.
	testserver.Eventually(t, 30*time.Second, "the session bound on the new primary", func() bool {
		reply, err := rc.Do(ctx, "LOCK.SESSION", "INFO", session.ID()).Result()
		fields, ok := reply.(map[any]any) // RESP3
		return err == nil && ok && fields["bound"] != nil
	})
	rebound := time.Since(started)
	info, err := session.Info(ctx)
	if err != nil || info == nil || info.Holds != 1 || info.Bound == 0 {
		t.Fatalf("LOCK.SESSION INFO after: %+v %v", info, err)
	}
	select {
	case <-session.Done():
		t.Fatalf("the session ended: %v", session.Err())
	case <-leased.Done():
		t.Fatalf("the session's hold ended: %v", leased.Err())
	case <-plain.Done():
		t.Fatalf("the plain hold ended: %v", plain.Err())
	default:
	}

	// The release on the new primary grants the waiter there.
	if err := plain.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-waited; err != nil {
		t.Fatal(err)
	}
	if got := fence(t, rc, "plain"); got != waiter.Token() || waiter.Token() <= fresh.Token() {
		t.Fatalf("the waiter: token %d, the new primary says %d (fresh %d)", waiter.Token(), got, fresh.Token())
	}
	if n, err := session.CloseCount(ctx); err != nil || n != 1 {
		t.Fatalf("CloseCount: %d %v", n, err)
	}
	if fence(t, rc, "leased") != 0 {
		t.Fatal("the session's hold outlived its close")
	}
	if len(lost) != 0 {
		t.Fatalf("reported lost: %v", <-lost)
	}
	if errors.Is(leased.Err(), redislock.ErrLost) {
		t.Fatalf("leased: %v", leased.Err())
	}
	t.Logf("SENTINEL FAILOVER answered; the Sentinel named the new primary after %v, the waiter queued there after %v, the session bound there after %v",
		promoted.Round(time.Millisecond), requeued.Round(time.Millisecond), rebound.Round(time.Millisecond))
}
