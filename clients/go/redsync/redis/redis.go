// Package redis is the pool type of the redsync drop-in (redis-lock/clients/go/redsync): the
// go-redis client the locks are taken on. Make one with goredis.NewPool
// (redis-lock/clients/go/redsync/redis/goredis/v9), as with go-redsync.
package redis

import goredislib "github.com/redis/go-redis/v9"

// Pool is where a redsync Mutex takes its lock: a go-redis client of a server with the
// redis-lock module.
type Pool interface {
	Client() goredislib.UniversalClient
}
