// Package goredis makes the redsync drop-in's Pool from a go-redis v9 client, as
// github.com/go-redsync/redsync/v4/redis/goredis/v9 does.
package goredis

import (
	goredislib "github.com/redis/go-redis/v9"

	"redis-lock/clients/go/redsync/redis"
)

type pool struct{ client goredislib.UniversalClient }

func (p *pool) Client() goredislib.UniversalClient { return p.client }

// NewPool is a Pool on client (a *redis.Client, a failover client or a *redis.ClusterClient).
func NewPool(client goredislib.UniversalClient) redis.Pool { return &pool{client: client} }
