package redislock

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"strconv"
	"time"
)

// The Lua the fenced writes and multi-key renewals run (the same text as the other clients').
const (
	// FenceCheckLua is the check to put first in a script of your own: KEYS[1] the lock,
	// ARGV[1] the token. A refusal is an error reply starting with "STALE".
	FenceCheckLua = `if redis.call('LOCK.FENCE', KEYS[1], ARGV[1]) ~= 1 then
    return redis.error_reply('STALE token ' .. ARGV[1] .. ' is not the live hold on ' .. KEYS[1])
end
`
	// fencedCallLua: one command on one key behind the check: KEYS[2] the key written, ARGV[2]
	// the command, ARGV[3..] its other arguments.
	fencedCallLua = FenceCheckLua + `return redis.call(ARGV[2], KEYS[2], unpack(ARGV, 3))
`
	// extendAllLua: LOCK.EXTEND on every key (KEYS), owner ARGV[1], ttl ARGV[2]; how many held.
	extendAllLua = `local n = 0
for _, key in ipairs(KEYS) do
    n = n + redis.call('LOCK.EXTEND', key, ARGV[1], ARGV[2])
end
return n
`
)

// newOwner is a unique owner string: host:pid:random, as the other clients make them.
func newOwner() string {
	host, _ := os.Hostname()
	var b [16]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic(err) // crypto/rand does not fail on the platforms Go supports
	}
	return fmt.Sprintf("%s:%d:%s", host, os.Getpid(), hex.EncodeToString(b[:]))
}

// ms is d in whole milliseconds, rounded up (a positive duration never becomes 0).
func ms(d time.Duration) int64 {
	if d <= 0 {
		return 0
	}
	return int64((d + time.Millisecond - 1) / time.Millisecond)
}

// toToken reads a fencing token from a reply (an integer).
func toToken(v any) (int64, error) {
	switch t := v.(type) {
	case int64:
		return t, nil
	case string:
		return strconv.ParseInt(t, 10, 64)
	}
	return 0, fmt.Errorf("redislock: unexpected token reply %T %v", v, v)
}

func toInt(v any) int64 {
	switch t := v.(type) {
	case int64:
		return t
	case string:
		n, _ := strconv.ParseInt(t, 10, 64)
		return n
	}
	return 0
}

func toStr(v any) string {
	switch t := v.(type) {
	case string:
		return t
	case []byte:
		return string(t)
	case nil:
		return ""
	}
	return fmt.Sprint(v)
}

// fields reads a map reply: a RESP2 flat array or a RESP3 map.
func fields(v any) map[string]any {
	out := map[string]any{}
	switch t := v.(type) {
	case []any:
		for i := 0; i+1 < len(t); i += 2 {
			out[toStr(t[i])] = t[i+1]
		}
	case map[any]any:
		for k, val := range t {
			out[toStr(k)] = val
		}
	case map[string]any:
		return t
	}
	return out
}

// Holder is one live holder of a lock, as LOCK.INFO lists it.
type Holder struct {
	Owner string
	Token int64
	// TTL is the time to its deadline; -1 ms for a session hold with no deadline of its own.
	TTL time.Duration
	// Session is true for a hold in a session.
	Session bool
	// SessionSerial is the serial of its session (LOCK.SESSION LIST, Session.Serial); 0: none.
	SessionSerial int64
}

// Waiter is one client queued for a lock.
type Waiter struct {
	Mode  string // "exclusive" or "shared"
	Owner string
}

// Info is a lock's state, LOCK.INFO's reply.
type Info struct {
	Mode    string // "exclusive" or "shared"
	Limit   int64  // a semaphore's permits; 0 without a limit
	Token   int64  // the largest live token
	TTL     time.Duration
	Waiters int64
	Holders []Holder
	Queue   []Waiter
	// Delayed is the lock-delay left (0: none running).
	Delayed time.Duration
	// Seq is the last feed message's sequence number while the key is watched (0: not watched).
	Seq int64
}

// parseInfo reads LOCK.INFO's reply; nil for a free lock.
func parseInfo(reply any) *Info {
	if reply == nil {
		return nil
	}
	f := fields(reply)
	info := &Info{
		Mode:    toStr(f["mode"]),
		Limit:   toInt(f["limit"]),
		Token:   toInt(f["token"]),
		TTL:     time.Duration(toInt(f["ttl"])) * time.Millisecond,
		Waiters: toInt(f["waiters"]),
		Delayed: time.Duration(toInt(f["delayed"])) * time.Millisecond,
		Seq:     toInt(f["seq"]),
	}
	if hs, ok := f["holders"].([]any); ok {
		for _, h := range hs {
			hf := fields(h)
			info.Holders = append(info.Holders, Holder{
				Owner:         toStr(hf["owner"]),
				Token:         toInt(hf["token"]),
				TTL:           time.Duration(toInt(hf["ttl"])) * time.Millisecond,
				Session:       toInt(hf["session"]) != 0, // the session's serial (1 before issue 32)
				SessionSerial: toInt(hf["session"]),
			})
		}
	}
	if qs, ok := f["queue"].([]any); ok {
		for _, q := range qs {
			qf := fields(q)
			info.Queue = append(info.Queue, Waiter{Mode: toStr(qf["mode"]), Owner: toStr(qf["owner"])})
		}
	}
	return info
}
