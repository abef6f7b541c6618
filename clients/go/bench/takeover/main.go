// Command takeover times kill -9 of a holder process to the next holder's grant, with the Go
// client's defaults, and CLIENT KILL blips of a live holder's default-session connection.
//
//	go run ./bench/takeover [RUNS]      (from clients/go; default 20 runs)
//
// It starts one server with the module through the workspace's harness (as the tests do:
// HARNESS, default ../../target/debug/harness; REDIS_SERVER and REDIS_LOCK_MODULE choose the
// binaries), then for each run starts a holder process (this program again, with
// REDISLOCK_BENCH_HOLDER set) that takes its lock as clients/go/README.md's first example does,
// queues a waiter here (a ttl-only Mutex: WithDefaultSession(false)), SIGKILLs the holder and
// times, on this process's monotonic clock, from the kill to the waiter's Lock returning. Rows:
//
//   - NewMutex(redislock.New(rdb), name): the README's first example (ttl 30 s, the watchdog,
//     the default session).
//   - the same WithTTL(5*time.Second).
//   - the same WithTTL(5*time.Second), WithDefaultSession(false): the ttl alone, for reference
//     (3 runs).
//
// Then RUNS blips: the holder process lives, its default session's bound connection is ended
// with CLIENT KILL, and the row says in how many the hold was still the holder's two seconds
// later (LOCK.FENCE key token) and how long the client took to ATTACH the session on a new
// connection (LOCK.SESSION LIST's bound). The output has the shape of
// clients/python/bench/default_session_takeover.py's.
//
// Prints p50, p99 (nearest rank: of 20 runs, p99 is the largest) and the largest.
package main

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"

	redislock "redis-lock/clients/go"
)

func main() {
	if os.Getenv("REDISLOCK_BENCH_HOLDER") != "" {
		holder()
		return
	}
	runs := 20
	if len(os.Args) > 1 {
		n, err := strconv.Atoi(os.Args[1])
		check(err)
		runs = n
	}
	addr, stop := startServer()
	defer stop()
	rdb := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1})
	defer rdb.Close()

	fmt.Printf("%-52s %4s %9s %9s %9s\n", "holder made as", "runs", "p50 ms", "p99 ms", "max ms")
	rows := []struct {
		label string
		mode  string
		n     int
	}{
		{"NewMutex(redislock.New(rdb), name)", "default", runs},
		{"NewMutex(redislock.New(rdb), name, WithTTL(5s))", "ttl5", runs},
		{"... WithTTL(5s), WithDefaultSession(false)", "ttl5-only", 3},
	}
	for _, row := range rows {
		var took []float64
		for i := 0; i < row.n; i++ {
			took = append(took, oneRun(rdb, addr, row.mode))
		}
		fmt.Printf("%-52s %4d %9.1f %9.1f %9.1f\n", row.label, row.n, median(took), percentile(took, 99), maxOf(took))
	}
	kept := 0
	var took []float64
	for i := 0; i < runs; i++ {
		ok, ms := oneBlip(rdb, addr)
		if ok {
			kept++
			took = append(took, ms)
		}
	}
	label := "CLIENT KILL of its bound connection, process alive"
	if len(took) > 0 {
		fmt.Printf("%-52s %4d holds kept %d/%d; re-attached p50 %.1f ms, p99 %.1f ms, max %.1f ms\n",
			label, runs, kept, runs, median(took), percentile(took, 99), maxOf(took))
	} else {
		fmt.Printf("%-52s %4d holds kept 0/%d\n", label, runs, runs)
	}
}

// holder takes the lock as the README's first example does and waits to be killed.
func holder() {
	ctx := context.Background()
	rdb := redis.NewClient(&redis.Options{Addr: os.Getenv("REDISLOCK_ADDR")})
	var opts []redislock.Option
	switch os.Getenv("REDISLOCK_BENCH_HOLDER") {
	case "ttl5":
		opts = append(opts, redislock.WithTTL(5*time.Second))
	case "ttl5-only":
		opts = append(opts, redislock.WithTTL(5*time.Second), redislock.WithDefaultSession(false))
	}
	mu := redislock.NewMutex(redislock.New(rdb), os.Getenv("REDISLOCK_KEY"), opts...)
	if err := mu.Lock(ctx); err != nil {
		fmt.Println("error", err)
		os.Exit(1)
	}
	fmt.Println("held", mu.Token())
	select {}
}

func spawnHolder(addr, key, mode string) (*exec.Cmd, int64) {
	self, err := os.Executable()
	check(err)
	cmd := exec.Command(self)
	cmd.Env = append(os.Environ(), "REDISLOCK_BENCH_HOLDER="+mode, "REDISLOCK_ADDR="+addr, "REDISLOCK_KEY="+key)
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	check(err)
	check(cmd.Start())
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil || !strings.HasPrefix(line, "held ") {
		_ = cmd.Process.Kill()
		panic(fmt.Sprintf("holder: %q %v", line, err))
	}
	token, err := strconv.ParseInt(strings.TrimSpace(strings.TrimPrefix(line, "held ")), 10, 64)
	check(err)
	return cmd, token
}

func newKey() string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return "bench:" + hex.EncodeToString(b[:])
}

// oneRun: ms from the SIGKILL of a holder made in mode to the grant of a waiter queued here.
func oneRun(rdb *redis.Client, addr, mode string) float64 {
	ctx := context.Background()
	key := newKey()
	child, _ := spawnHolder(addr, key, mode)
	defer func() { _ = child.Process.Kill(); _ = child.Wait() }()
	waiter := redislock.NewMutex(redislock.New(rdb), key, redislock.WithDefaultSession(false))
	type result struct {
		at  time.Time
		err error
	}
	got := make(chan result, 1)
	wctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	go func() {
		err := waiter.Lock(wctx)
		got <- result{time.Now(), err}
	}()
	for deadline := time.Now().Add(10 * time.Second); blocked(rdb) != 1; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			panic("the waiter did not queue")
		}
	}
	killed := time.Now()
	check(child.Process.Signal(syscall.SIGKILL))
	r := <-got
	check(r.err)
	check(waiter.Unlock(ctx))
	return float64(r.at.Sub(killed).Microseconds()) / 1000
}

// oneBlip: CLIENT KILL of a live holder's bound connection: (hold kept?, ms to the re-ATTACH).
func oneBlip(rdb *redis.Client, addr string) (bool, float64) {
	ctx := context.Background()
	key := newKey()
	child, token := spawnHolder(addr, key, "default")
	defer func() { _ = child.Process.Kill(); _ = child.Wait() }()
	info, err := redislock.Inspect(ctx, rdb, key)
	check(err)
	serial := info.Holders[0].SessionSerial
	old := boundOf(rdb, serial)
	killed := time.Now()
	n, err := rdb.ClientKillByFilter(ctx, "ID", strconv.FormatInt(old, 10)).Result()
	if err != nil || n != 1 {
		panic(fmt.Sprintf("CLIENT KILL ID %d: %d %v", old, n, err))
	}
	attached := -1.0
	for time.Since(killed) < 2*time.Second { // four graces: long past the server's end of it
		if now := boundOf(rdb, serial); attached < 0 && now != 0 && now != old {
			attached = float64(time.Since(killed).Microseconds()) / 1000
		}
		time.Sleep(time.Millisecond)
	}
	live, err := rdb.Do(ctx, "LOCK.FENCE", key, token).Int64()
	check(err)
	return live == 1 && attached >= 0, attached
}

// boundOf is the client id the session with this serial is bound to (LOCK.SESSION LIST); 0
// when it is not bound or not there.
func boundOf(rdb *redis.Client, serial int64) int64 {
	cursor := "0"
	for {
		reply, err := rdb.Do(context.Background(), "LOCK.SESSION", "LIST", cursor, "COUNT", 1000).Slice()
		check(err)
		entries, _ := reply[1].([]any)
		for _, e := range entries {
			f := fieldMap(e)
			if toInt(f["serial"]) == serial {
				return toInt(f["bound"])
			}
		}
		if cursor = fmt.Sprint(reply[0]); cursor == "0" {
			return 0
		}
	}
}

func fieldMap(v any) map[string]any {
	out := map[string]any{}
	switch m := v.(type) {
	case []any:
		for i := 0; i+1 < len(m); i += 2 {
			out[fmt.Sprint(m[i])] = m[i+1]
		}
	case map[any]any:
		for k, x := range m {
			out[fmt.Sprint(k)] = x
		}
	}
	return out
}

func toInt(v any) int64 {
	n, _ := strconv.ParseInt(fmt.Sprint(v), 10, 64)
	return n
}

func blocked(rdb *redis.Client) int {
	s, err := rdb.Info(context.Background(), "clients").Result()
	check(err)
	for _, line := range strings.Split(s, "\r\n") {
		if v, ok := strings.CutPrefix(line, "blocked_clients:"); ok {
			n, _ := strconv.Atoi(v)
			return n
		}
	}
	return -1
}

// startServer starts `harness server` (one redis-server with the module) and returns its
// address and how to stop it (closing the harness's stdin).
func startServer() (string, func()) {
	harness := os.Getenv("HARNESS")
	if harness == "" {
		_, file, _, _ := runtime.Caller(0)
		harness = filepath.Join(filepath.Dir(file), "..", "..", "..", "..", "target", "debug", "harness")
	}
	cmd := exec.Command(harness, "server")
	stdin, err := cmd.StdinPipe()
	check(err)
	stdout, err := cmd.StdoutPipe()
	check(err)
	cmd.Stderr = os.Stderr
	check(cmd.Start())
	line, err := bufio.NewReader(stdout).ReadString('\n')
	check(err)
	var s struct {
		Port int `json:"port"`
	}
	check(json.Unmarshal([]byte(line), &s))
	return fmt.Sprintf("127.0.0.1:%d", s.Port), func() { _ = stdin.Close(); _ = cmd.Wait() }
}

func median(v []float64) float64 {
	s := append([]float64(nil), v...)
	sort.Float64s(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// percentile is the nearest-rank percentile.
func percentile(v []float64, p int) float64 {
	s := append([]float64(nil), v...)
	sort.Float64s(s)
	rank := (len(s)*p + 99) / 100
	return s[max(0, rank-1)]
}

func maxOf(v []float64) float64 {
	m := v[0]
	for _, x := range v {
		m = max(m, x)
	}
	return m
}

func check(err error) {
	if err != nil {
		panic(err)
	}
}
