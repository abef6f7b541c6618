package redislock_test

// The conformance runner's steps (conformance_test.go runs the cases): each step of the
// vocabulary (conformance/README.md, "The steps") mapped to the Go API.

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"

	redislock "redis-lock/clients/go"
)

// --- lock objects --------------------------------------------------------------------------

// lockObj is what the lock steps need of a Mutex (and a Semaphore's or an RWMutex's side) or
// a MultiLock.
type lockObj interface {
	acquire(ctx context.Context, wait bool) error
	release(ctx context.Context) error
	extend(ctx context.Context, ttl time.Duration) error
	token() int64
	held(ctx context.Context, rdb redis.UniversalClient) (bool, error)
	lockKey() string
	done() <-chan struct{}
	err() error
}

type mutexObj struct{ m *redislock.Mutex }

func (o mutexObj) acquire(ctx context.Context, wait bool) error {
	if wait {
		return o.m.Lock(ctx)
	}
	return o.m.TryLock(ctx)
}
func (o mutexObj) release(ctx context.Context) error { return o.m.Unlock(ctx) }
func (o mutexObj) extend(ctx context.Context, ttl time.Duration) error {
	return o.m.Extend(ctx, ttl)
}
func (o mutexObj) token() int64 { return o.m.Token() }
func (o mutexObj) held(ctx context.Context, _ redis.UniversalClient) (bool, error) {
	return o.m.IsOwner(ctx)
}
func (o mutexObj) lockKey() string       { return o.m.Key() }
func (o mutexObj) done() <-chan struct{} { return o.m.Done() }
func (o mutexObj) err() error            { return o.m.Err() }

type multiObj struct{ m *redislock.MultiLock }

func (o multiObj) acquire(ctx context.Context, wait bool) error {
	if wait {
		return o.m.Lock(ctx)
	}
	return o.m.TryLock(ctx)
}
func (o multiObj) release(ctx context.Context) error { return o.m.Unlock(ctx) }
func (o multiObj) extend(ctx context.Context, ttl time.Duration) error {
	return o.m.Extend(ctx, ttl)
}

// token is the largest of the set's tokens.
func (o multiObj) token() int64 {
	var t int64
	for _, x := range o.m.Tokens() {
		t = max(t, x)
	}
	return t
}

// held: every key's token is live (LOCK.FENCE key token).
func (o multiObj) held(ctx context.Context, rdb redis.UniversalClient) (bool, error) {
	tokens := o.m.Tokens()
	if len(tokens) == 0 {
		return false, nil
	}
	for i, key := range o.m.Keys() {
		n, err := rdb.Do(ctx, "LOCK.FENCE", key, tokens[i]).Int64()
		if err != nil || n != 1 {
			return false, err
		}
	}
	return true, nil
}
func (o multiObj) lockKey() string       { return o.m.Keys()[0] }
func (o multiObj) done() <-chan struct{} { return o.m.Done() }
func (o multiObj) err() error            { return o.m.Err() }

// scope is the step's session, or the case's Client.
func (r *runner) scope(step caseStep) (redislock.Scope, error) {
	if name := str(step, "session"); name != "" {
		s, ok := r.objs[name].(*redislock.Session)
		if !ok {
			return nil, failf("no session %q", name)
		}
		return s, nil
	}
	return r.client, nil
}

func (r *runner) lockOptions(step caseStep) []redislock.Option {
	opts := []redislock.Option{
		redislock.WithTTL(msField(step, "ttl")),
		// The watchdog is on by default outside a session here; the cases say when they want it.
		redislock.WithWatchdog(step["watchdog"] == true),
	}
	if owner := str(step, "owner"); owner != "" {
		opts = append(opts, redislock.WithOwner(owner))
	}
	if has(step, "lock_delay") {
		opts = append(opts, redislock.WithLockDelay(msField(step, "lock_delay")))
	}
	if n, ok := step["durable"].(float64); ok {
		opts = append(opts, redislock.WithDurable(int(n), msField(step, "durable_timeout")))
	}
	if step["report_loss"] == true {
		opts = append(opts, redislock.WithOnLost(func(error) {}))
	}
	return opts
}

func (r *runner) lock(name string) (lockObj, error) {
	o, ok := r.objs[name].(lockObj)
	if !ok {
		return nil, failf("no lock %q", name)
	}
	return o, nil
}

// acquire is one try without `wait`, else a wait of up to `wait`: granted, or not (busy, or
// the wait ran out) as false.
func acquire(ctx context.Context, o lockObj, step caseStep) (bool, error) {
	var err error
	if has(step, "wait") {
		wctx, cancel := context.WithTimeout(ctx, msField(step, "wait"))
		err = o.acquire(wctx, true)
		cancel()
	} else {
		err = o.acquire(ctx, false)
	}
	if errors.Is(err, redislock.ErrNotObtained) && ctx.Err() == nil {
		return false, nil
	}
	return err == nil, err
}

// session is the step's session (Go's elections live in one): the named one, or, with only a
// ttl, one of the election's own.
func (r *runner) electionSession(ctx context.Context, step caseStep) (*redislock.Session, error) {
	if name := str(step, "session"); name != "" {
		s, ok := r.objs[name].(*redislock.Session)
		if !ok {
			return nil, failf("no session %q", name)
		}
		return s, nil
	}
	s, err := redislock.NewSession(ctx, r.rdb, redislock.WithSessionTTL(msField(step, "ttl")))
	if err != nil {
		return nil, err
	}
	r.sessions = append(r.sessions, s)
	return s, nil
}

func (r *runner) step(ctx context.Context, step caseStep) error {
	o := r.objs
	switch step["do"] {
	case "lock":
		scope, err := r.scope(step)
		if err != nil {
			return err
		}
		m := redislock.NewMutex(scope, str(step, "key"), r.lockOptions(step)...)
		o[str(step, "as")] = mutexObj{m}
		if has(step, "error") {
			// The ttl is checked at acquire: a first try shows this step's error.
			return m.TryLock(ctx)
		}
	case "semaphore":
		scope, err := r.scope(step)
		if err != nil {
			return err
		}
		limit, _ := step["limit"].(float64)
		s := redislock.NewSemaphore(scope, str(step, "key"), int(limit), r.lockOptions(step)...)
		o[str(step, "as")] = mutexObj{&s.Mutex}
	case "read_lock", "write_lock":
		scope, err := r.scope(step)
		if err != nil {
			return err
		}
		rw := redislock.NewRWMutex(scope, str(step, "key"), r.lockOptions(step)...)
		if step["do"] == "read_lock" {
			o[str(step, "as")] = mutexObj{rw.Reader()}
		} else {
			o[str(step, "as")] = mutexObj{rw.Writer()}
		}
	case "multilock":
		scope, err := r.scope(step)
		if err != nil {
			return err
		}
		var keys []string
		for _, k := range step["keys"].([]any) {
			keys = append(keys, k.(string))
		}
		o[str(step, "as")] = multiObj{redislock.NewMultiLock(scope, keys, r.lockOptions(step)...)}
	case "session":
		opts := []redislock.SessionOption{redislock.WithSessionTTL(msField(step, "ttl"))}
		if step["bound"] != true {
			opts = append(opts, redislock.WithUnbound())
		}
		if has(step, "lock_delay") {
			opts = append(opts, redislock.WithSessionLockDelay(msField(step, "lock_delay")))
		}
		s, err := redislock.NewSession(ctx, r.rdb, opts...)
		if err != nil {
			return err
		}
		r.sessions = append(r.sessions, s)
		o[str(step, "as")] = s
	case "election":
		s, err := r.electionSession(ctx, step)
		if err != nil {
			return err
		}
		o[str(step, "as")] = redislock.NewElection(s, str(step, "key"))
	case "acquire":
		l, err := r.lock(str(step, "lock"))
		if err != nil {
			return err
		}
		granted, err := acquire(ctx, l, step)
		if err != nil {
			return err
		}
		return r.expect(step, granted)
	case "start_acquire":
		l, err := r.lock(str(step, "lock"))
		if err != nil {
			return err
		}
		wctx, cancel := context.WithTimeout(context.Background(), msField(step, "wait"))
		p := &pendingAcquire{cancel: cancel, done: make(chan error, 1)}
		go func() { p.done <- l.acquire(wctx, true) }()
		r.pending[str(step, "as")] = p
	case "finish":
		p := r.pending[str(step, "pending")]
		delete(r.pending, str(step, "pending"))
		select {
		case err := <-p.done:
			p.cancel()
			if errors.Is(err, redislock.ErrNotObtained) {
				return r.expect(step, false)
			}
			if err != nil {
				return err
			}
			return r.expect(step, true)
		case <-ctx.Done():
			p.cancel()
			<-p.done
			return failf("the background acquire did not end within its deadline")
		}
	case "cancel":
		p := r.pending[str(step, "pending")]
		delete(r.pending, str(step, "pending"))
		p.cancel()
		select {
		case err := <-p.done:
			if !errors.Is(err, context.Canceled) {
				return failf("the cancelled wait ended with %v, not context.Canceled", err)
			}
		case <-ctx.Done():
			return failf("the cancelled wait did not end")
		}
	case "release":
		l, err := r.lock(str(step, "lock"))
		if err != nil {
			return err
		}
		err = l.release(ctx)
		if errors.Is(err, redislock.ErrNotOwned) {
			return r.expect(step, false)
		}
		if err != nil {
			return err
		}
		return r.expect(step, true)
	case "extend":
		l, err := r.lock(str(step, "lock"))
		if err != nil {
			return err
		}
		err = l.extend(ctx, msField(step, "ttl"))
		if errors.Is(err, redislock.ErrNotOwned) {
			return r.expect(step, false)
		}
		if err != nil {
			return err
		}
		return r.expect(step, true)
	case "held":
		l, err := r.lock(str(step, "lock"))
		if err != nil {
			return err
		}
		held, err := l.held(ctx, r.rdb)
		if err != nil {
			return err
		}
		return r.expect(step, held)
	case "token":
		l, err := r.lock(str(step, "lock"))
		if err != nil {
			return err
		}
		var token any
		if t := l.token(); t != 0 {
			token = t
		}
		if err := r.expect(step, token); err != nil {
			return err
		}
		if name := str(step, "greater_than"); name != "" {
			prev, _ := r.vars[name].(int64)
			if t := l.token(); t == 0 || t <= prev {
				return failf("token %d is not greater than %s = %d", t, name, prev)
			}
		}
		if name := str(step, "save"); name != "" {
			r.vars[name] = token
		}
	case "fenced":
		l, err := r.lock(str(step, "lock"))
		if err != nil {
			return err
		}
		m, ok := l.(mutexObj)
		if !ok {
			return &skip{"unsupported", "fenced writes behind a MultiLock's tokens"}
		}
		command := step["command"].([]any)
		reply, err := m.m.Fenced(ctx, command[0].(string), command[1].(string), command[2:]...)
		if err != nil {
			return err
		}
		return r.expect(step, reply)
	case "fenced_script":
		l, err := r.lock(str(step, "lock"))
		if err != nil {
			return err
		}
		var keys []string
		for _, k := range step["keys"].([]any) {
			keys = append(keys, k.(string))
		}
		script := redislock.NewFencedScript(str(step, "body"))
		reply, err := script.Run(ctx, r.rdb, l.lockKey(), l.token(), keys, step["args"].([]any)...)
		if err != nil {
			return err
		}
		return r.expect(step, reply)
	case "hold":
		// No scoped form in Go: Lock (TryLock without a wait), then Unlock.
		l, err := r.lock(str(step, "lock"))
		if err != nil {
			return err
		}
		wait := msField(step, "wait")
		if wait > 0 {
			wctx, cancel := context.WithTimeout(ctx, wait)
			err = l.acquire(wctx, true)
			cancel()
		} else {
			err = l.acquire(ctx, false)
		}
		if err != nil {
			return err
		}
		return l.release(ctx)
	case "raw":
		got, err := r.rawCall(ctx, step["command"].([]any))
		if err != nil {
			return err
		}
		if err := r.expect(step, got); err != nil {
			return err
		}
		if name := str(step, "save"); name != "" {
			r.vars[name] = got
		}
	case "wait_raw":
		want := r.subst(step["expect"])
		return pollFor(ctx, msField(step, "timeout"), describeStep(step), func(ctx context.Context) (bool, error) {
			got, err := r.rawCall(ctx, step["command"].([]any))
			if err != nil {
				return false, err
			}
			if has(step, "expect") {
				return same(got, want), nil
			}
			n, ok := got.(int64)
			below, hasBelow := step["below"].(float64)
			above, hasAbove := step["above"].(float64)
			return ok && (!hasBelow || float64(n) < below) && (!hasAbove || float64(n) > above), nil
		})
	case "wait_waiters":
		count, _ := step["count"].(float64)
		return poll(ctx, describeStep(step), func(ctx context.Context) (bool, error) {
			info, err := redislock.Inspect(ctx, r.rdb, str(step, "key"))
			if err != nil {
				return false, err
			}
			waiters := int64(0)
			if info != nil {
				waiters = info.Waiters
			}
			return waiters == int64(count), nil
		})
	case "kill_session_connection":
		s, ok := o[str(step, "session")].(*redislock.Session)
		if !ok {
			return failf("no session %q", str(step, "session"))
		}
		info, err := s.Info(ctx)
		if err != nil {
			return err
		}
		if info == nil || info.Bound == 0 {
			return failf("the session is not bound: %+v", info)
		}
		n, err := r.rdb.Do(ctx, "CLIENT", "KILL", "ID", info.Bound).Int64()
		if err != nil {
			return err
		}
		if n != 1 {
			return failf("CLIENT KILL ID %d killed %d clients", info.Bound, n)
		}
	case "wait_session_lost":
		s, ok := o[str(step, "session")].(*redislock.Session)
		if !ok {
			return failf("no session %q", str(step, "session"))
		}
		return waitLost(ctx, msField(step, "timeout"), s.Done, s.Err)
	case "wait_lost":
		l, err := r.lock(str(step, "lock"))
		if err != nil {
			return err
		}
		return waitLost(ctx, msField(step, "timeout"), l.done, l.err)
	case "close_session":
		s, ok := o[str(step, "session")].(*redislock.Session)
		if !ok {
			return failf("no session %q", str(step, "session"))
		}
		n, err := s.CloseCount(ctx)
		if err != nil {
			return err
		}
		return r.expect(step, n)
	case "campaign":
		e, ok := o[str(step, "election")].(*redislock.Election)
		if !ok {
			return failf("no election %q", str(step, "election"))
		}
		wctx, cancel := context.WithTimeout(ctx, msField(step, "wait"))
		err := e.Campaign(wctx, str(step, "value"))
		cancel()
		if errors.Is(err, redislock.ErrNotObtained) && ctx.Err() == nil {
			return r.expect(step, false)
		}
		if err != nil {
			return err
		}
		o[str(step, "as")] = e // the leadership: Resign, Term
		if name := str(step, "save_term"); name != "" {
			r.vars[name] = e.Term()
		}
		return r.expect(step, true)
	case "leader":
		e, ok := o[str(step, "election")].(*redislock.Election)
		if !ok {
			return failf("no election %q", str(step, "election"))
		}
		l, err := e.Leader(ctx)
		if errors.Is(err, redislock.ErrNoLeader) {
			return r.expect(step, nil)
		}
		if err != nil {
			return err
		}
		return r.expect(step, l.Value)
	case "resign":
		e, ok := o[str(step, "leadership")].(*redislock.Election)
		if !ok {
			return failf("no leadership %q", str(step, "leadership"))
		}
		err := e.Resign(ctx)
		if errors.Is(err, redislock.ErrNotOwned) {
			return r.expect(step, false)
		}
		if err != nil {
			return err
		}
		return r.expect(step, true)
	case "watch":
		wctx, cancel := context.WithCancel(context.Background())
		ch := redislock.Watch(wctx, r.rdb, str(step, "key"))
		r.watches[str(step, "as")] = &watching{cancel: cancel, next: func(ctx context.Context) (any, bool, error) {
			select {
			case c, open := <-ch:
				if c.Token == 0 {
					return nil, open, nil
				}
				return c.Owner, open, nil
			case <-ctx.Done():
				return nil, true, ctx.Err()
			}
		}}
	case "observe":
		e, ok := o[str(step, "election")].(*redislock.Election)
		if !ok {
			return failf("no election %q", str(step, "election"))
		}
		wctx, cancel := context.WithCancel(context.Background())
		ch := e.Observe(wctx)
		r.watches[str(step, "as")] = &watching{cancel: cancel, next: func(ctx context.Context) (any, bool, error) {
			select {
			case l, open := <-ch:
				if l.Term == 0 {
					return nil, open, nil
				}
				return l.Value, open, nil
			case <-ctx.Done():
				return nil, true, ctx.Err()
			}
		}}
	case "next_change":
		w, ok := r.watches[str(step, "watch")]
		if !ok {
			return failf("no watch %q", str(step, "watch"))
		}
		wctx, cancel := context.WithTimeout(ctx, msField(step, "timeout"))
		defer cancel()
		holder, open, err := w.next(wctx)
		if err != nil {
			return err
		}
		if !open {
			return failf("the watch's channel closed")
		}
		if want, ok := step["expect_holder"]; ok && !same(holder, want) {
			return failf("holder %#v, wanted %#v", holder, want)
		}
	case "close_watch":
		w, ok := r.watches[str(step, "watch")]
		if !ok {
			return failf("no watch %q", str(step, "watch"))
		}
		delete(r.watches, str(step, "watch"))
		w.cancel()
		// The channel closes once its context ended (a change sent meanwhile may come first).
		for {
			_, open, err := w.next(ctx)
			if err != nil {
				return failf("the watch's channel did not close: %v", err)
			}
			if !open {
				return nil
			}
		}
	default:
		return &skip{"unsupported", fmt.Sprintf("the runner has no step %q", step["do"])}
	}
	return nil
}

// waitLost waits until done is closed and err reports a loss (ErrLost).
func waitLost(ctx context.Context, timeout time.Duration, done func() <-chan struct{}, errOf func() error) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	return poll(ctx, "the loss reported", func(context.Context) (bool, error) {
		select {
		case <-done():
			return errors.Is(errOf(), redislock.ErrLost), nil
		default:
			return false, nil
		}
	})
}
