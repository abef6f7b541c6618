//! The dedicated connection of a bound session (`LOCK.SESSION OPEN ... BOUND`), for both APIs:
//! the session is bound to the connection that opened it and ends the moment it closes, so the
//! client opens it for the session alone, sends `OPEN` on it, and keeps it open and idle until
//! the session is closed. A thread waits on it meanwhile and reports it closing (the server
//! closed it: `CLIENT KILL`, idle `timeout`, a restart; or the network failed) as the session's
//! loss.
//!
//! It is a plain thread with a sync connection in the async API too: nothing else is sent on
//! the connection, and a read that ends with the connection is the quickest way to learn of it.
//!
//! With a cluster node's client ([`Follow`], both APIs) a failover is followed (issue 34):
//! when the client's pool has moved to the slot's new master (its keepalives met `MOVED`), or
//! the connection closed, the thread binds the session to a new connection with `LOCK.SESSION
//! ATTACH id` (a promoted replica has the session unbound) and reports a loss only when the
//! server answers nil (the session ended) or no master answered within the session's ttl.
//!
//! A session opened with a grace (`BOUND GRACE ms`, issue 29) is followed the same way in both
//! APIs: when its connection closes while this process lives (a `CLIENT KILL`, a proxy or the
//! network dropping it), the server keeps the session detached for the grace, and the thread
//! reconnects and `ATTACH`es it within the grace, so every hold goes on with its token.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::{self, JoinHandle};
use std::time::Duration;

use redis::Connection;

use crate::client::{Endpoint, Inner};
use crate::command::Command;
use crate::error::Error;

/// How long the thread's reads wait before it looks whether it was stopped: the most a
/// [`Bound::stop`] waits, and how long the connection may stay open after a session's `CLOSE`.
const POLL: Duration = Duration::from_millis(50);

/// A bound session's connection, and the thread that waits on it.
pub(crate) struct Bound {
    /// Set to stop the thread; it then closes the connection.
    stop: Arc<AtomicBool>,
    /// Joined by [`Bound::stop`].
    thread: Option<JoinHandle<()>>,
}

impl Bound {
    /// Open a connection of its own to `endpoint` (within the connect timeout) and send `open`
    /// on it (within the I/O timeout): the connection and the session's id. A blocking call.
    pub(crate) fn open(
        endpoint: &Endpoint,
        open: &Command<String>,
    ) -> Result<(Connection, String), Error> {
        let mut conn = endpoint.connect(endpoint.connect_timeout)?;
        conn.set_read_timeout(Some(endpoint.io_timeout))
            .and_then(|()| conn.set_write_timeout(Some(endpoint.io_timeout)))
            .map_err(Error::from_redis)?;
        let id = open.run(&mut conn)?;
        name_after_serial(&mut conn, &id);
        Ok((conn, id))
    }

    /// Wait on `conn` in a thread of its own until stopped; if the connection closes first,
    /// call `closed` with the error the read ended with (`None`: the server answered that the
    /// session is gone, when `follow` re-attached it).
    pub(crate) fn watch(
        mut conn: Connection,
        follow: Option<Follow>,
        closed: impl FnOnce(Option<Error>) + Send + 'static,
    ) -> std::io::Result<Bound> {
        let stop = Arc::new(AtomicBool::new(false));
        let stopped = Arc::clone(&stop);
        let thread = thread::Builder::new()
            .name("redis-lock-bound".to_string())
            .spawn(move || {
                if let Err(e) = conn.set_read_timeout(Some(POLL)) {
                    return closed(Some(Error::from_redis(e)));
                }
                let mut at = follow.as_ref().map(Follow::address);
                while !stopped.load(Ordering::Acquire) {
                    let failed = match conn.recv_response() {
                        // Nothing is sent on it, so nothing should come; a stray message (a
                        // push) changes nothing.
                        Ok(_) => None,
                        Err(e) if e.is_timeout() => None,
                        Err(e) => Some(Error::from_redis(e)),
                    };
                    if stopped.load(Ordering::Acquire) {
                        return;
                    }
                    let Some(follow) = &follow else {
                        if let Some(e) = failed {
                            return closed(Some(e));
                        }
                        continue;
                    };
                    // The pool followed a failover (or this connection closed): attach anew.
                    let moved = at.as_ref() != Some(&follow.address());
                    if failed.is_none() && !moved {
                        continue;
                    }
                    match follow.attach(&stopped) {
                        Ok(Some(fresh)) => {
                            conn = fresh;
                            at = Some(follow.address());
                        }
                        Ok(None) => return closed(None),
                        Err(e) => return closed(Some(e)),
                    }
                }
                // Stopped: the connection is closed here, as `conn` is dropped.
            })?;
        Ok(Bound {
            stop,
            thread: Some(thread),
        })
    }

    /// Stop the thread and wait until it has closed the connection (at most [`POLL`]).
    pub(crate) fn stop(mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

impl Drop for Bound {
    /// Stop the thread without waiting: it closes the connection within [`POLL`].
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
    }
}

/// Name the bound connection `redislock-session-<serial>` (the serial from `LOCK.SESSION
/// INFO`; never the id), so that `CLIENT LIST` says whose it is. Best effort: a server without
/// the serial, or a user refused `CLIENT SETNAME`, leaves it unnamed.
fn name_after_serial(conn: &mut Connection, id: &str) {
    let Ok(redis::Value::Array(info)) = redis::cmd("LOCK.SESSION")
        .arg("INFO")
        .arg(id)
        .query::<redis::Value>(conn)
    else {
        // RESP3 maps are not asked for on this connection (RESP2, as the client's).
        return;
    };
    let serial = info.chunks(2).find_map(|kv| match kv {
        [redis::Value::BulkString(k), redis::Value::Int(serial)] if k == b"serial" => Some(*serial),
        _ => None,
    });
    if let Some(serial) = serial {
        let _: redis::RedisResult<()> = redis::cmd("CLIENT")
            .arg("SETNAME")
            .arg(format!("redislock-session-{serial}"))
            .query(conn);
    }
}

/// A client whose endpoint a bound session's thread re-points after a failover: the sync
/// client's or the async client's shared state. The thread is sync in both APIs, so the
/// following is done with blocking I/O.
pub(crate) trait FollowTarget: Send + Sync {
    /// Where the client points now.
    fn endpoint(&self) -> &Endpoint;
    /// After `error`: true if the client now points at the slot's master (its connections to
    /// the old node forgotten).
    fn follow_blocking(&self, error: &Error) -> bool;
}

impl FollowTarget for Inner {
    fn endpoint(&self) -> &Endpoint {
        self
    }

    fn follow_blocking(&self, error: &Error) -> bool {
        if self.follow(error) {
            return true;
        }
        // A node that is gone (killed): the slot's master as the other nodes name it. Not in
        // `Inner::follow`: a command whose connection broke may have run.
        if !self.follow_gone_blocking(error) {
            return false;
        }
        self.forget_idle();
        true
    }
}

/// How a bound session re-attaches: to a cluster node's new master after a failover (the
/// session's ttl to find one), or to the same server after its connection dropped (within the
/// session's grace, when it has one).
pub(crate) struct Follow {
    pub(crate) inner: Arc<dyn FollowTarget>,
    pub(crate) id: String,
    /// How long to keep trying: the ttl (a failover) or the grace (a dropped connection).
    pub(crate) ttl: Duration,
}

impl Follow {
    /// How a session of `inner` (id `id`, ttl `ttl`, opened with `grace`) is followed, if at
    /// all: a cluster node's client re-attaches on the slot's new master after a failover (for
    /// the ttl); elsewhere a session with a grace re-attaches after its connection dropped,
    /// within the grace (the server ends it then). The same in both APIs.
    pub(crate) fn for_session(
        inner: Arc<dyn FollowTarget>,
        id: &str,
        ttl: Duration,
        grace: Option<Duration>,
    ) -> Option<Follow> {
        let within = if inner.endpoint().is_cluster() {
            Some(ttl)
        } else {
            grace
        };
        within.map(|ttl| Follow {
            inner,
            id: id.to_string(),
            ttl,
        })
    }

    /// Where the client points now.
    fn address(&self) -> redis::ConnectionAddr {
        self.inner
            .endpoint()
            .redis()
            .get_connection_info()
            .addr
            .clone()
    }

    /// `LOCK.SESSION ATTACH id` on a new connection to where the client points (following a
    /// `MOVED` there), until the session's ttl passed: the connection, `None` if the server has
    /// no such session, or the last error.
    fn attach(&self, stopped: &AtomicBool) -> Result<Option<Connection>, Error> {
        let deadline = std::time::Instant::now() + self.ttl;
        loop {
            let endpoint = self.inner.endpoint();
            let tried = endpoint
                .connect(endpoint.connect_timeout)
                .and_then(|mut conn| {
                    conn.set_read_timeout(Some(endpoint.io_timeout))
                        .map_err(Error::from_redis)?;
                    let reply: Option<String> = redis::cmd("LOCK.SESSION")
                        .arg("ATTACH")
                        .arg(&self.id)
                        .query(&mut conn)
                        .map_err(Error::from_redis)?;
                    conn.set_read_timeout(Some(POLL))
                        .map_err(Error::from_redis)?;
                    Ok(reply.map(|_| conn))
                });
            match tried {
                Ok(attached) => return Ok(attached),
                Err(e) => {
                    // `MOVED`/`READONLY`, or a node that is gone (killed: its slot's master
                    // as the other nodes name it).
                    self.inner.follow_blocking(&e);
                    if std::time::Instant::now() >= deadline || stopped.load(Ordering::Acquire) {
                        return Err(e);
                    }
                }
            }
            // Short against a grace (a reconnect takes about a millisecond here), long enough
            // not to spin against a server that is restarting.
            thread::sleep(Duration::from_millis(20));
        }
    }
}
