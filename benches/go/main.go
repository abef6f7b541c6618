// Command gobench: contention on one key from Go, the Go client against the Go lock libraries
// people use, on the same server in the same run: go-redsync (its defaults: 32 tries, a retry
// delay of rand(50 ms, 250 ms)) and bsm/redislock (a linear retry: 100 ms as its README shows,
// and 10 ms). N goroutines (8, then 32) all after one key, each holding it 1 ms and asking again
// at once; real handoffs/s (grants to another goroutine than the last holder) and the wait's
// p50/p99. Then a crashed holder: the delay from its death (a BOUND session's process killed) or
// from its 1 s lock's deadline to the next waiter's grant.
//
//	go run . [-secs 5] [-workers 8,32]      (make bench-go; HARNESS, REDIS_SERVER,
//	                                          REDIS_LOCK_MODULE as for the tests)
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	bsm "github.com/bsm/redislock"
	"github.com/go-redsync/redsync/v4"
	"github.com/go-redsync/redsync/v4/redis/goredis/v9"
	"github.com/redis/go-redis/v9"

	redislock "redis-lock/clients/go"
	dropin "redis-lock/clients/go/redsync"
	dropinpool "redis-lock/clients/go/redsync/redis/goredis/v9"
)

// A locker takes and gives back the key; one per goroutine.
type locker interface {
	lock(ctx context.Context) error
	unlock(ctx context.Context) error
}

type lib struct {
	name string
	make func(rdb *redis.Client, key string) locker
}

type moduleLock struct{ m *redislock.Mutex }

func (l moduleLock) lock(ctx context.Context) error   { return l.m.Lock(ctx) }
func (l moduleLock) unlock(ctx context.Context) error { return l.m.Unlock(ctx) }

type redsyncLock struct{ m *redsync.Mutex }

func (l redsyncLock) lock(ctx context.Context) error {
	for {
		err := l.m.LockContext(ctx)
		if err == nil || ctx.Err() != nil {
			return err
		}
		// go-redsync gave up after its tries: a user's loop asks again.
	}
}
func (l redsyncLock) unlock(ctx context.Context) error {
	_, err := l.m.UnlockContext(ctx)
	return err
}

type dropinLock struct{ m *dropin.Mutex }

func (l dropinLock) lock(ctx context.Context) error {
	for {
		err := l.m.LockContext(ctx)
		if err == nil || ctx.Err() != nil {
			return err
		}
	}
}
func (l dropinLock) unlock(ctx context.Context) error {
	_, err := l.m.UnlockContext(ctx)
	return err
}

type bsmLock struct {
	c     *bsm.Client
	key   string
	retry time.Duration
	held  *bsm.Lock
}

func (l *bsmLock) lock(ctx context.Context) error {
	lk, err := l.c.Obtain(ctx, l.key, 10*time.Second, &bsm.Options{RetryStrategy: bsm.LinearBackoff(l.retry)})
	l.held = lk
	return err
}
func (l *bsmLock) unlock(ctx context.Context) error { return l.held.Release(ctx) }

func libs() []lib {
	return []lib{
		{"redis-lock Go client (`Mutex.Lock`: one `LOCK.ACQUIRE ... BLOCK`)", func(rdb *redis.Client, key string) locker {
			return moduleLock{redislock.NewMutex(redislock.New(rdb), key, redislock.WithTTL(10*time.Second), redislock.WithWatchdog(false))}
		}},
		{"go-redsync v4.18.1, defaults", func(rdb *redis.Client, key string) locker {
			return redsyncLock{redsync.New(goredis.NewPool(rdb)).NewMutex(key, redsync.WithExpiry(10*time.Second))}
		}},
		{"the redsync drop-in (`redis-lock/clients/go/redsync`), the same code", func(rdb *redis.Client, key string) locker {
			return dropinLock{dropin.New(dropinpool.NewPool(rdb)).NewMutex(key, dropin.WithExpiry(10*time.Second))}
		}},
		{"bsm/redislock v0.9.4, `LinearBackoff(100ms)`", func(rdb *redis.Client, key string) locker {
			return &bsmLock{c: bsm.New(rdb), key: key, retry: 100 * time.Millisecond}
		}},
		{"bsm/redislock v0.9.4, `LinearBackoff(10ms)`", func(rdb *redis.Client, key string) locker {
			return &bsmLock{c: bsm.New(rdb), key: key, retry: 10 * time.Millisecond}
		}},
	}
}

type grant struct {
	at     time.Time
	worker int
}

type row struct {
	handoffsPerS, p50, p99, max float64
	minPer, maxPer              int
	errors                      int
}

// contend runs n goroutines on one key for d.
func contend(addr string, l lib, n int, d time.Duration) row {
	rdb := redis.NewClient(&redis.Options{Addr: addr, PoolSize: n + 4})
	defer rdb.Close()
	key := fmt.Sprintf("bench:%d:%d", time.Now().UnixNano(), n)
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	var mu sync.Mutex
	var grants []grant
	var waits []float64
	per := make([]int, n)
	errs := 0
	var wg sync.WaitGroup
	for w := 0; w < n; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			lk := l.make(rdb, key)
			for ctx.Err() == nil {
				start := time.Now()
				if err := lk.lock(ctx); err != nil {
					// The row's end is not an error: its context's deadline (a wait's BLOCK
					// timeout, computed from it, may answer before ctx.Err() is set).
					if ctx.Err() == nil && !errors.Is(err, context.DeadlineExceeded) {
						mu.Lock()
						errs++
						mu.Unlock()
						fmt.Fprintf(os.Stderr, "%d goroutines, %s: lock: %v\n", n, l.name, err)
					}
					continue
				}
				got := time.Now()
				time.Sleep(time.Millisecond)
				mu.Lock()
				grants = append(grants, grant{got, w})
				waits = append(waits, float64(got.Sub(start).Microseconds())/1000)
				per[w]++
				mu.Unlock()
				if err := lk.unlock(context.Background()); err != nil {
					mu.Lock()
					errs++
					mu.Unlock()
					fmt.Fprintf(os.Stderr, "%d goroutines, %s: unlock: %v\n", n, l.name, err)
				}
			}
		}(w)
	}
	wg.Wait()
	sort.Slice(grants, func(i, j int) bool { return grants[i].at.Before(grants[j].at) })
	real := 0
	for i := 1; i < len(grants); i++ {
		if grants[i].worker != grants[i-1].worker {
			real++
		}
	}
	sort.Float64s(waits)
	r := row{handoffsPerS: float64(real) / d.Seconds(), errors: errs, minPer: per[0], maxPer: per[0]}
	if len(waits) > 0 {
		r.p50, r.p99, r.max = pct(waits, 50), pct(waits, 99), waits[len(waits)-1]
	}
	for _, c := range per {
		r.minPer, r.maxPer = min(r.minPer, c), max(r.maxPer, c)
	}
	return r
}

func pct(sorted []float64, p float64) float64 {
	i := int(float64(len(sorted)-1) * p / 100)
	return sorted[i]
}

func main() {
	if len(os.Args) > 1 && os.Args[1] == "hold-and-die" {
		holdAndDie(os.Args[2], os.Args[3])
		return
	}
	secs := flag.Float64("secs", 5, "seconds per row")
	workers := flag.String("workers", "8,32", "goroutine counts")
	flag.Parse()
	srv := startServer()
	defer srv.stop()
	addr := fmt.Sprintf("127.0.0.1:%d", srv.Port)
	rdb := redis.NewClient(&redis.Options{Addr: addr})
	version, _ := rdb.Info(context.Background(), "server").Result()
	fmt.Printf("Server: %s, module %s. Each row %.0f s; one key, 1 ms holds.\n\n", field(version, "redis_version"), os.Getenv("REDIS_LOCK_MODULE"), *secs)
	fmt.Println("| goroutines | library | real handoffs/s | wait p50 ms | wait p99 ms | wait max ms | acquisitions per goroutine min / max | errors |")
	fmt.Println("|---|---|---|---|---|---|---|---|")
	for _, ws := range strings.Split(*workers, ",") {
		n, _ := strconv.Atoi(ws)
		for _, l := range libs() {
			r := contend(addr, l, n, time.Duration(*secs*float64(time.Second)))
			fmt.Printf("| %d | %s | %.1f | %.2f | %.1f | %.1f | %d / %d | %d |\n", n, l.name, r.handoffsPerS, r.p50, r.p99, r.max, r.minPer, r.maxPer, r.errors)
		}
	}
	fmt.Println()
	crashed(addr)
}

func field(info, name string) string {
	for _, line := range strings.Split(info, "\r\n") {
		if v, ok := strings.CutPrefix(line, name+":"); ok {
			return v
		}
	}
	return "?"
}
