//go:build linux || darwin || dragonfly || freebsd || netbsd || openbsd

package redislock

import (
	"net"
	"syscall"
)

// closedByPeer reports whether c's peer has closed it (or it failed), without reading from it:
// a non-blocking MSG_PEEK on its socket, which takes nothing off the connection. Data waiting
// (a reply go-redis has not read yet) is not a close. A connection closed on this side counts
// as closed.
func closedByPeer(c net.Conn) bool {
	if u, ok := c.(interface{ NetConn() net.Conn }); ok { // TLS: the socket underneath
		c = u.NetConn()
	}
	sc, ok := c.(syscall.Conn)
	if !ok {
		return false
	}
	raw, err := sc.SyscallConn()
	if err != nil {
		return false
	}
	closed := false
	// Control, not Read: no read lock and no read deadline, so go-redis's own read of a
	// keepalive's reply may run at the same time.
	if err := raw.Control(func(fd uintptr) {
		var buf [1]byte
		n, _, err := syscall.Recvfrom(int(fd), buf[:], syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
		switch {
		case err == nil:
			closed = n == 0 // end of stream
		case err == syscall.EAGAIN || err == syscall.EWOULDBLOCK || err == syscall.EINTR:
		default:
			closed = true
		}
	}); err != nil {
		return true
	}
	return closed
}
