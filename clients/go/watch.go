package redislock

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// Change is who holds a lock, as Watch reports it: its first holder's owner and token (for a
// shared lock, the first holder LOCK.INFO lists). A zero Change (Token 0): the lock is free.
type Change struct {
	Owner string
	Token int64
}

// Watch reports every change of key's holder until ctx ends (then the channel is closed):
// first who holds it when it starts, then each new holder, and a zero Change when it is free.
// Any lock can be watched, held by anyone. It follows the key's change feed (LOCK.WATCH and
// SSUBSCRIBE on two connections of its own, named redislock-feed-watch-<id> and
// redislock-feed-sub-<id>) and, since a feed message is a claim and not proof (anyone allowed
// to SPUBLISH could send one), reads LOCK.INFO on every message and reports what that shows,
// and nothing when it is the holder reported last. After a lost connection, or a failover, it
// watches again on the node that serves the key now and reads the state again there. Read the channel: a change waits until it is received.
func Watch(ctx context.Context, client redis.UniversalClient, key string) <-chan Change {
	return observe(ctx, client, key, func(info *Info) Change {
		if info == nil || len(info.Holders) == 0 {
			return Change{}
		}
		return Change{Owner: info.Holders[0].Owner, Token: info.Holders[0].Token}
	})
}

// observe sends pick(LOCK.INFO) on the channel every time it differs from what it sent last,
// reading LOCK.INFO when it starts and on every feed message, until ctx ends.
func observe[T comparable](ctx context.Context, client redis.UniversalClient, key string, pick func(*Info) T) <-chan T {
	ch := make(chan T)
	go func() {
		defer close(ch)
		o := &observer[T]{client: client, key: key, out: ch, pick: pick}
		at := "" // the node a MOVED named, watched next without a pause
		for {
			moved, watched := o.run(ctx, at)
			if ctx.Err() != nil {
				return
			}
			if cc, ok := client.(*redis.ClusterClient); ok {
				// A failover (the old master's sunsubscribe, then MOVED): the key's node is
				// looked up afresh. A failover client's dialer asks its Sentinels by itself.
				cc.ReloadState(ctx)
			}
			if at = hopTo(client, moved, at != "", watched); at != "" {
				continue
			}
			select {
			case <-ctx.Done():
				return
			case <-time.After(100 * time.Millisecond): // then watch again
			}
		}
	}()
	return ch
}

type observer[T comparable] struct {
	client   redis.UniversalClient
	key      string
	out      chan<- T
	pick     func(*Info) T
	last     T
	reported bool
}

// run watches until ctx ends or a connection fails, on the node at (a MOVED's address) or, if
// at is "", the node that serves the key. moved is the address the node answered MOVED with
// ("" for any other end); watched: the key was watched there.
func (o *observer[T]) run(ctx context.Context, at string) (moved string, watched bool) {
	opts, err := nodeOptions(ctx, o.client, o.key, at)
	if err != nil {
		return "", false
	}
	// Its own two connections, named as a feed's: the subscription is dialled with its name.
	id := newFeedID()
	opts.ClientName = feedSubName + id
	node := dedicatedFrom(opts, false)
	defer node.Close()
	conn := node.Conn()
	defer conn.Close()
	setName(ctx, conn, feedWatchName+id)
	watch, err := conn.Do(ctx, "LOCK.WATCH", o.key).Slice()
	if err != nil || len(watch) < 1 {
		return movedTo(err), false
	}
	channel := toStr(watch[0])
	ps := node.SSubscribe(ctx, channel)
	stop := make(chan struct{})
	defer close(stop)
	go func() { // Receive does not end with ctx: closing the subscription ends it
		select {
		case <-ctx.Done():
		case <-stop:
		}
		_ = ps.Close()
	}()
	for {
		msg, err := ps.Receive(ctx)
		if err != nil {
			return "", true
		}
		switch msg.(type) {
		case *redis.Subscription, *redis.Message:
		default:
			continue
		}
		if err := o.confirm(ctx, conn); err != nil {
			return movedTo(err), true
		}
	}
}

// movedTo is the address a MOVED reply names ("" for any other error, or one without a host).
func movedTo(err error) string {
	addr, ok := redis.IsMovedError(err)
	if !ok || strings.HasPrefix(addr, ":") {
		return ""
	}
	return addr
}

// hopTo is where a feed (Watch/Observe's, the loss feed) watches a key next after the node it
// was watched on answered MOVED to moved: that node, at once, in a cluster. Not after a pause
// and on the node go-redis's map of the slots names: the map is reloaded in the background,
// not again within 200 ms of a reload, so for a while after a failover it still names the old
// master (which cost a planned CLUSTER FAILOVER about 200 ms, a MOVED and a pause per try).
// Once in a row (hopped: the node that answered was reached this way), unless the key was
// watched there: two nodes that name each other while the cluster settles are tried at the
// caller's pace. "" when the caller pauses and asks the map (any other end, or not a cluster).
func hopTo(client redis.UniversalClient, moved string, hopped, watched bool) string {
	if _, ok := client.(*redis.ClusterClient); !ok || hopped && !watched {
		return ""
	}
	return moved
}

// confirm reads the state and reports it if it is news.
func (o *observer[T]) confirm(ctx context.Context, conn *redis.Conn) error {
	rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	reply, err := conn.Do(rctx, "LOCK.INFO", o.key).Result()
	if err != nil && !errors.Is(err, redis.Nil) {
		return fmt.Errorf("redislock: LOCK.INFO: %w", err)
	}
	var info *Info
	if err == nil {
		info = parseInfo(reply)
	}
	l := o.pick(info)
	if o.reported && l == o.last {
		return nil
	}
	select {
	case o.out <- l:
		o.last, o.reported = l, true
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
