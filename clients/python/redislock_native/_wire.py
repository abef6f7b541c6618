"""How commands reach the server: one blocking call, on its own terms.

Most commands go through the user's client as usual (``client.execute_command``),
with whatever timeouts and retries it was built with. Two kinds of call cannot:

- ``LOCK.ACQUIRE ... BLOCK ms`` may legitimately wait longer than the client's
  socket timeout (redis-py 8 defaults to 5 s), and a redis-py ``Retry`` would
  re-send it after that timeout on a new connection, at the back of the
  server's FIFO queue. So the wait is one command, sent on a connection
  borrowed from the client's own pool, read with a timeout of the wait plus the
  connection's own socket timeout, with no retry. The connection's socket
  timeout is restored before it goes back to the pool: the user's client is
  left exactly as it was.
- A watchdog renewal must answer within its period, or the holder would learn
  of a loss too late. It is sent the same way, read with the period as timeout.

Interrupting a wait (``KeyboardInterrupt`` in a sync wait, cancellation of an
asyncio task) must leave no grant behind: the server may grant the lock in the
very instant the caller gives up. The connection's client id is read in the
same round trip as the ``LOCK.ACQUIRE`` (``CLIENT ID`` is pipelined before it).
On interruption ``CLIENT UNBLOCK id`` is sent on another connection: the server
then answers the waiter at once, with nil or with the token it had just
granted, and that reply is read; a token is given back with
``LOCK.RELEASE key owner``. Where ``CLIENT UNBLOCK`` is not allowed (ACL), the
waiting connection is closed, which removes the waiter, and ``LOCK.RELEASE`` is
sent anyway, best effort.

This module touches one private attribute of redis-py: the connection's socket
(``conn._sock``), to set its timeout for one read. It has had that name since
redis-py 2 and still has it in 8.1 (the versions this package is tested with are
in its README).
"""

import asyncio
import inspect
import math
import os
import socket
import uuid

from redis.exceptions import ConnectionError, LockError, ResponseError, TimeoutError

# How long to wait for the reply of a waiter just unblocked (the server sends it at once) when
# the connection has no socket timeout of its own: finite, in case that reply was already
# consumed by the interrupted read.
_UNBLOCKED_REPLY_TIMEOUT = 5.0

# How often ``astop`` cancels a task again that went on after a cancellation.
_RECANCEL_S = 0.05

# Reads that must not time out (a wait without limit). The asyncio connection's
# read_response treats None as "use the socket timeout", so a finite large value is
# passed instead: about 30 years.
_FOREVER = 1e9


def new_owner():
    """A fresh owner string: host, pid and a random UUID, so LOCK.INFO says who holds it."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex}"


def to_ms(seconds, what, allow_zero=False):
    """Seconds (int or float) to whole milliseconds for the server; at least 1 ms."""
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)):
        raise TypeError(f"{what} must be a number of seconds, got {seconds!r}")
    if math.isnan(seconds) or math.isinf(seconds) or seconds < 0 or (seconds == 0 and not allow_zero):
        raise ValueError(f"{what} must be a positive number of seconds, got {seconds!r}")
    return max(1, math.ceil(seconds * 1000)) if seconds > 0 else 0


def lock_error(cls, message, name):
    """``cls(message, lock_name=name)``; redis-py before 5.1 has no ``lock_name``."""
    try:
        return cls(message, lock_name=name)
    except TypeError:
        return cls(message)


def _takes_command_name(get_connection):
    """redis-py < 5.3 requires a command name in ``pool.get_connection``; later ones deprecate it."""
    try:
        param = inspect.signature(get_connection).parameters.get("command_name")
    except (TypeError, ValueError):
        return False
    return param is not None and param.default is inspect.Parameter.empty


def _socket(conn):
    # Client-side caching wraps the real connection in a proxy with `_conn`.
    return getattr(conn, "_sock", None) or getattr(getattr(conn, "_conn", None), "_sock", None)


def read_timeout(conn, wait_s):
    """How long to read a reply that the server sends after up to ``wait_s`` seconds.

    ``None`` (no limit) when the wait has no limit or the connection has no socket timeout.
    """
    margin = conn.socket_timeout
    if wait_s is None or margin is None:
        return None
    return wait_s + margin


def route(client, key):
    """Keyword arguments for ``client.execute_command`` that send a command about ``key``
    straight to the node that serves it: for a redis-py cluster client (sync or asyncio),
    ``target_nodes`` = the master of the key's slot (from its hash tag) in the client's slot
    table; nothing for any other client.

    redis-py would find the node by itself, but for a command with a key count (LOCK.MACQUIRE,
    LOCK.MRELEASE) only by asking a node ``COMMAND GETKEYS`` first, a round trip per command.
    With ``target_nodes`` redis-py also never sends the command again after a connection error
    or a timeout, when it may have run: the error reaches the lock, whose cleanup gives back a
    grant whose reply was lost. It still follows MOVED and ASK (the command did not run)
    within the call. An asyncio cluster client not yet initialized has no slot table: redis-py routes it."""
    find = getattr(client, "get_node_from_key", None)
    if find is None:
        return {}
    try:
        node = find(key)
    except Exception:  # noqa: BLE001 - no slot table yet: redis-py routes it
        return {}
    return {} if node is None else {"target_nodes": node}


def node_client(client, key):
    """The client whose connection pool a timed or blocking call borrows from: the client
    itself, or for a sync ``RedisCluster`` its client of the node that serves ``key``."""
    if hasattr(client, "connection_pool"):
        return client
    if hasattr(client, "get_redis_connection"):
        return client.get_redis_connection(client.get_node_from_key(key))
    raise TypeError(
        f"{type(client).__name__} has no connection pool to wait on: with redis.asyncio's "
        "RedisCluster only blocking=False acquires (and sessions) are offered"
    )


# --- following a cluster through a failover ---------------------------------------------

#: How long to wait between two looks at the slot table while a slot has no reachable master
#: (a failover under way).
FOLLOW_BACKOFF = 0.05

#: How long a single try (no wait of its own) looks for the slot's master after a failover
#: before its error is raised.
FOLLOW_TRY = 5.0


def is_cluster(client):
    """A redis-py cluster client (sync or asyncio): it routes by key and has no one pool."""
    return hasattr(client, "get_node_from_key") and not hasattr(client, "connection_pool")


def moved_away(error):
    """Whether ``error`` says the node asked no longer serves the slot (as a master): ``MOVED``
    (the slot went to another node), ``READONLY`` (the node is a replica now), ``CLUSTERDOWN``,
    ``TRYAGAIN``, ``UNBLOCKED`` after a role change, or the connection lost (a killed master).
    In a cluster these mean: look up the slot's master again and ask it; they say nothing about
    whether a hold or a session still exists."""
    if isinstance(error, (ConnectionError, TimeoutError, OSError)):
        return True
    text = str(error)
    return text.startswith(("MOVED", "READONLY", "CLUSTERDOWN", "TRYAGAIN")) or type(error).__name__ in (
        "MovedError", "ReadOnlyError", "ClusterDownError", "TryAgainError", "AskError",
    ) or role_changed(error)


def role_changed(error):
    """Whether a waiter's error says its server stopped being a master while it waited: Redis's
    own ``UNBLOCKED force unblock from blocking operation, instance state changed (master ->
    replica?)`` (a cluster failover, ``REPLICAOF``) or the module's ``UNBLOCKED this server
    became a replica while the client waited``."""
    text = str(error)
    return text.startswith("UNBLOCKED") and ("master -> replica" in text or "became a replica" in text)


def refresh_slots(client):
    """Read the cluster's slot table again (sync ``RedisCluster``); errors are dropped: the
    next look-up finds out."""
    manager = getattr(client, "nodes_manager", None)
    if manager is not None:
        try:
            manager.initialize()
        except Exception:  # noqa: BLE001 - every startup node unreachable: try again later
            pass


async def arefresh_slots(client):
    """``refresh_slots`` for an asyncio ``RedisCluster``."""
    manager = getattr(client, "nodes_manager", None)
    if manager is not None:
        try:
            await manager.initialize()
        except Exception:  # noqa: BLE001
            pass


# --- durable grants ------------------------------------------------------------------

#: The first server whose ``WAIT`` after a blocked command counts the grant another client's
#: action made (``c->woff`` set on unblock): Redis 7.0.12.
DURABLE_MIN_VERSION = (7, 0, 12)


def durable_supported(info_server):
    """Whether ``INFO server`` (a dict) names a server where ``durable`` is sound."""
    version = str(info_server.get("redis_version", "0"))
    parts = tuple(int(p) for p in version.split(".")[:3] if p.isdigit())
    return parts >= DURABLE_MIN_VERSION


def check_durable(info_server):
    """Raise unless ``INFO server`` (a dict) names a server where ``durable`` is sound."""
    if not durable_supported(info_server):
        raise durable_refused(info_server)


def durable_refused(info_server):
    return LockError(
        "durable grants need Redis 7.0.12 or later (a WAIT after a blocked grant counts it "
        f"there); this server is {info_server.get('redis_version', 'unknown')}"
    )


# --- sync ----------------------------------------------------------------------------


def _closed_under_us(error, conn=None):
    """Whether ``error`` is redis-py failing on a connection that another thread disconnected
    during the call: redis-py's cluster client resets a failed node's pool, connections in use
    included, and a read then fails on the closed buffer or the absent socket (``ValueError: I/O
    operation on closed file`` in redis-py 5.0 and 8.1; in a new connection's handshake,
    ``AttributeError: 'NoneType' object has no attribute 'readline'``), not ConnectionError."""
    if not isinstance(error, (ValueError, AttributeError)):
        return False
    text = str(error)
    return (
        "closed file" in text
        or "'NoneType' object has no attribute" in text
        or (conn is not None and _socket(conn) is None)
    )


def _lost(error):
    return ConnectionError(f"the connection was closed during the call ({error})")


def _get(pool):
    try:
        if _takes_command_name(pool.get_connection):
            return pool.get_connection("LOCK.ACQUIRE")
        return pool.get_connection()
    except (ValueError, AttributeError) as e:
        # A new connection's handshake met the same reset (seen under load, redis-py 5.0.8).
        if _closed_under_us(e):
            raise _lost(e) from e
        raise


def _read(conn, timeout):
    """One reply, read with ``timeout`` seconds (None: no limit) instead of the socket timeout."""
    sock = _socket(conn)
    if sock is None:
        raise ConnectionError("redislock_native: this connection class has no socket to time")
    sock.settimeout(timeout)
    try:
        return conn.read_response(disconnect_on_error=False)
    except (ValueError, AttributeError) as e:
        # Without this a cluster waiter did not queue again on the new master after a failover.
        if _closed_under_us(e, conn):
            raise _lost(e) from e
        raise
    finally:
        sock = _socket(conn)
        if sock is not None:
            sock.settimeout(conn.socket_timeout)


def call_timed(client, args, timeout):
    """Send ``args`` on a pooled connection and read the reply within ``timeout`` s, no retry."""
    pool = client.connection_pool
    conn = _get(pool)
    try:
        conn.send_command(*args)
        return _read(conn, timeout)
    except ResponseError:
        raise
    except BaseException:
        conn.disconnect()
        raise
    finally:
        pool.release(conn)


def acquire_blocking(client, args, wait_s, cleanup, durable=None):
    """``LOCK.ACQUIRE`` with ``BLOCK``: one command, read whatever the socket timeout.

    ``cleanup()`` gives a possible grant back; it is called when the outcome is unknown
    (no reply in time, connection lost) or the caller was interrupted while waiting.

    ``durable``: ``(replicas, timeout_ms)``. After a grant, ``WAIT replicas timeout_ms`` on
    the same connection (a ``WAIT`` counts the writes of its own connection, and on 7.0.12+ a
    blocked grant's too); the reply is then ``(reply, acknowledged)``.
    """
    pool = client.connection_pool
    conn = _get(pool)
    reusable = False
    try:
        conn.send_packed_command(conn.pack_commands([("CLIENT", "ID"), args]))
        client_id = None
        try:
            client_id = _client_id(lambda: _read(conn, conn.socket_timeout))
            reply = _read(conn, read_timeout(conn, wait_s))
            if durable is not None:
                acked = 0
                if isinstance(reply, (int, list)):
                    conn.send_command("WAIT", *durable)
                    acked = _read(conn, read_timeout(conn, durable[1] / 1000))
                reply = (reply, acked)
        except ResponseError:
            reusable = True
            raise
        except (TimeoutError, ConnectionError, OSError):
            conn.disconnect()
            _quietly(cleanup)
            raise
        except BaseException:  # KeyboardInterrupt, SystemExit: take the waiter out cleanly
            reusable = _unblock(client, conn, client_id, cleanup)
            if not reusable:
                conn.disconnect()
                _quietly(cleanup)
            raise
        reusable = True
        return reply
    finally:
        if not reusable:
            conn.disconnect()
        pool.release(conn)


def _client_id(read, **kwargs):
    """The reply to the pipelined ``CLIENT ID``, or None if it was refused (ACL)."""
    try:
        return read(**kwargs)
    except ResponseError:
        return None


def _unblock(client, conn, client_id, cleanup):
    """Answer the waiter now (``CLIENT UNBLOCK``) and give back a grant that beat it.

    True if the waiter's reply was read (the connection is clean) and any grant released.
    """
    if client_id is None:
        return False
    try:
        client.execute_command("CLIENT", "UNBLOCK", client_id)
        reply = _read(conn, conn.socket_timeout or _UNBLOCKED_REPLY_TIMEOUT)
    except Exception:
        return False
    if isinstance(reply, (int, list)):  # a token (LOCK.ACQUIRE) or tokens (LOCK.MACQUIRE)
        _quietly(cleanup)
    return reply is None or isinstance(reply, (int, list))


def succeeds(fn):
    """``fn()``; True unless it raised (the error is dropped, as in ``_quietly``)."""
    try:
        fn()
        return True
    except Exception:
        return False


def _quietly(fn):
    try:
        fn()
    except Exception:
        pass


# --- asyncio -------------------------------------------------------------------------


async def _aget(pool):
    if _takes_command_name(pool.get_connection):
        return await pool.get_connection("LOCK.ACQUIRE")
    return await pool.get_connection()


async def within(awaitable, timeout):
    """``await awaitable`` within ``timeout`` seconds, else TimeoutError (redis-py's).

    Not ``asyncio.wait_for``: before Python 3.12 it swallows a cancellation of its caller that
    arrives in the instant the awaited call completes (it returns the result instead; CPython
    gh-86296). A keepalive task cancelled by ``close()`` just as a reply came in then went on
    sending keepalives, and ``close()`` waited for it for ever (issue 28's hang of
    test_async_one_keepalive_task_keeps_holds). Here a cancellation always propagates; the
    awaited call is cancelled with it, and its reply, if it had one, is dropped (every caller
    then closes the connection or gives a possible grant back)."""
    task = asyncio.ensure_future(awaitable)
    try:
        done, _ = await asyncio.wait({task}, timeout=timeout)
    except BaseException:
        task.cancel()
        raise
    if not done:
        task.cancel()
        await asyncio.wait({task})
        raise TimeoutError(f"no reply within {timeout:.3f} s")
    return task.result()


async def astop(task):
    """Cancel ``task`` (a keepalive or watchdog loop) and return once it has ended.

    One ``cancel()`` is not enough: ``asyncio.wait_for`` before Python 3.12 swallows a
    cancellation that lands in the instant the call it wraps completes, and redis-py wraps its
    writes in it (``send_packed_command``). The loop then runs on, and an ``await task`` waits
    for ever (issue 28: a session's close() hung so while its task kept the session alive). So
    the task is cancelled again until it is done; a swallowed cancellation leaves it running
    only to its next await. A cancellation of the caller propagates (the task is cancelled
    all the same)."""
    while not task.done():
        task.cancel()
        await asyncio.wait({task}, timeout=_RECANCEL_S)
    if not task.cancelled():
        task.result()  # the task's own exception, if it ended with one


async def _aread(conn, timeout):
    """One reply within ``timeout`` seconds (None: no limit); on a timeout, TimeoutError."""
    read = conn.read_response(timeout=_FOREVER, disconnect_on_error=False)
    if timeout is None:
        return await read
    return await within(read, timeout)


async def acall_timed(client, args, timeout):
    """Send ``args`` on a pooled connection and read the reply within ``timeout`` s, no retry."""
    pool = client.connection_pool
    conn = await _aget(pool)
    try:
        await conn.send_command(*args)
        return await _aread(conn, timeout)
    except ResponseError:
        raise
    except BaseException:
        await conn.disconnect()
        raise
    finally:
        await pool.release(conn)


async def aacquire_blocking(client, args, wait_s, cleanup, durable=None):
    """The asyncio ``acquire_blocking``; ``cleanup`` is a coroutine function.

    A cancelled wait is unblocked and any grant given back before ``CancelledError``
    propagates. That runs in a task of its own, shielded, so a second cancellation
    cannot cut it short (the caller then stops waiting for it, but it still finishes).
    """
    pool = client.connection_pool
    conn = await _aget(pool)
    owned = True  # this function gives the connection back to the pool
    reusable = False
    try:
        await conn.send_packed_command(conn.pack_commands([("CLIENT", "ID"), args]))
        client_id = None
        try:
            client_id = await _aclient_id(conn)
            reply = await _aread(conn, read_timeout(conn, wait_s))
            if durable is not None:
                acked = 0
                if isinstance(reply, (int, list)):
                    await conn.send_command("WAIT", *durable)
                    acked = await _aread(conn, read_timeout(conn, durable[1] / 1000))
                reply = (reply, acked)
        except ResponseError:
            reusable = True
            raise
        except (TimeoutError, ConnectionError, OSError):
            await conn.disconnect()
            await _aquietly(cleanup)
            raise
        except BaseException:  # asyncio.CancelledError above all
            owned = False
            await asyncio.shield(
                asyncio.ensure_future(_aunblock(client, pool, conn, client_id, cleanup))
            )
            raise
        reusable = True
        return reply
    finally:
        if owned:
            if not reusable:
                await conn.disconnect()
            await pool.release(conn)


async def _aclient_id(conn):
    try:
        return await conn.read_response(disconnect_on_error=False)
    except ResponseError:
        return None


async def _aunblock(client, pool, conn, client_id, cleanup):
    """The asyncio ``_unblock``; also gives the connection back to the pool."""
    try:
        reply = "unknown"
        if client_id is not None:
            try:
                await client.execute_command("CLIENT", "UNBLOCK", client_id)
                reply = await _aread(conn, conn.socket_timeout or _UNBLOCKED_REPLY_TIMEOUT)
            except Exception:
                pass
        if reply is None:
            return
        if not isinstance(reply, (int, list)):  # not a token (or tokens): unknown state
            await conn.disconnect()
        await _aquietly(cleanup)
    finally:
        await pool.release(conn)


async def asucceeds(fn):
    """The asyncio ``succeeds``; ``fn`` is a coroutine function."""
    try:
        await fn()
        return True
    except Exception:
        return False


async def _aquietly(fn):
    try:
        await fn()
    except Exception:
        pass
