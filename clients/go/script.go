package redislock

import (
	"context"
	"errors"
	"strings"

	"github.com/redis/go-redis/v9"
)

// FencedScript is a Lua script of one's own behind the fence check (FenceCheckLua put first):
// it runs only while token is the live hold on the lock, atomically, and is refused with
// ErrStaleToken otherwise, as Fenced is. In the script KEYS[1] is the lock and ARGV[1] the
// token; the caller's keys and arguments follow (KEYS[2]..., ARGV[2]...).
type FencedScript struct{ script *redis.Script }

// NewFencedScript is body behind the fence check. It is sent once (EVALSHA, then EVAL when the
// server does not have it yet).
func NewFencedScript(body string) *FencedScript {
	return &FencedScript{script: redis.NewScript(FenceCheckLua + body)}
}

// Run runs the script behind lockKey's token: its reply, or an error matching ErrStaleToken
// (and wrapping the server's STALE reply) when token is not the live hold. In a cluster keys
// must share the lock's slot (a hash tag).
func (s *FencedScript) Run(ctx context.Context, client redis.UniversalClient, lockKey string, token int64, keys []string, args ...any) (any, error) {
	if token == 0 {
		return nil, newError([]error{ErrStaleToken}, "redislock: no token: %q is not held", lockKey)
	}
	reply, err := s.script.Run(ctx, client, append([]string{lockKey}, keys...), append([]any{token}, args...)...).Result()
	if errors.Is(err, redis.Nil) {
		return nil, nil
	}
	if err != nil && strings.HasPrefix(err.Error(), "STALE ") {
		return nil, newError([]error{ErrStaleToken, err}, "redislock: %s", err.Error())
	}
	return reply, err
}
