// Command failover times how long the Go client takes to follow a planned CLUSTER FAILOVER
// (issue 34); the rows and shape of benches/failover/follow.py (the Python client's).
//
//	go run ./bench/failover      (from clients/go; QUICK=1: 1 round, else 4)
//
// On a 3-master, 3-replica cluster started by the workspace's harness (`harness cluster`, as
// cluster_failover_test.go does: HARNESS, default ../../target/debug/harness; REDIS_SERVER and
// REDIS_LOCK_MODULE choose the binaries), a go-redis ClusterClient with, as the README shows, a
// Session (NewSession with WithSessionTTL(3 s), WithKeepalivePeriod(0.2 s) as the other
// programs, WithSessionKey and WithUnbound, as the other clients' programs use an unbound
// session) holding a Mutex, and Watch of a second key of the same shard. Each round sends
// CLUSTER FAILOVER to the shard's replica
// (rounds alternate between the two nodes) and measures, from the moment that command answered:
//
//   - promoted: the replica's ROLE says master (polled every 2 ms);
//   - keepalive: the session's first keepalive answered by the new master: the new master's
//     INFO commandstats count of lock.session|keepalive first above its count before the
//     failover (polled every 2 ms; the session is the only one on the shard, checked with
//     LOCK.SESSION LIST; a keepalive that met MOVED there counts as rejected, not as a call);
//   - observer: Watch's first change read from the new master. Watch reports a state only when
//     it differs from the last, so a raw connection takes the watched key on the new master as
//     soon as its ROLE says master; the change is the first Watch reports after the failover (it
//     must be that grant: its token).
//
// Then it checks that no hold was lost (the session and its Mutex not lost, the new master's
// LOCK.FENCE of the Mutex's token): a lost hold ends the program with exit code 1. Prints each
// round on stderr and the table on stdout. A measurement, not a test: `make bench-failover`.
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"runtime/debug"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	redislock "redis-lock/clients/go"
)

const (
	// Redis spaces the failovers of one shard (see follow.py's VOTE_SPACING): a master votes for
	// one failover of a given master per cluster-node-timeout x 2, a replica that ran an election
	// waits x 4 before its next (the harness's timeout is 5 s).
	voteSpacing = 21 * time.Second
	sessionTTL  = 3 * time.Second
	keepalive   = 200 * time.Millisecond // the session's keepalive period, as the other programs'
	// patience bounds every wait: a wait that runs out ends the round with an error.
	patience = 30 * time.Second
	poll     = 2 * time.Millisecond
	tag      = "{bench-failover}"
)

func main() {
	rounds := 4
	if os.Getenv("QUICK") == "1" {
		rounds = 1
	}
	ports, stop, err := startCluster()
	if err != nil {
		fmt.Fprintln(os.Stderr, "failover:", err)
		os.Exit(1)
	}
	rows, err := run(ports, rounds)
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "failover:", err)
		os.Exit(1)
	}
	out, _ := exec.Command(envOr("REDIS_SERVER", "redis-server"), "--version").Output()
	server := "?"
	if f := strings.Fields(string(out)); len(f) > 2 {
		server = strings.TrimPrefix(f[2], "v=")
	}
	build := "debug"
	if m := os.Getenv("REDIS_LOCK_MODULE"); m != "" {
		build = filepath.Base(filepath.Dir(m))
	}
	plural := "s"
	if len(rows) == 1 {
		plural = ""
	}
	fmt.Printf("Go client (go-redis %s ClusterClient) following a planned `CLUSTER FAILOVER` (%d round%s, Redis %s, "+
		"3 masters + 3 replicas on one %d-core machine, module %s build, session ttl 3 s, keepalive every %g s, "+
		"each failover at a random point of that period; ms from the command's reply; no hold lost in any round). "+
		"Keepalive: the new master's `INFO commandstats` count of `lock.session|keepalive` first above its count "+
		"before the failover, polled every 2 ms. Observer: `Watch(ctx, rdb, key)`'s first change after the failover, "+
		"the key taken on the new master by a raw `LOCK.ACQUIRE` as soon as its `ROLE` said master (this client "+
		"reports only a state that differs from the last).\n\n",
		goRedisVersion(), len(rows), plural, server, runtime.NumCPU(), build, keepalive.Seconds())
	fmt.Println("| from `CLUSTER FAILOVER` answered to | median ms | min | max |")
	fmt.Println("|---|---|---|---|")
	col := func(i int) []float64 {
		var v []float64
		for _, r := range rows {
			v = append(v, r[i])
		}
		return v
	}
	line("the replica's `ROLE` is master", col(0))
	line("the session's first keepalive answered by the new master", col(1))
	line("the observer's first change read from the new master", col(2))
}

// goRedisVersion is the go-redis module this program was built with.
func goRedisVersion() string {
	if bi, ok := debug.ReadBuildInfo(); ok {
		for _, d := range bi.Deps {
			if d.Path == "github.com/redis/go-redis/v9" {
				return d.Version
			}
		}
	}
	return "v9"
}

func envOr(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

func line(name string, v []float64) {
	s := append([]float64(nil), v...)
	sort.Float64s(s)
	med := s[len(s)/2]
	if len(s)%2 == 0 {
		med = (s[len(s)/2-1] + s[len(s)/2]) / 2
	}
	fmt.Printf("| %s | %.0f | %.0f | %.0f |\n", name, med, s[0], s[len(s)-1])
}

// startCluster starts `harness cluster --masters 3 --replicas 1` and returns the nodes' ports
// and how to stop it (closing the harness's stdin).
func startCluster() ([]int, func(), error) {
	harness := os.Getenv("HARNESS")
	if harness == "" {
		_, file, _, _ := runtime.Caller(0)
		harness = filepath.Join(filepath.Dir(file), "..", "..", "..", "..", "target", "debug", "harness")
	}
	cmd := exec.Command(harness, "cluster", "--masters", "3", "--replicas", "1")
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, nil, err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, nil, err
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		return nil, nil, err
	}
	stop := func() { _ = stdin.Close(); _ = cmd.Wait() }
	lines := make(chan string, 1)
	go func() {
		l, _ := bufio.NewReader(stdout).ReadString('\n')
		lines <- l
	}()
	var l string
	select {
	case l = <-lines:
	case <-time.After(120 * time.Second):
		stop()
		return nil, nil, errors.New("harness: no JSON line within 120 s")
	}
	var c struct {
		Nodes []struct {
			Port int `json:"port"`
		} `json:"nodes"`
	}
	if err := json.Unmarshal([]byte(l), &c); err != nil {
		stop()
		return nil, nil, fmt.Errorf("harness said %q: %w", l, err)
	}
	var ports []int
	for _, n := range c.Nodes {
		ports = append(ports, n.Port)
	}
	return ports, stop, nil
}

// until polls f every `every` until it is true, at most patience.
func until(what string, every time.Duration, f func() bool) error {
	deadline := time.Now().Add(patience)
	for !f() {
		if time.Now().After(deadline) {
			return fmt.Errorf("timed out waiting for %s", what)
		}
		time.Sleep(every)
	}
	return nil
}

type node struct {
	port int
	c    *redis.Client
}

// role is ROLE's kind ("master", "slave") and, for a replica, its master's port.
func (n node) role(ctx context.Context) (string, int) {
	r, err := n.c.Do(ctx, "ROLE").Slice()
	if err != nil || len(r) == 0 {
		return "", 0
	}
	kind, _ := r[0].(string)
	port := 0
	if len(r) > 2 {
		if p, ok := r[2].(int64); ok {
			port = int(p)
		}
	}
	return kind, port
}

var callsRe = map[string]*regexp.Regexp{}

func (n node) calls(ctx context.Context, command string) (int64, error) {
	re, ok := callsRe[command]
	if !ok {
		re = regexp.MustCompile(`cmdstat_` + regexp.QuoteMeta(command) + `:calls=(\d+)`)
		callsRe[command] = re
	}
	info, err := n.c.Info(ctx, "commandstats").Result()
	if err != nil {
		return 0, err
	}
	m := re.FindStringSubmatch(info)
	if m == nil {
		return 0, nil
	}
	return strconv.ParseInt(m[1], 10, 64)
}

// shard finds the master serving tag's slot now and its replica.
func shard(ctx context.Context, nodes []node) (old, fresh node, err error) {
	found := false
	for _, n := range nodes {
		if kind, _ := n.role(ctx); kind == "master" {
			// Another shard's master answers MOVED.
			if err := n.c.Do(ctx, "LOCK.FENCE", tag).Err(); err == nil || errors.Is(err, redis.Nil) {
				old, found = n, true
			}
		}
	}
	if !found {
		return old, fresh, errors.New("no master serves the tag")
	}
	for _, n := range nodes {
		if kind, port := n.role(ctx); kind == "slave" && port == old.port {
			return old, n, nil
		}
	}
	return old, fresh, errors.New("the tag's master has no replica")
}

// knowsReplica: whether master's CLUSTER NODES lists the node on port as its replica.
func knowsReplica(ctx context.Context, master node, port int) bool {
	view, err := master.c.Do(ctx, "CLUSTER", "NODES").Text()
	if err != nil {
		return false
	}
	var me string
	var lines [][]string
	for _, l := range strings.Split(view, "\n") {
		f := strings.Fields(l)
		if len(f) > 3 {
			lines = append(lines, f)
			if strings.Contains(f[2], "myself") {
				me = f[0]
			}
		}
	}
	for _, f := range lines {
		if strings.HasPrefix(f[1], fmt.Sprintf("127.0.0.1:%d@", port)) && strings.Contains(f[2], "slave") && f[3] == me {
			return true
		}
	}
	return false
}

type seen struct {
	at     time.Time
	change redislock.Change
}

func run(ports []int, rounds int) ([][3]float64, error) {
	ctx := context.Background()
	var nodes []node
	var addrs []string
	for _, p := range ports {
		a := fmt.Sprintf("127.0.0.1:%d", p)
		addrs = append(addrs, a)
		c := redis.NewClient(&redis.Options{Addr: a, DialTimeout: 2 * time.Second, ReadTimeout: 2 * time.Second, MaxRetries: -1})
		defer c.Close()
		nodes = append(nodes, node{p, c})
	}
	rdb := redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs})
	defer rdb.Close()
	c := redislock.New(rdb)
	defer c.Close()

	session, err := redislock.NewSession(ctx, rdb, redislock.WithSessionTTL(sessionTTL), redislock.WithKeepalivePeriod(keepalive),
		redislock.WithSessionKey(tag), redislock.WithUnbound())
	if err != nil {
		return nil, fmt.Errorf("session: %w", err)
	}
	held := redislock.NewMutex(session, tag+"held")
	if err := held.TryLock(ctx); err != nil {
		return nil, fmt.Errorf("the held key: %w", err)
	}
	watchCtx, stopWatching := context.WithCancel(ctx)
	defer stopWatching()
	changes := make(chan seen, 16)
	go func() {
		for ch := range redislock.Watch(watchCtx, rdb, tag+"probe") {
			changes <- seen{time.Now(), ch}
		}
	}()
	next := func(d time.Duration) (seen, error) {
		select {
		case s := <-changes:
			return s, nil
		case <-time.After(d):
			return seen{}, fmt.Errorf("the observer reported nothing within %v", d)
		}
	}
	start, err := next(patience)
	if err != nil {
		return nil, err
	}
	if start.change.Token != 0 {
		return nil, fmt.Errorf("the probe key is held at the start: %+v", start.change)
	}
	old, _, err := shard(ctx, nodes)
	if err != nil {
		return nil, err
	}
	list, err := old.c.Do(ctx, "LOCK.SESSION", "LIST").Slice()
	if err != nil || len(list) != 2 {
		return nil, fmt.Errorf("LOCK.SESSION LIST: %v %v", list, err)
	}
	if s, _ := list[1].([]any); len(s) != 1 {
		return nil, fmt.Errorf("the shard has %d sessions, not the session alone", len(s))
	}

	last := map[int]time.Time{}
	var rows [][3]float64
	for i := 1; i <= rounds; i++ {
		old, fresh, err := shard(ctx, nodes)
		if err != nil {
			return nil, err
		}
		var since time.Time
		for _, p := range []int{old.port, fresh.port} {
			if t, ok := last[p]; ok && t.After(since) {
				since = t
			}
		}
		if !since.IsZero() {
			time.Sleep(time.Until(since.Add(voteSpacing))) // Redis's own vote spacing, not a wait for state
		}
		// A random part of a keepalive period, so that the rounds do not all fall on one phase of
		// the session's keepalive (the spacing is a whole number of periods).
		time.Sleep(rand.N(keepalive))
		if err := until("a replica in sync", poll, func() bool {
			n, err := old.c.Do(ctx, "WAIT", 1, 1000).Int64()
			return err == nil && n == 1
		}); err != nil {
			return nil, err
		}
		before, err := fresh.calls(ctx, "lock.session|keepalive")
		if err != nil {
			return nil, err
		}
		for len(changes) > 0 {
			<-changes
		}

		if ok, err := fresh.c.Do(ctx, "CLUSTER", "FAILOVER").Text(); err != nil || ok != "OK" {
			return nil, fmt.Errorf("CLUSTER FAILOVER: %v %v", ok, err)
		}
		t0 := time.Now()
		last[old.port], last[fresh.port] = t0, t0

		// Poll the promotion, then take the watched key there (once), and the keepalive count.
		var promoted, kept time.Duration
		var probe int64
		if err := until("the promotion, the probe's grant and a keepalive on the new master", poll, func() bool {
			if promoted == 0 {
				if kind, _ := fresh.role(ctx); kind == "master" {
					promoted = time.Since(t0)
				}
			}
			if promoted != 0 && probe == 0 {
				probe, _ = fresh.c.Do(ctx, "LOCK.ACQUIRE", tag+"probe", "bench-probe", 60000).Int64()
			}
			if kept == 0 {
				if n, err := fresh.calls(ctx, "lock.session|keepalive"); err == nil && n > before {
					kept = time.Since(t0)
				}
			}
			return promoted != 0 && probe != 0 && kept != 0
		}); err != nil {
			return nil, fmt.Errorf("%w (promoted %v, probe %d, keepalive %v)", err, promoted, probe, kept)
		}
		first, err := next(patience)
		if err != nil {
			return nil, err
		}
		for s, deadline := first, time.Now().Add(patience); s.change.Token != probe; {
			if s, err = next(time.Until(deadline)); err != nil {
				return nil, fmt.Errorf("the observer did not report the probe's grant on the new master: %w", err)
			}
		}
		observed := first.at.Sub(t0)

		if n, err := fresh.c.Do(ctx, "LOCK.RELEASE", tag+"probe", "bench-probe").Int64(); err != nil || n != 1 {
			return nil, fmt.Errorf("the probe's release: %d %v", n, err)
		}
		for s := (seen{change: redislock.Change{Token: -1}}); s.change.Token != 0; {
			if s, err = next(patience); err != nil {
				return nil, fmt.Errorf("the probe's release not reported: %w", err)
			}
		}
		if n, err := fresh.c.Do(ctx, "LOCK.FENCE", held.Key(), held.Token()).Int64(); err != nil || n != 1 {
			return nil, fmt.Errorf("HOLD LOST: the new master's LOCK.FENCE of the hold answered %d %v", n, err)
		}
		if session.Err() != nil || held.Err() != nil {
			return nil, fmt.Errorf("HOLD LOST: the client reports %v / %v", session.Err(), held.Err())
		}

		if err := until("the old master a replica", poll, func() bool { kind, _ := old.role(ctx); return kind == "slave" }); err != nil {
			return nil, err
		}
		// The next round's replica must be in sync, or its CLUSTER FAILOVER times out ...
		if err := until("its link up", poll, func() bool {
			info, err := old.c.Info(ctx, "replication").Result()
			return err == nil && strings.Contains(info, "master_link_status:up")
		}); err != nil {
			return nil, err
		}
		// ... and known as a replica to its new master.
		if err := until("the new master to know its replica", poll, func() bool { return knowsReplica(ctx, fresh, old.port) }); err != nil {
			return nil, err
		}
		ms := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
		row := [3]float64{ms(promoted), ms(kept), ms(observed)}
		fmt.Fprintf(os.Stderr, "round %d: %.0f / %.0f / %.0f ms\n", i, row[0], row[1], row[2])
		rows = append(rows, row)
	}
	stopWatching()
	_ = held.Unlock(ctx)
	_ = session.Close(ctx)
	return rows, nil
}
