package redislock_test

// Servers for the tests: the workspace's harness program (target/debug/harness; HARNESS
// overrides it) starts each one on a port the OS chose, in a directory of its own, and stops it
// when its standard input closes. REDIS_SERVER and REDIS_LOCK_MODULE choose the binaries
// (harness/README.md).

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

type server struct {
	Port int    `json:"port"`
	Pid  int    `json:"pid"`
	Dir  string `json:"dir"`
}

type cluster struct {
	Nodes []server `json:"nodes"`
}

func harnessProgram(t testing.TB) string {
	if p := os.Getenv("HARNESS"); p != "" {
		return p
	}
	_, file, _, _ := runtime.Caller(0)
	p := filepath.Join(filepath.Dir(file), "..", "..", "target", "debug", "harness")
	if _, err := os.Stat(p); err != nil {
		t.Fatalf("no harness program at %s (cargo build -p redis-lock-harness, or set HARNESS)", p)
	}
	return p
}

// startHarness runs `harness args...`, decodes its JSON line into out, and stops it at the end
// of the test (closing its stdin).
func startHarness(t testing.TB, out any, args ...string) {
	t.Helper()
	cmd := exec.Command(harnessProgram(t), args...)
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = stdin.Close()
		_ = cmd.Wait()
	})
	line, err := bufio.NewReader(stdout).ReadString('\n')
	if err != nil {
		t.Fatalf("the harness started nothing: %v", err)
	}
	if err := json.Unmarshal([]byte(line), out); err != nil {
		t.Fatalf("harness line %q: %v", line, err)
	}
}

// newServer starts a redis-server with the module; extra goes after `--` (server arguments).
func newServer(t testing.TB, extra ...string) *server {
	t.Helper()
	s := &server{}
	args := []string{"server"}
	if len(extra) > 0 {
		args = append(append(args, "--"), extra...)
	}
	startHarness(t, s, args...)
	return s
}

func (s *server) addr() string { return fmt.Sprintf("127.0.0.1:%d", s.Port) }

// client is a go-redis client of the server, closed at the end of the test.
func (s *server) client(t testing.TB) *redis.Client {
	c := redis.NewClient(&redis.Options{Addr: s.addr()})
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// testCtx is a context that ends with the test, or after d.
func testCtx(t testing.TB, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// eventually polls cond every 5 ms until it holds, failing the test after d.
func eventually(t testing.TB, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("not within %v: %s", d, what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// blockedClients reads INFO clients' blocked_clients.
func blockedClients(t testing.TB, c redis.UniversalClient) int {
	info, err := c.Info(context.Background(), "clients").Result()
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(info, "\r\n") {
		if v, ok := strings.CutPrefix(line, "blocked_clients:"); ok {
			n, _ := strconv.Atoi(v)
			return n
		}
	}
	t.Fatal("no blocked_clients in INFO clients")
	return 0
}

// waitBlocked waits until n clients are blocked on the server.
func waitBlocked(t testing.TB, c redis.UniversalClient, n int) {
	t.Helper()
	eventually(t, 5*time.Second, fmt.Sprintf("%d blocked clients", n), func() bool { return blockedClients(t, c) == n })
}
