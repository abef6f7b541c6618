package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"time"

	bsm "github.com/bsm/redislock"
	"github.com/go-redsync/redsync/v4"
	"github.com/go-redsync/redsync/v4/redis/goredis/v9"
	"github.com/redis/go-redis/v9"

	redislock "redis-lock/clients/go"
)

type server struct {
	Port int `json:"port"`
	cmd  *exec.Cmd
	in   interface{ Close() error }
}

// startServer starts a redis-server with the module through the workspace's harness program.
func startServer() *server {
	h := os.Getenv("HARNESS")
	if h == "" {
		_, file, _, _ := runtime.Caller(0)
		h = filepath.Join(filepath.Dir(file), "..", "..", "target", "debug", "harness")
	}
	cmd := exec.Command(h, "server")
	in, _ := cmd.StdinPipe()
	out, _ := cmd.StdoutPipe()
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		panic(err)
	}
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil {
		panic(fmt.Sprintf("the harness started nothing: %v", err))
	}
	s := &server{cmd: cmd, in: in}
	if err := json.Unmarshal([]byte(line), s); err != nil {
		panic(err)
	}
	return s
}

func (s *server) stop() { _ = s.in.Close(); _ = s.cmd.Wait() }

// holdAndDie (a child process): lock key in a BOUND session, say so, wait to be killed.
func holdAndDie(addr, key string) {
	ctx := context.Background()
	rdb := redis.NewClient(&redis.Options{Addr: addr})
	s, err := redislock.NewSession(ctx, rdb, redislock.WithSessionTTL(60*time.Second))
	if err != nil {
		panic(err)
	}
	if err := redislock.NewMutex(s, key).Lock(ctx); err != nil {
		panic(err)
	}
	fmt.Println("held")
	select {}
}

// crashed prints how long after a holder's death the next waiter has the lock.
func crashed(addr string) {
	ctx := context.Background()
	rdb := redis.NewClient(&redis.Options{Addr: addr})
	defer rdb.Close()
	fmt.Println("| crashed holder | the waiter has the lock after |")
	fmt.Println("|---|---|")

	// The Go client, BOUND session: the holder's process is killed; timed from the SIGKILL.
	var delays []string
	for i := 0; i < 3; i++ {
		key := fmt.Sprintf("crash:session:%d", i)
		child := exec.Command(os.Args[0], "hold-and-die", addr, key)
		out, _ := child.StdoutPipe()
		child.Stderr = os.Stderr
		if err := child.Start(); err != nil {
			panic(err)
		}
		if line, _ := bufio.NewReader(out).ReadString('\n'); strings.TrimSpace(line) != "held" {
			panic("the holder did not say held: " + line)
		}
		m := redislock.NewMutex(redislock.New(rdb), key)
		got := make(chan time.Time, 1)
		go func() {
			if err := m.Lock(ctx); err != nil {
				panic(err)
			}
			got <- time.Now()
		}()
		waitBlocked(rdb, 1)
		killed := time.Now()
		_ = child.Process.Signal(syscall.SIGKILL)
		delays = append(delays, ms((<-got).Sub(killed)))
		_ = child.Wait()
		_ = m.Unlock(ctx)
	}
	fmt.Printf("| redis-lock Go client, holder in a BOUND session, process killed | %s after the SIGKILL (3 runs) |\n", strings.Join(delays, ", "))

	// A 1 s lock nobody releases: timed from its deadline (PEXPIRETIME).
	type waiter func(key string) error
	abandoned := map[string]struct {
		take func(key string)
		wait waiter
	}{
		"redis-lock Go client, a 1 s lock": {
			func(key string) { _, _ = redislock.Acquire(ctx, rdb, key, "dead", time.Second, false) },
			func(key string) error { return redislock.NewMutex(redislock.New(rdb), key).Lock(ctx) },
		},
		"go-redsync v4.18.1 defaults, a 1 s lock": {
			func(key string) {
				_ = redsync.New(goredis.NewPool(rdb)).NewMutex(key, redsync.WithExpiry(time.Second)).Lock()
			},
			func(key string) error {
				m := redsync.New(goredis.NewPool(rdb)).NewMutex(key)
				for {
					if err := m.Lock(); err == nil {
						return nil
					}
				}
			},
		},
		"bsm/redislock v0.9.4 `LinearBackoff(100ms)`, a 1 s lock": {
			func(key string) { _, _ = bsm.New(rdb).Obtain(ctx, key, time.Second, nil) },
			func(key string) error {
				_, err := bsm.New(rdb).Obtain(ctx, key, 10*time.Second, &bsm.Options{RetryStrategy: bsm.LinearBackoff(100 * time.Millisecond)})
				return err
			},
		},
	}
	for _, name := range []string{"redis-lock Go client, a 1 s lock", "go-redsync v4.18.1 defaults, a 1 s lock", "bsm/redislock v0.9.4 `LinearBackoff(100ms)`, a 1 s lock"} {
		c := abandoned[name]
		delays = delays[:0]
		for i := 0; i < 3; i++ {
			key := fmt.Sprintf("crash:%d:%d", time.Now().UnixNano(), i)
			c.take(key)
			deadline, err := rdb.Do(ctx, "PEXPIRETIME", key).Int64()
			if err != nil || deadline <= 0 {
				panic(fmt.Sprintf("%s: no deadline on %s (%d, %v)", name, key, deadline, err))
			}
			if err := c.wait(key); err != nil {
				panic(err)
			}
			got := time.Now()
			delays = append(delays, ms(got.Sub(time.UnixMilli(deadline))))
			_ = rdb.Del(ctx, key).Err()
		}
		fmt.Printf("| %s | %s after its deadline (3 runs) |\n", name, strings.Join(delays, ", "))
	}
}

func ms(d time.Duration) string { return fmt.Sprintf("%.1f ms", float64(d.Microseconds())/1000) }

func waitBlocked(rdb *redis.Client, n int) {
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		info, _ := rdb.Info(context.Background(), "clients").Result()
		if field(info, "blocked_clients") == fmt.Sprint(n) {
			return
		}
		time.Sleep(2 * time.Millisecond)
	}
	panic("the waiter never blocked")
}
