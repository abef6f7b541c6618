"""pytest fixtures: real redis-server processes with the module loaded.

The servers are started by the workspace's harness (``harness/``, the same Rust code that
starts the Rust tests' servers) through its ``harness`` program: ``harness server`` prints one
JSON line (port, pid, directory) and keeps the server running until its standard input closes.
So each server runs in its own temporary directory, bound to 127.0.0.1, on a port the OS
picked, ready once it answered PING, and is killed at the end. Tests wait on observable state
(``blocked_clients``), never on fixed sleeps.

- ``HARNESS``: the harness program (default <repo>/target/debug/harness; ``make test-python``
  builds it, or ``cargo build -p redis-lock-harness``).
- ``REDIS_SERVER``, ``REDIS_LOCK_MODULE``: the server binary and the module, read by the harness
  (see harness/README.md).
"""

import json
import os
import subprocess
import time
import uuid
from pathlib import Path

import pytest
import redis

REPO = Path(__file__).resolve().parents[3]


def harness_program():
    program = Path(os.environ.get("HARNESS", REPO / "target/debug/harness"))
    if not os.access(program, os.X_OK):
        raise RuntimeError(f"no harness program at {program} (run `cargo build -p redis-lock-harness`, or set HARNESS)")
    return program


class Process:
    """The server process, by pid (the harness is its parent)."""

    def __init__(self, pid):
        self.pid = pid

    def send_signal(self, sig):
        os.kill(self.pid, sig)


class Server:
    """One redis-server with the module; ``client()`` / ``aclient()`` make clients for it.

    ``args`` go to ``harness server`` (e.g. ``"--", "--appendonly", "yes"``)."""

    def __init__(self, *args):
        self._harness = subprocess.Popen(
            [harness_program(), "server", *args], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        line = self._harness.stdout.readline()
        if not line:
            raise RuntimeError(f"the harness did not start a server (exit status {self._harness.wait()})")
        started = json.loads(line)
        self.port = started["port"]
        self.dir = Path(started["dir"])
        self.proc = Process(started["pid"])

    def log(self):
        try:
            return (self.dir / "logfile").read_text()
        except OSError:
            return ""

    def client(self, **kwargs):
        return redis.Redis(port=self.port, **kwargs)

    def aclient(self, **kwargs):
        import redis.asyncio

        return redis.asyncio.Redis(port=self.port, **kwargs)

    def stop(self):
        self._harness.stdin.close()
        self._harness.wait(timeout=60)


class Cluster:
    """A Redis Cluster with the module on every node (``harness cluster``); ``ports`` of its nodes."""

    def __init__(self, masters=3, replicas=0):
        self._harness = subprocess.Popen(
            [harness_program(), "cluster", "--masters", str(masters), "--replicas", str(replicas)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        line = self._harness.stdout.readline()
        if not line:
            raise RuntimeError(f"the harness did not start a cluster (exit status {self._harness.wait()})")
        nodes = json.loads(line)["nodes"]
        self.ports = [node["port"] for node in nodes]
        self.pids = {node["port"]: node["pid"] for node in nodes}  # to kill a node (failover tests)

    def client(self, **kwargs):
        return redis.RedisCluster(host="127.0.0.1", port=self.ports[0], **kwargs)

    def aclient(self, **kwargs):
        import redis.asyncio.cluster

        return redis.asyncio.cluster.RedisCluster(host="127.0.0.1", port=self.ports[0], **kwargs)

    def stop(self):
        self._harness.stdin.close()
        self._harness.wait(timeout=60)


def pytest_configure(config):
    config.addinivalue_line(
        "markers",
        "own_server: the test changes server-wide state (configs, ACL users, flushes, command "
        "stats) or asserts on it, so it gets a server of its own instead of the shared one",
    )


# What a test must not change on the shared server: it would change what the tests after it
# see. The sentinel key goes with any flush.
SENTINEL = "conftest:shared-server-sentinel"
WATCHED_CONFIGS = ("timeout", "notify-keyspace-events", "maxmemory", "lock.*")


def server_wide_state(client):
    configs = {}
    for pattern in WATCHED_CONFIGS:
        configs.update(client.config_get(pattern))
    return {
        "configs": configs,
        "ACL users": sorted(client.acl_users()),
        "the keyspace (a flush)": client.exists(SENTINEL),
    }


@pytest.fixture(scope="session")
def shared_server():
    s = Server()
    s.client().set(SENTINEL, 1)
    yield s
    s.stop()


@pytest.fixture
def server(request):
    """The server a test talks to. Tests that change no server-wide state share one; a test
    marked ``own_server`` gets its own, started for it and stopped after it. A test on the
    shared server that changes configs, ACL users or the keyspace as a whole, or resets the
    command stats, fails at teardown, naming what it changed: mark it ``own_server``."""
    if request.node.get_closest_marker("own_server") is not None:
        s = Server()
        yield s
        s.stop()
        return
    s = request.getfixturevalue("shared_server")
    c = s.client()
    before = server_wide_state(c)
    commands_before = c.info("stats")["total_commands_processed"]
    yield s
    after = server_wide_state(c)
    changed = [what for what in before if before[what] != after[what]]
    if c.info("stats")["total_commands_processed"] < commands_before:
        changed.append("the command stats (CONFIG RESETSTAT)")
    c.close()
    assert not changed, (
        f"this test changed {', '.join(changed)} on the shared server: mark it "
        "@pytest.mark.own_server")


@pytest.fixture(scope="session")
def cluster():
    """A 3-master cluster (no replicas), started on first use and shared."""
    c = Cluster(masters=3, replicas=0)
    yield c
    c.stop()


@pytest.fixture
def r(server):
    """A plain client of the shared server (redis-py's defaults: timeouts and retries)."""
    c = server.client()
    yield c
    c.close()


@pytest.fixture
def key():
    """A key no other test uses."""
    return f"test:{uuid.uuid4().hex[:12]}"


# --- waiting on observable state --------------------------------------------------------


def wait_until(what, predicate, timeout=10.0):
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.005)


async def await_until(what, predicate, timeout=10.0):
    """``wait_until`` for asyncio tests: yields to the event loop between looks."""
    import asyncio

    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.005)


def waiters(client, key):
    """How many clients are queued on ``key`` (LOCK.INFO's ``waiters``; 0 when free)."""
    info = client.execute_command("LOCK.INFO", key)
    if info is None:
        return 0
    fields = dict(zip(info[::2], info[1::2])) if isinstance(info, list) else info
    return fields.get(b"waiters", fields.get("waiters"))


def wait_waiters(client, key, n):
    wait_until(f"{n} waiter(s) on {key}", lambda: waiters(client, key) == n)


def command_calls(client, command):
    """``INFO commandstats`` calls of ``command`` (e.g. "lock.acquire"); 0 if never called."""
    stats = client.info("commandstats")
    return stats.get(f"cmdstat_{command}", {}).get("calls", 0)


# --- a hung asyncio test shows where its tasks wait -----------------------------------------
#
# pytest-timeout's "thread" method (pyproject.toml) prints every thread's stack, but an asyncio
# test that hangs shows only its event loop waiting in select(). One second before that timeout,
# this prints each running loop's tasks with the chain of coroutines each one is suspended in
# (read from another thread: a best-effort snapshot, enough to name the await that never ends).

_task_dumps = {}


def _coroutine_chain(coro):
    lines = []
    while coro is not None:
        frame = getattr(coro, "cr_frame", None) or getattr(coro, "gi_frame", None)
        if frame is not None:
            lines.append(f"    {frame.f_code.co_filename}:{frame.f_lineno} in {frame.f_code.co_name}")
        coro = getattr(coro, "cr_await", None) or getattr(coro, "gi_yieldfrom", None)
    return lines


def _dump_asyncio_tasks(nodeid):
    import asyncio
    import gc
    import sys

    out = [f"\n+++ asyncio tasks of {nodeid} (pytest-timeout ends it in 1 s) +++"]
    for loop in [o for o in gc.get_objects() if isinstance(o, asyncio.AbstractEventLoop) and o.is_running()]:
        for task in list(asyncio.all_tasks(loop)):
            out.append(f"  {task!r}")
            out.extend(_coroutine_chain(task.get_coro()))
    sys.stderr.write("\n".join(out) + "\n")
    sys.stderr.flush()


@pytest.hookimpl(optionalhook=True)  # a hook of pytest-timeout: nothing without it
def pytest_timeout_set_timer(item, settings):
    import threading

    if settings.timeout and settings.timeout > 1:
        timer = threading.Timer(settings.timeout - 1, _dump_asyncio_tasks, args=(item.nodeid,))
        timer.daemon = True
        timer.start()
        _task_dumps[item.nodeid] = timer
    # None: pytest-timeout sets its own timer as well.


@pytest.hookimpl(optionalhook=True)
def pytest_timeout_cancel_timer(item):
    timer = _task_dumps.pop(item.nodeid, None)
    if timer is not None:
        timer.cancel()
