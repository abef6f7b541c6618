package redislock_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	redislock "redis-lock/clients/go"
	"redis-lock/clients/go/internal/testserver"
)

// One Redis Cluster (3 masters) for the cluster tests: routing by key, waits on the key's
// node, sessions on one node, multi-key locks with a hash tag, the feed on a sharded channel.
func TestCluster(t *testing.T) {
	ctx := testserver.Ctx(t, 90*time.Second)
	var cl testserver.Cluster
	testserver.StartHarness(t, &cl, "cluster", "--masters", "3", "--replicas", "0")
	var addrs []string
	for _, n := range cl.Nodes {
		addrs = append(addrs, fmt.Sprintf("127.0.0.1:%d", n.Port))
	}
	rdb := redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs})
	t.Cleanup(func() { _ = rdb.Close() })
	c := redislock.New(rdb)

	t.Run("routing and waits", func(t *testing.T) {
		// Keys on every node: each lock, its wait and its release go to the key's node.
		nodes := map[string]bool{}
		for i := 0; i < 12; i++ {
			key := fmt.Sprintf("job:%d", i)
			node, err := rdb.MasterForKey(ctx, key)
			if err != nil {
				t.Fatal(err)
			}
			nodes[node.Options().Addr] = true
			a := redislock.NewMutex(c, key)
			b := redislock.NewMutex(c, key)
			if err := a.Lock(ctx); err != nil {
				t.Fatal(err)
			}
			if got := fence(t, node, key); got != a.Token() {
				t.Fatalf("%s: token %d, its node says %d", key, a.Token(), got)
			}
			got := make(chan error, 1)
			go func() { got <- b.Lock(ctx) }()
			testserver.WaitBlocked(t, node, 1)
			if err := a.Unlock(ctx); err != nil {
				t.Fatal(err)
			}
			if err := <-got; err != nil {
				t.Fatal(err)
			}
			if b.Token() <= 0 || b.Token() != fence(t, node, key) {
				t.Fatalf("%s: waiter token %d", key, b.Token())
			}
			if err := b.Unlock(ctx); err != nil {
				t.Fatal(err)
			}
		}
		if len(nodes) != 3 {
			t.Fatalf("the keys landed on %d nodes", len(nodes))
		}
	})

	t.Run("one default session per node", func(t *testing.T) {
		// The locks above (keys on every node) joined the cluster client's default sessions:
		// one per master, each on its own node.
		var held []*redislock.Mutex
		for i := 0; i < 12; i++ {
			m := redislock.NewMutex(c, fmt.Sprintf("job:%d", i))
			if err := m.Lock(ctx); err != nil {
				t.Fatal(err)
			}
			held = append(held, m)
			node, _ := rdb.MasterForKey(ctx, m.Key())
			s, err := redislock.DefaultSession(ctx, rdb, m.Key())
			if err != nil {
				t.Fatal(err)
			}
			info, _ := redislock.Inspect(ctx, rdb, m.Key())
			if info == nil || info.Holders[0].SessionSerial != s.Serial() || len(sessionList(t, node)) != 1 {
				t.Fatalf("%s: %+v, want a hold of that node's one default session %d", m.Key(), info, s.Serial())
			}
		}
		if err := redislock.Close(ctx, rdb); err != nil {
			t.Fatal(err)
		}
		for _, n := range cl.Nodes {
			node := redis.NewClient(&redis.Options{Addr: fmt.Sprintf("127.0.0.1:%d", n.Port)})
			if got := len(sessionList(t, node)); got != 0 {
				t.Fatalf("node %d: %d sessions after Close", n.Port, got)
			}
			_ = node.Close()
		}
		for _, m := range held {
			<-m.Done()
			if !errors.Is(m.Err(), redislock.ErrSessionClosed) {
				t.Fatalf("%s: %v", m.Key(), m.Err())
			}
		}
	})

	t.Run("session, multi-key, election", func(t *testing.T) {
		if _, err := redislock.NewSession(ctx, rdb); err == nil {
			t.Fatal("a cluster session without WithSessionKey")
		}
		s, err := redislock.NewSession(ctx, rdb, redislock.WithSessionKey("{order:7}"))
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close(ctx)
		m := redislock.NewMultiLock(s, []string{"{order:7}:a", "{order:7}:b"})
		if err := m.Lock(ctx); err != nil {
			t.Fatal(err)
		}
		node, _ := rdb.MasterForKey(ctx, "{order:7}")
		if tokens := m.Tokens(); tokens[0] != fence(t, node, "{order:7}:a") || tokens[1] != fence(t, node, "{order:7}:b") {
			t.Fatalf("tokens %v", tokens)
		}
		cross := redislock.NewMultiLock(c, []string{"x:1", "x:2"}) // slots 6xxx and 2xxx
		if err := cross.TryLock(ctx); err == nil || !strings.Contains(err.Error(), "CROSSSLOT") {
			t.Fatalf("a MultiLock across slots: %v", err)
		}
		e := redislock.NewElection(s, "{order:7}:leader")
		octx, stop := context.WithCancel(ctx)
		defer stop()
		changes := e.Observe(octx)
		if l := next(t, changes); l != (redislock.Leader{}) {
			t.Fatalf("first report %+v", l)
		}
		if err := e.Campaign(ctx, "me"); err != nil {
			t.Fatal(err)
		}
		if l := next(t, changes); l.Value != "me" || l.Term != e.Term() {
			t.Fatalf("report %+v", l)
		}
		if err := s.Close(ctx); err != nil {
			t.Fatal(err)
		}
		if l := next(t, changes); l != (redislock.Leader{}) {
			t.Fatalf("after the session closed: %+v", l)
		}
		if err := m.Unlock(ctx); !errors.Is(err, redislock.ErrNotOwned) {
			t.Fatalf("Unlock after the session closed: %v", err)
		}
	})
}
