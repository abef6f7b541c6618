// Package redislock is the Go client of the redis-lock module (LOCK.ACQUIRE, LOCK.SESSION, the
// change feed): locks with fencing tokens whose waits happen in the server's FIFO queue, on
// go-redis v9 (a *redis.Client, a failover client or a *redis.ClusterClient).
//
// The shapes are etcd's client/v3/concurrency: a Session is one lease (one keepalive, Done()
// closed when it ends, BOUND to a connection of its own by default so a dead process's locks
// pass on at once); NewMutex, NewSemaphore, NewRWMutex and NewMultiLock make locks in it, and
// NewElection elects a leader. The same locks made from a Client (New(rdb)) have a ttl of their
// own, renewed by a watchdog, report a loss on Done()/Err(), and are held in the go-redis
// client's default session (DefaultSession: one BOUND session with a 500 ms grace per go-redis
// client and node, closed by Close(ctx, rdb)), so a holder process that dies frees them about
// 0.5 s later; WithDefaultSession(false) keeps the ttl alone.
//
// Every call that talks to the server takes a context first. A wait is one LOCK.ACQUIRE ...
// BLOCK on a connection of its own (never cut by the client's ReadTimeout and sent again), ended
// by the context: the connection is closed, the server drops the waiter, and a grant that came
// anyway is released. Errors match the sentinels (ErrNotObtained, ErrTimeout, ErrLost,
// ErrStaleToken, ErrNotOwned) with errors.Is, and the context's error when that was the cause.
//
// Tokens are int64: RESP integers are signed 64-bit, go-redis returns int64, SQL BIGINT columns
// (where fenced resources often keep them) are signed, and the module's tokens stay below 2^63.
//
// Layout: errors.go (sentinels), wire.go (Lua, reply parsing), conn.go (connections of their
// own, reused by the next wait), hold.go (acquire, release, watchdog: what every lock is made
// of), options.go (Client, Option, Acquire), session.go, defaultsession.go (the registry of
// default sessions, Close), mutex.go (Mutex, Semaphore, RWMutex,
// MultiLock), election.go (Election, Observe), feed.go (losses pushed by the change feed),
// durable.go (WAIT after a grant), redsync/ (a drop-in for github.com/go-redsync/redsync/v4),
// internal/testserver (the tests' servers, through the workspace's harness program),
// bench/takeover (kill -9 of a holder to the next grant, and CLIENT KILL blips).
package redislock
