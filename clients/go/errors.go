package redislock

import (
	"context"
	"errors"
	"fmt"
)

// The sentinel errors, for errors.Is. An error this package returns may match several: a wait
// ended by its context's deadline is ErrTimeout, ErrNotObtained and context.DeadlineExceeded.
var (
	// ErrNotObtained: the lock was not granted (another owner holds it, or the wait ended).
	ErrNotObtained = errors.New("redislock: not obtained")
	// ErrTimeout: a wait ran out of time before the grant.
	ErrTimeout = errors.New("redislock: timed out waiting for the lock")
	// ErrLost: a hold (or a session) ended before its owner gave it back.
	ErrLost = errors.New("redislock: lock lost")
	// ErrStaleToken: a fenced write was refused, its token is not the live hold.
	ErrStaleToken = errors.New("redislock: stale fencing token")
	// ErrNotOwned: release or extend of a hold this owner does not have (never taken, or lost).
	ErrNotOwned = errors.New("redislock: not held by this owner")
	// ErrSessionClosed: the session was closed by its owner; it takes no new holds.
	ErrSessionClosed = errors.New("redislock: session closed")
	// ErrNoLeader: nobody leads the election.
	ErrNoLeader = errors.New("redislock: no leader")
	// ErrInvalidArgument: a call refused before anything was sent (a ttl out of range, no keys).
	ErrInvalidArgument = errors.New("redislock: invalid argument")
)

// lockError is one error that matches several sentinels (and the context's error when that was
// the cause) while keeping one message.
type lockError struct {
	msg  string
	errs []error
}

func (e *lockError) Error() string   { return e.msg }
func (e *lockError) Unwrap() []error { return e.errs }

func newError(errs []error, format string, args ...any) error {
	return &lockError{msg: fmt.Sprintf(format, args...), errs: errs}
}

// waitEnded is the error of a wait its context ended: a deadline is ErrTimeout, a
// cancellation is not, and both wrap the context's error.
func waitEnded(ctx context.Context, key string) error {
	cause := ctx.Err()
	if cause == nil {
		// Its deadline has passed, and ctx's timer has not fired yet (it may run late under load).
		cause = context.DeadlineExceeded
	}
	if errors.Is(cause, context.DeadlineExceeded) {
		return newError([]error{ErrTimeout, ErrNotObtained, cause}, "redislock: %q not obtained: %v", key, cause)
	}
	return newError([]error{ErrNotObtained, cause}, "redislock: %q not obtained: %v", key, cause)
}

// invalid is an argument refused before anything is sent.
func invalid(msg string) error {
	return newError([]error{ErrInvalidArgument}, "redislock: %s", msg)
}

// lost is a hold's loss, with its reason.
func lost(key, reason string, cause error) error {
	errs := []error{ErrLost}
	if cause != nil {
		errs = append(errs, cause)
	}
	return newError(errs, "redislock: lost %q: %s", key, reason)
}
