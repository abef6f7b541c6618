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

// commandCalls is INFO commandstats' count of calls of command ("lock.info",
// "lock.session|keepalive"); 0 before its first.
func commandCalls(t *testing.T, rdb redis.UniversalClient, command string) int64 {
	t.Helper()
	s, err := rdb.Info(context.Background(), "commandstats").Result()
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(s, "\r\n") {
		if v, ok := strings.CutPrefix(line, "cmdstat_"+command+":calls="); ok {
			n, _ := strconv.ParseInt(strings.SplitN(v, ",", 2)[0], 10, 64)
			return n
		}
	}
	return 0
}

// A loss is reported by the change feed at once, long before the watchdog's next renewal
// (every 10 s here); a forged message only makes the feed read LOCK.INFO.
func TestLossFeed(t *testing.T) {
	ctx := testserver.Ctx(t, 20*time.Second)
	rdb := testserver.New(t).Client(t)
	c := redislock.New(rdb)
	defer c.Close()
	lostc := make(chan error, 1)
	m := redislock.NewMutex(c, "fed", redislock.WithTTL(30*time.Second),
		redislock.WithOnLost(func(err error) { lostc <- err }))
	if err := m.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	channel, err := rdb.Do(ctx, "LOCK.WATCH", "fed").Slice()
	if err != nil {
		t.Fatal(err)
	}
	ch := channel[0].(string)
	testserver.Eventually(t, 5*time.Second, "the feed subscribed", func() bool {
		n, _ := rdb.PubSubShardNumSub(ctx, ch).Result()
		return n[ch] == 1
	})
	// Three forged messages: the feed's own first reads (after watching, after subscribing)
	// account for at most two LOCK.INFO calls, so at least one came from a forged message.
	before := commandCalls(t, rdb, "lock.info")
	forged := "1000 released " + strconv.FormatInt(m.Token(), 10) + " 0 " + m.Owner()
	for i := 0; i < 3; i++ {
		if err := rdb.SPublish(ctx, ch, forged).Err(); err != nil {
			t.Fatal(err)
		}
	}
	testserver.Eventually(t, 5*time.Second, "the feed's LOCK.INFO after the forged messages", func() bool {
		return commandCalls(t, rdb, "lock.info") >= before+3
	})
	select {
	case <-m.Done():
		t.Fatalf("a forged message ended the hold: %v", m.Err())
	default:
	}
	if ok, _ := m.IsOwner(ctx); !ok {
		t.Fatal("not the owner after the forged message")
	}
	deleted := time.Now()
	if err := rdb.Del(ctx, "fed").Err(); err != nil {
		t.Fatal(err)
	}
	select {
	case err = <-lostc:
	case <-ctx.Done():
		t.Fatal("no loss reported")
	}
	t.Logf("loss reported %v after the DEL", time.Since(deleted))
	if !errors.Is(err, redislock.ErrLost) || !strings.Contains(err.Error(), "feed:") {
		t.Fatalf("loss: %v", err)
	}
	if time.Since(deleted) > 5*time.Second {
		t.Fatal("the feed was no faster than the watchdog")
	}
	if err := m.Unlock(ctx); !errors.Is(err, redislock.ErrNotOwned) {
		t.Fatalf("Unlock after the loss: %v", err)
	}
}
