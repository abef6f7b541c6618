// Package testserver starts the servers the tests use. The workspace's harness program
// (target/debug/harness; HARNESS overrides it) starts each one on a port the OS chose, in a
// directory of its own, and stops it when its standard input closes. REDIS_SERVER and REDIS_LOCK_MODULE choose the binaries
// (harness/README.md).
package testserver

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

// Server is one redis-server with the module.
type Server struct {
	Port int    `json:"port"`
	Pid  int    `json:"pid"`
	Dir  string `json:"dir"`
}

// Cluster is a Redis Cluster's nodes.
type Cluster struct {
	Nodes []Server `json:"nodes"`
}

func harnessProgram(t testing.TB) string {
	if p := os.Getenv("HARNESS"); p != "" {
		return p
	}
	_, file, _, _ := runtime.Caller(0)
	p := filepath.Join(filepath.Dir(file), "..", "..", "..", "..", "target", "debug", "harness")
	if _, err := os.Stat(p); err != nil {
		t.Fatalf("no harness program at %s (cargo build -p redis-lock-harness, or set HARNESS)", p)
	}
	return p
}

// StartHarness runs `harness args...`, decodes its JSON line into out, and stops it at the end
// of the test (closing its stdin).
func StartHarness(t testing.TB, out any, args ...string) {
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

// New starts a redis-server with the module; extra goes after `--` (server arguments).
func New(t testing.TB, extra ...string) *Server {
	t.Helper()
	s := &Server{}
	args := []string{"server"}
	if len(extra) > 0 {
		args = append(append(args, "--"), extra...)
	}
	StartHarness(t, s, args...)
	return s
}

// Addr is host:port.
func (s *Server) Addr() string { return fmt.Sprintf("127.0.0.1:%d", s.Port) }

// Client is a go-redis client of the server, closed at the end of the test.
func (s *Server) Client(t testing.TB) *redis.Client {
	c := redis.NewClient(&redis.Options{Addr: s.Addr()})
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// Ctx is a context that ends with the test, or after d.
func Ctx(t testing.TB, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// Eventually polls cond every 5 ms until it holds, failing the test after d.
func Eventually(t testing.TB, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("not within %v: %s", d, what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// BlockedClients reads INFO clients' blocked_clients.
func BlockedClients(t testing.TB, c redis.UniversalClient) int {
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

// WaitBlocked waits until n clients are blocked on the server.
func WaitBlocked(t testing.TB, c redis.UniversalClient, n int) {
	t.Helper()
	Eventually(t, 5*time.Second, fmt.Sprintf("%d blocked clients", n), func() bool { return BlockedClients(t, c) == n })
}

// GoProgram writes code as main.go in a new directory inside the module (so that it builds with
// the module's go.mod; a name starting with "." keeps it out of ./...) and runs `go run .`, or
// only `go build` when run is false. It returns the program's output, failing the test on an
// error.
func GoProgram(t testing.TB, ctx context.Context, code string, run bool) string {
	t.Helper()
	_, file, _, _ := runtime.Caller(0)
	module := filepath.Join(filepath.Dir(file), "..", "..")
	dir, err := os.MkdirTemp(module, ".program-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	if err := os.WriteFile(filepath.Join(dir, "main.go"), []byte(code), 0o644); err != nil {
		t.Fatal(err)
	}
	args := []string{"run", "."}
	if !run {
		args = []string{"build", "-o", os.DevNull, "."}
	}
	cmd := exec.CommandContext(ctx, "go", args...)
	cmd.Dir = dir
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("go %s: %v\n%s\n--- the program:\n%s", args[0], err, out, code)
	}
	return string(out)
}

// NewReplica starts a replica of primary (with the module).
func NewReplica(t testing.TB, primary *Server) *Server {
	t.Helper()
	s := &Server{}
	StartHarness(t, s, "server", "--replica-of", fmt.Sprint(primary.Port))
	return s
}
