package redislock

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/maintnotifications"
)

// Connections of their own. go-redis gives a blocking module command the client's ReadTimeout
// (and a cancelled context closes the connection it ran on), so a wait and a BOUND session each
// run on a client of their own: made from the user's client's options for the node that serves
// the key, one connection, no retries (a command is never sent twice), and for a wait no read
// deadline: the server's BLOCK timeout and the context bound it.

// nodeOptions are the options of the user's client for the node that serves key (a failover
// client's options dial the current primary through its Sentinels). at, when not "", is the
// address a cluster node's MOVED named (movedTo): the options of a node the cluster client
// knows, for that address, as go-redis dials the node a MOVED names (ClusterOptions' NewClient
// hook aside), since its map of the slots may still name the old master (see hopTo).
func nodeOptions(ctx context.Context, client redis.UniversalClient, key, at string) (*redis.Options, error) {
	switch c := client.(type) {
	case *redis.Client:
		o := *c.Options()
		return &o, nil
	case *redis.ClusterClient:
		node, err := c.MasterForKey(ctx, key)
		if err != nil {
			return nil, err
		}
		o := *node.Options()
		if at != "" {
			o.Addr = at
		}
		return &o, nil
	}
	return nil, fmt.Errorf("redislock: %T is not supported (use a *redis.Client, a failover client or a *redis.ClusterClient)", client)
}

// The names (CLIENT SETNAME) of the connections of their own, as every client of the project
// names them, so that CLIENT LIST says whose they are: a wait connection, a BOUND session's
// connection (after its serial, never its id) and a feed's two connections (after the feed's
// id: the process id and a counter).
const (
	waiterName    = "redislock-waiter"
	sessionName   = "redislock-session-"
	feedWatchName = "redislock-feed-watch-"
	feedSubName   = "redislock-feed-sub-"
)

var feedIDs atomic.Int64

// newFeedID is a feed's id: the process id and a counter.
func newFeedID() string {
	return fmt.Sprintf("%d-%d", os.Getpid(), feedIDs.Add(1))
}

// setName names conn (CLIENT SETNAME). Best effort: a server or user that refuses it leaves
// the connection unnamed.
func setName(ctx context.Context, conn *redis.Conn, name string) {
	_ = conn.Do(ctx, "CLIENT", "SETNAME", name).Err()
}

// dedicatedFrom is a one-connection client made from o (the options of the node that serves a
// key, see nodeOptions). noReadDeadline: no read deadline (a wait); else the context's
// deadline bounds each call.
func dedicatedFrom(o *redis.Options, noReadDeadline bool) *redis.Client {
	// Its own push-notification state: the processor in the copied options is the user
	// client's (go-redis refuses to register its handlers twice), and a one-connection client
	// that is closed by its owner has no use for maintenance notifications.
	o.PushNotificationProcessor = nil
	o.MaintNotificationsConfig = &maintnotifications.Config{Mode: maintnotifications.ModeDisabled}
	o.PoolSize = 1
	o.MinIdleConns = 0
	o.MaxIdleConns = 1
	o.MaxRetries = -1
	o.ConnMaxIdleTime = -1
	o.ConnMaxLifetime = 0
	if noReadDeadline {
		o.ReadTimeout = -1
		o.ContextTimeoutEnabled = false
	} else {
		o.ContextTimeoutEnabled = true
	}
	return redis.NewClient(o)
}

// waits keeps the idle wait connections of one Client or Session, per node, so that a wait
// after a wait does not dial again (a connection, HELLO and CLIENT SETINFO each time cost the
// server more than the wait itself). A wait that its context ends closes its connection: only
// connections whose wait ended with a reply come back.
type waits struct {
	mu        sync.Mutex
	idle      map[string][]*redis.Client
	closed    bool
	durableOK atomic.Bool // the server was found new enough for durable grants
}

// maxIdleWaits is how many idle wait connections are kept per node.
const maxIdleWaits = 64

func (w *waits) get(ctx context.Context, client redis.UniversalClient, key string) (*redis.Client, string, error) {
	o, err := nodeOptions(ctx, client, key, "")
	if err != nil {
		return nil, "", err
	}
	addr := o.Addr
	if w != nil {
		w.mu.Lock()
		if list := w.idle[addr]; len(list) > 0 {
			c := list[len(list)-1]
			w.idle[addr] = list[:len(list)-1]
			w.mu.Unlock()
			return c, addr, nil
		}
		w.mu.Unlock()
	}
	o.ClientName = waiterName
	return dedicatedFrom(o, true), addr, nil
}

func (w *waits) put(addr string, c *redis.Client) {
	if w != nil {
		w.mu.Lock()
		if !w.closed && len(w.idle[addr]) < maxIdleWaits {
			if w.idle == nil {
				w.idle = map[string][]*redis.Client{}
			}
			w.idle[addr] = append(w.idle[addr], c)
			w.mu.Unlock()
			return
		}
		w.mu.Unlock()
	}
	_ = c.Close()
}

// close closes the idle connections; those in use close when their wait ends.
func (w *waits) close() {
	w.mu.Lock()
	idle := w.idle
	w.idle, w.closed = nil, true
	w.mu.Unlock()
	for _, list := range idle {
		for _, c := range list {
			_ = c.Close()
		}
	}
}

// waitCall sends one blocking command on a connection of its own (from w, or a new one) and
// reads its reply, however long the server makes it wait; when ctx ends first the connection
// is closed (the server drops a disconnected waiter) and the caller sees ctx.Err() set. A nil
// reply is (nil, nil).
func waitCall(ctx context.Context, w *waits, client redis.UniversalClient, key string, args []any) (any, error) {
	return onOwnConn(ctx, w, client, key, func(bg context.Context, c *redis.Client) (any, error) {
		reply, err := c.Do(bg, args...).Result()
		if errors.Is(err, redis.Nil) {
			return nil, nil
		}
		return reply, err
	})
}

// onOwnConn runs fn on a wait connection (no read deadline), closing it when ctx ends first;
// fn's context never ends. A connection whose commands all got replies goes back to w.
func onOwnConn(ctx context.Context, w *waits, client redis.UniversalClient, key string, fn func(context.Context, *redis.Client) (any, error)) (any, error) {
	c, addr, err := w.get(ctx, client, key)
	if err != nil {
		return nil, err
	}
	finished := make(chan struct{})
	watcher := make(chan struct{})
	var cut atomic.Bool
	go func() {
		defer close(watcher)
		select {
		case <-ctx.Done():
			cut.Store(true)
			_ = c.Close()
		case <-finished:
		}
	}()
	reply, err := fn(context.WithoutCancel(ctx), c)
	close(finished)
	<-watcher
	if !cut.Load() && (err == nil || isReplyError(err) && !followable(err)) {
		w.put(addr, c) // replies came: the connection is in step, fit for the next wait
	} else if !cut.Load() { // or a node that no longer serves the key (READONLY, MOVED): not again
		_ = c.Close()
	}
	return reply, err
}

// followable: the error of a server that failed, or that no longer serves the key after a
// failover, so that the same request may go to the node that serves it now: no reply (the
// connection closed, refused, timed out), or READONLY (a demoted primary), MOVED/ASK (a
// cluster's slot moved), UNBLOCKED (a waiter or a blocked command on a demoted primary),
// CLUSTERDOWN, TRYAGAIN, LOADING, MASTERDOWN.
func followable(err error) bool {
	if err == nil || errors.Is(err, redis.Nil) {
		return false
	}
	if !isReplyError(err) {
		return true
	}
	msg := err.Error()
	for _, prefix := range []string{"READONLY ", "MOVED ", "ASK ", "UNBLOCKED ", "CLUSTERDOWN ", "TRYAGAIN ", "LOADING ", "MASTERDOWN "} {
		if strings.HasPrefix(msg, prefix) {
			return true
		}
	}
	return false
}

// isReplyError: the server answered with an error (nothing changed), as opposed to an I/O error
// after which a grant may have happened unseen.
func isReplyError(err error) bool {
	var re redis.Error
	return errors.As(err, &re)
}
