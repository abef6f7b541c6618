package redislock

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// The change feed as the report of a hold's loss (WithLossFeed, on by default with
// WithOnLost): a Client or Session keeps, per node, one connection that LOCK.WATCHes the keys
// its holds are on and one sharded subscription to their channels. A message is a claim, not
// proof: it makes the feed read LOCK.INFO, and a hold is lost only when that no longer lists
// its token. After the watch connection fails it is made again, every key watched again and
// read again; so is the state after the subscription reconnects. After a cluster failover
// (the old master's unasked sunsubscribe, or MOVED) a key's holds are watched on the node the
// MOVED names, at once (hopTo).

type feed struct {
	client redis.UniversalClient
	id     string // names its connections (redislock-feed-watch-<id>, redislock-feed-sub-<id>)
	mu     sync.Mutex
	nodes  map[string]*feedNode // by node address
	closed bool
}

type feedNode struct {
	f        *feed
	addr     string
	node     *redis.Client // one-connection client for the watches
	conn     *redis.Conn
	ps       *redis.PubSub
	mu       sync.Mutex
	holds    map[string]map[*hold]struct{} // by key
	channels map[string]string             // channel -> key
	hopped   map[string]bool               // keys whose holds came here at a MOVED's address
	stop     chan struct{}
}

// watch adds h (just granted) to its key's watch; if the feed cannot watch, h is left to its
// watchdog or session.
func (f *feed) watch(h *hold) {
	f.watchAt(h, "")
}

// watchAt adds h to its key's watch on the node at (a MOVED's address) or, if at is "", the
// node that serves the key.
func (f *feed) watchAt(h *hold, at string) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	o, err := nodeOptions(ctx, f.client, h.key(), at)
	if err != nil {
		return
	}
	f.mu.Lock()
	if f.closed {
		f.mu.Unlock()
		return
	}
	if f.nodes == nil {
		f.nodes = map[string]*feedNode{}
	}
	if f.id == "" {
		f.id = newFeedID()
	}
	n := f.nodes[o.Addr]
	fresh := n == nil
	if fresh {
		// Dialled with the subscription's name (a reconnected subscription is named again); the
		// watch connection is renamed each time it is made.
		o.ClientName = feedSubName + f.id
		node := dedicatedFrom(o, false)
		n = &feedNode{f: f, addr: o.Addr, node: node, conn: node.Conn(), ps: node.SSubscribe(context.Background()),
			holds: map[string]map[*hold]struct{}{}, channels: map[string]string{}, hopped: map[string]bool{}, stop: make(chan struct{})}
		f.nodes[o.Addr] = n
		go n.read()
	}
	f.mu.Unlock()
	if fresh {
		n.mu.Lock()
		setName(ctx, n.conn, feedWatchName+f.id)
		n.mu.Unlock()
	}
	for _, key := range h.keys {
		n.add(ctx, key, h, at != "")
	}
	// A loss between the grant and the watch is found by this first read.
	for _, key := range h.keys {
		n.check(ctx, key)
	}
}

// add watches key for h here; hopped: h came at a MOVED's address.
func (n *feedNode) add(ctx context.Context, key string, h *hold, hopped bool) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if h.currentToken() == 0 {
		return // released or lost already
	}
	if n.holds[key] == nil {
		n.holds[key] = map[*hold]struct{}{h: {}}
		if hopped {
			n.hopped[key] = true
		}
		// A refusal (MOVED: the map of the slots is behind a failover) keeps h here: the read
		// that follows meets it too, and moves h on.
		reply, err := n.conn.Do(ctx, "LOCK.WATCH", key).Slice()
		if err != nil || len(reply) == 0 {
			return
		}
		channel := toStr(reply[0])
		n.channels[channel] = key
		_ = n.ps.SSubscribe(ctx, channel)
	}
	n.holds[key][h] = struct{}{}
}

// unwatch removes h (released or lost).
func (f *feed) unwatch(h *hold) {
	f.mu.Lock()
	nodes := make([]*feedNode, 0, len(f.nodes))
	for _, n := range f.nodes {
		nodes = append(nodes, n)
	}
	f.mu.Unlock()
	for _, n := range nodes {
		n.remove(h)
	}
}

func (n *feedNode) remove(h *hold) {
	n.mu.Lock()
	defer n.mu.Unlock()
	for _, key := range h.keys {
		hs := n.holds[key]
		if _, ok := hs[h]; !ok {
			continue
		}
		delete(hs, h)
		if len(hs) > 0 {
			continue
		}
		delete(n.holds, key)
		delete(n.hopped, key)
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		_ = n.conn.Do(ctx, "LOCK.UNWATCH", key).Err()
		for ch, k := range n.channels {
			if k == key {
				delete(n.channels, ch)
				_ = n.ps.SUnsubscribe(ctx, ch)
			}
		}
		cancel()
	}
}

// read follows the subscription until the feed closes.
func (n *feedNode) read() {
	for {
		msg, err := n.ps.Receive(context.Background())
		select {
		case <-n.stop:
			return
		default:
		}
		if err != nil {
			time.Sleep(50 * time.Millisecond) // go-redis reconnects and subscribes again
			continue
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		switch m := msg.(type) {
		case *redis.Message:
			n.mu.Lock()
			key, ok := n.channels[m.Channel]
			n.mu.Unlock()
			if ok {
				n.check(ctx, key)
			}
		case *redis.Subscription: // (re)subscribed: what was missed meanwhile is read now
			n.mu.Lock()
			key, ok := n.channels[m.Channel]
			n.mu.Unlock()
			switch {
			case ok && m.Kind == "ssubscribe":
				n.check(ctx, key)
			case ok && m.Kind == "sunsubscribe":
				// Unasked: the node gave up the key's slot (a cluster failover). Its LOCK.INFO
				// answers MOVED with the node that serves the key now.
				n.move(key, n.checkOnce(ctx, key))
			}
		}
		cancel()
	}
}

// check reads the key's state and ends every hold on it whose token it no longer lists.
func (n *feedNode) check(ctx context.Context, key string) {
	err := n.checkOnce(ctx, key)
	switch {
	case err == nil:
	case !isReplyError(err):
		n.rewatch(ctx)
	case followable(err): // MOVED, READONLY: the key is served elsewhere now
		n.move(key, err)
	}
}

// moveDelay is how long the feed waits before it watches a moved key on the node the cluster
// client's map of the slots names (reloaded meanwhile), when no MOVED named one (hopTo).
const moveDelay = 200 * time.Millisecond

// move takes key's holds off this node's feed and watches them again on the node that serves
// the key now (after a failover), where the first LOCK.INFO read finds a loss meanwhile: the
// node this node's answer (cause) named with MOVED, at once, or after moveDelay the node the
// map names (hopTo decides).
func (n *feedNode) move(key string, cause error) {
	n.mu.Lock()
	hs := n.holds[key]
	delete(n.holds, key)
	watched := false
	for ch, k := range n.channels {
		if k == key {
			delete(n.channels, ch)
			watched = true
		}
	}
	hopped := n.hopped[key]
	delete(n.hopped, key)
	n.mu.Unlock()
	if len(hs) == 0 {
		return
	}
	if cc, ok := n.f.client.(*redis.ClusterClient); ok {
		cc.ReloadState(context.Background())
	}
	at := hopTo(n.f.client, movedTo(cause), hopped, watched)
	go func() {
		if at == "" {
			select {
			case <-n.stop:
				return
			case <-time.After(moveDelay):
			}
		}
		for h := range hs {
			n.f.watchAt(h, at)
		}
	}()
}

func (n *feedNode) checkOnce(ctx context.Context, key string) error {
	// Under mu, as every use of conn: closing it must not race its use (go-redis).
	n.mu.Lock()
	reply, err := n.conn.Do(ctx, "LOCK.INFO", key).Result()
	n.mu.Unlock()
	if err != nil && !errors.Is(err, redis.Nil) {
		return err
	}
	var info *Info
	if err == nil {
		info = parseInfo(reply)
	}
	live := map[int64]bool{}
	if info != nil {
		for _, hd := range info.Holders {
			live[hd.Token] = true
		}
	}
	n.mu.Lock()
	var gone []*hold
	for h := range n.holds[key] {
		if t := h.tokenFor(key); t != 0 && !live[t] {
			gone = append(gone, h)
		}
	}
	n.mu.Unlock()
	for _, h := range gone {
		h.feedLost(key)
	}
	return nil
}

// rewatch makes the watch connection again (the watches ended with the old one) and reads
// every key again.
func (n *feedNode) rewatch(ctx context.Context) {
	select {
	case <-n.stop: // the feed was closed
		return
	default:
	}
	n.mu.Lock()
	_ = n.conn.Close()
	n.conn = n.node.Conn()
	setName(ctx, n.conn, feedWatchName+n.f.id)
	keys := make([]string, 0, len(n.holds))
	for k := range n.holds {
		keys = append(keys, k)
		_ = n.conn.Do(ctx, "LOCK.WATCH", k).Err()
	}
	n.mu.Unlock()
	for _, k := range keys {
		if err := n.checkOnce(ctx, k); err != nil && !isReplyError(err) {
			return // the next message or resubscription tries again
		}
	}
}

func (f *feed) close() {
	f.mu.Lock()
	nodes := f.nodes
	f.nodes, f.closed = nil, true
	f.mu.Unlock()
	for _, n := range nodes {
		close(n.stop)
		_ = n.ps.Close()
		n.mu.Lock()
		_ = n.conn.Close()
		_ = n.node.Close()
		n.mu.Unlock()
	}
}
