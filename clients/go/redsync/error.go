package redsync

import (
	"errors"
	"fmt"
)

// The errors of github.com/go-redsync/redsync/v4, with the same names and meanings.

// ErrFailed: the lock was not obtained (a cancelled or expired context: the error also
// matches the context's error, which go-redsync's does not).
var ErrFailed = errors.New("redsync: failed to acquire lock")

// ErrExtendFailed: the lock could not be extended.
var ErrExtendFailed = errors.New("redsync: failed to extend lock")

// ErrLockAlreadyExpired: Unlock of a lock that had expired (or was never held by this value).
var ErrLockAlreadyExpired = errors.New("redsync: failed to unlock, lock was already expired")

// ErrTaken: the lock is held by another owner on a quorum of nodes (here: at the end of the
// wait).
type ErrTaken struct {
	Nodes []int
}

func (err ErrTaken) Error() string {
	return fmt.Sprintf("lock already taken, locked nodes: %v", err.Nodes)
}

// ErrNodeTaken: the lock is held by another owner on one node.
type ErrNodeTaken struct {
	Node int
}

func (err ErrNodeTaken) Error() string {
	return fmt.Sprintf("node #%d: lock already taken", err.Node)
}

// A RedisError is an error communicating with one of the nodes.
type RedisError struct {
	Node int
	Err  error
}

func (e RedisError) Error() string {
	return fmt.Sprintf("node #%d: %s", e.Node, e.Err)
}

func (e RedisError) Unwrap() error {
	return e.Err
}

// failed is ErrFailed that also matches the context's error.
type failed struct{ cause error }

func (e *failed) Error() string   { return ErrFailed.Error() + ": " + e.cause.Error() }
func (e *failed) Unwrap() []error { return []error{ErrFailed, e.cause} }
