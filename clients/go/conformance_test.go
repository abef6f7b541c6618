package redislock_test

// The conformance suite (<repo>/conformance/cases/*.json) run by the Go client.
//
// Every case of every topic file is one subtest (TestConformance/<topic>/<i>), run unchanged:
// each step of the vocabulary (conformance/README.md) is mapped to the package's API (in
// conformance_steps_test.go), each error kind to its sentinel (errorKind). A case whose needs this runner cannot meet, or with a
// step it does not know, is skipped with the reason, never passed. Every step has its own
// deadline (its wait plus stepDeadline) through its context, so no case hangs. The summary per
// topic (passed / skipped / failed) goes to target/conformance/go.json when the test ends.
//
// All cases share one server (flushed between cases); a case that needs a replica gets one for
// its run (harness --replica-of), the cluster cases a 3-master cluster, started on first use.
//
// Where the Go API differs from the vocabulary's shape: an election lives in a session (etcd's
// shape), so an election step without one gets a session of its own with the step's ttl; there
// is no scoped form, so `hold` is Lock (TryLock without a wait) then Unlock; a watch is a
// channel, so `next_change`'s timeout is the runner's select ending with its context's
// DeadlineExceeded.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"runtime"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	redislock "redis-lock/clients/go"
	"redis-lock/clients/go/internal/testserver"
)

// stepDeadline is added to a step's own wait: no step takes longer.
const stepDeadline = 30 * time.Second

type caseStep map[string]any

type conformanceCase struct {
	Description string     `json:"description"`
	Needs       []string   `json:"needs"`
	Steps       []caseStep `json:"steps"`
}

type conformanceTopic struct {
	Topic string            `json:"topic"`
	Cases []conformanceCase `json:"cases"`
}

func repoRoot() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..")
}

func loadTopics(t *testing.T) []conformanceTopic {
	files, err := filepath.Glob(filepath.Join(repoRoot(), "conformance", "cases", "*.json"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no conformance cases: %v", err)
	}
	sort.Strings(files)
	var topics []conformanceTopic
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		var topic conformanceTopic
		if err := json.Unmarshal(data, &topic); err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		topics = append(topics, topic)
	}
	return topics
}

// The results file's shape (conformance/README.md, "A new client").
type topicResult struct {
	Passed   int          `json:"passed"`
	Skipped  int          `json:"skipped"`
	Failed   int          `json:"failed"`
	Skips    []skipRecord `json:"skips"`
	Failures []failRecord `json:"failures"`
}

type skipRecord struct {
	Case   string `json:"case"`
	Kind   string `json:"kind"`
	Reason string `json:"reason"`
}

type failRecord struct {
	Case  string `json:"case"`
	Error string `json:"error"`
}

// skip is a case this runner cannot run: kind "needs" or "unsupported".
type skip struct{ kind, reason string }

func (s *skip) Error() string { return s.kind + ": " + s.reason }

// stepFailure is a step whose outcome was not the case's: the case failed.
type stepFailure struct{ msg string }

func (f *stepFailure) Error() string { return f.msg }

func failf(format string, args ...any) error { return &stepFailure{fmt.Sprintf(format, args...)} }

func TestConformance(t *testing.T) {
	topics := loadTopics(t)
	server := testserver.New(t)
	var cluster *testserver.Cluster
	results := map[string]*topicResult{}
	t.Cleanup(func() { writeResults(t, results) })

	for _, topic := range topics {
		res := &topicResult{Skips: []skipRecord{}, Failures: []failRecord{}}
		results[topic.Topic] = res
		for _, c := range topic.Cases {
			if cluster == nil && slices.Contains(c.Needs, "cluster") {
				// Started on this test, so that it lives for every cluster case.
				cluster = &testserver.Cluster{}
				testserver.StartHarness(t, cluster, "cluster", "--masters", "3", "--replicas", "0")
			}
		}
		for i, c := range topic.Cases {
			t.Run(fmt.Sprintf("%s/%d", topic.Topic, i), func(st *testing.T) {
				st.Log(c.Description)
				err := runCase(st, c, server, cluster)
				var sk *skip
				switch {
				case err == nil:
					res.Passed++
				case errors.As(err, &sk):
					res.Skipped++
					res.Skips = append(res.Skips, skipRecord{Case: c.Description, Kind: sk.kind, Reason: sk.reason})
					st.Skip(sk.Error())
				default:
					res.Failed++
					res.Failures = append(res.Failures, failRecord{Case: c.Description, Error: err.Error()})
					st.Fatal(err)
				}
			})
		}
	}
}

func writeResults(t *testing.T, results map[string]*topicResult) {
	dir := filepath.Join(repoRoot(), "target", "conformance")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Error(err)
		return
	}
	out := map[string]any{"client": "go", "runner": "clients/go/conformance_test.go", "topics": results}
	data, err := json.MarshalIndent(out, "", "  ")
	if err != nil {
		t.Error(err)
		return
	}
	if err := os.WriteFile(filepath.Join(dir, "go.json"), append(data, '\n'), 0o644); err != nil {
		t.Error(err)
	}
}

// runCase runs one case's steps on a client of its own: the shared server (flushed) or the
// cluster, with a replica started for the case if it needs one.
func runCase(t *testing.T, c conformanceCase, server *testserver.Server, cluster *testserver.Cluster) (err error) {
	needs := map[string]bool{}
	for _, n := range c.Needs {
		if n != "cluster" && n != "replica" {
			return &skip{"needs", fmt.Sprintf("needs a %s: this runner starts none", n)}
		}
		needs[n] = true
	}
	ctx := context.Background()
	var rdb redis.UniversalClient
	if needs["cluster"] {
		var addrs []string
		for _, n := range cluster.Nodes {
			addrs = append(addrs, fmt.Sprintf("127.0.0.1:%d", n.Port))
		}
		cc := redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs})
		fctx, cancel := context.WithTimeout(ctx, stepDeadline)
		defer cancel()
		if err := cc.ForEachMaster(fctx, func(ctx context.Context, n *redis.Client) error {
			return n.FlushAll(ctx).Err()
		}); err != nil {
			return fmt.Errorf("FLUSHALL on the cluster: %w", err)
		}
		rdb = cc
	} else {
		rdb = redis.NewClient(&redis.Options{Addr: server.Addr()})
		fctx, cancel := context.WithTimeout(ctx, stepDeadline)
		defer cancel()
		if err := rdb.FlushAll(fctx).Err(); err != nil {
			return fmt.Errorf("FLUSHALL: %w", err)
		}
		if needs["replica"] {
			testserver.NewReplica(t, server)
			if err := poll(fctx, "the replica online", func(ctx context.Context) (bool, error) {
				info, err := rdb.Info(ctx, "replication").Result()
				return strings.Contains(info, "state=online"), err
			}); err != nil {
				return err
			}
		}
	}
	r := &runner{t: t, rdb: rdb, client: redislock.New(rdb), vars: map[string]any{}, objs: map[string]any{},
		pending: map[string]*pendingAcquire{}, watches: map[string]*watching{}}
	defer r.cleanup()
	for i, step := range c.Steps {
		if err := r.run(step); err != nil {
			var sk *skip
			if errors.As(err, &sk) {
				return err
			}
			return fmt.Errorf("step %d %s: %w", i, describeStep(step), err)
		}
	}
	return nil
}

func describeStep(step caseStep) string {
	b, _ := json.Marshal(step)
	return string(b)
}

type pendingAcquire struct {
	cancel context.CancelFunc
	done   chan error
}

// watching is a Watch's or an Observe's channel, as holder values (nil: free).
type watching struct {
	cancel context.CancelFunc
	next   func(ctx context.Context) (holder any, open bool, err error)
}

type runner struct {
	t        *testing.T
	rdb      redis.UniversalClient
	client   *redislock.Client
	vars     map[string]any
	objs     map[string]any
	pending  map[string]*pendingAcquire
	watches  map[string]*watching
	sessions []*redislock.Session
}

func (r *runner) cleanup() {
	for _, w := range r.watches {
		w.cancel()
	}
	for _, p := range r.pending {
		p.cancel()
		<-p.done
	}
	ctx, cancel := context.WithTimeout(context.Background(), stepDeadline)
	defer cancel()
	for _, s := range r.sessions {
		_ = s.Close(ctx)
	}
	_ = r.client.Close()
	_ = r.rdb.Close()
}

// run runs one step within its deadline and checks its outcome: `error` (a kind, and `code`)
// or, without it, no error.
func (r *runner) run(step caseStep) error {
	limit := stepDeadline + msField(step, "wait")
	ctx, cancel := context.WithTimeout(context.Background(), limit)
	defer cancel()
	err := r.step(ctx, step)
	var sk *skip
	var sf *stepFailure
	if errors.As(err, &sk) || errors.As(err, &sf) {
		return err
	}
	want, wantsError := step["error"].(string)
	if !wantsError {
		if err != nil && ctx.Err() != nil {
			return failf("no outcome within %v: %v", limit, err)
		}
		return err
	}
	if err == nil {
		return failf("wanted a %s error, got none", want)
	}
	if got := errorKind(err); got != want {
		return failf("wanted a %s error, got %s (%v)", want, got, err)
	}
	if code, ok := step["code"].(string); ok {
		if got := strings.SplitN(err.Error(), " ", 2)[0]; got != code {
			return failf("wanted the server error code %s, got %q", code, err.Error())
		}
	}
	return nil
}

// errorKind is the vocabulary's outcome kind of an error (conformance/README.md, "Outcome
// kinds of errors"): the package's sentinels with errors.Is, go-redis's redis.Error for the
// server's error replies.
func errorKind(err error) string {
	var reply redis.Error
	switch {
	case errors.Is(err, redislock.ErrNotDurable):
		return "not_durable"
	case errors.Is(err, redislock.ErrStaleToken):
		return "stale_token"
	case errors.Is(err, redislock.ErrInvalidArgument):
		return "invalid_argument"
	case errors.Is(err, redislock.ErrNotObtained):
		return "busy"
	case errors.Is(err, context.DeadlineExceeded), errors.Is(err, redislock.ErrTimeout):
		return "timeout"
	case errors.As(err, &reply):
		return "server"
	}
	return fmt.Sprintf("unexpected %T", err)
}

// --- step fields ---------------------------------------------------------------------------

func msField(step caseStep, name string) time.Duration {
	v, _ := step[name].(float64)
	return time.Duration(v) * time.Millisecond
}

func str(step caseStep, name string) string {
	v, _ := step[name].(string)
	return v
}

func has(step caseStep, name string) bool {
	_, ok := step[name]
	return ok
}

func (r *runner) subst(v any) any {
	switch t := v.(type) {
	case string:
		if name, ok := strings.CutPrefix(t, "$"); ok {
			if saved, ok := r.vars[name]; ok {
				return saved
			}
		}
	case []any:
		out := make([]any, len(t))
		for i, x := range t {
			out[i] = r.subst(x)
		}
		return out
	}
	return v
}

// norm is a reply (or a JSON value) as one comparable form: integers as float64 (JSON's
// numbers), byte strings as strings, arrays element by element.
func norm(v any) any {
	switch t := v.(type) {
	case int64:
		return float64(t)
	case int:
		return float64(t)
	case []byte:
		return string(t)
	case []any:
		out := make([]any, len(t))
		for i, x := range t {
			out[i] = norm(x)
		}
		return out
	}
	return v
}

func same(got, want any) bool { return reflect.DeepEqual(norm(got), norm(want)) }

func (r *runner) expect(step caseStep, got any) error {
	if want, ok := step["expect"]; ok && !same(got, r.subst(want)) {
		return failf("got %#v, wanted %#v", got, want)
	}
	return nil
}

func (r *runner) rawCall(ctx context.Context, command []any) (any, error) {
	reply, err := r.rdb.Do(ctx, r.subst(command).([]any)...).Result()
	if errors.Is(err, redis.Nil) {
		return nil, nil
	}
	return reply, err
}

func poll(ctx context.Context, what string, cond func(context.Context) (bool, error)) error {
	for {
		ok, err := cond(ctx)
		if err != nil && ctx.Err() == nil {
			return err
		}
		if ok {
			return nil
		}
		select {
		case <-ctx.Done():
			return failf("not within its deadline: %s", what)
		case <-time.After(5 * time.Millisecond):
		}
	}
}

func pollFor(ctx context.Context, d time.Duration, what string, cond func(context.Context) (bool, error)) error {
	ctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	return poll(ctx, what, cond)
}
