"""pytest fixtures: real redis-server processes with the module loaded, on OS-chosen ports.

The Python counterpart of tests/common/mod.rs (same environment variables, same
settings): each server runs in its own temporary directory, bound to 127.0.0.1,
on a port the OS picked (probed, then retried a few times if another process
took it first), and is killed at the end. Tests wait on observable state
(``blocked_clients``), never on fixed sleeps.

- ``REDIS_SERVER``: the server binary (default /usr/bin/redis-server, else PATH).
- ``REDIS_LOCK_MODULE``: the module (default <repo>/target/debug/libredis_lock.so).
"""

import os
import shutil
import socket
import subprocess
import tempfile
import time
import uuid
from pathlib import Path

import pytest
import redis

REPO = Path(__file__).resolve().parents[2]
READY_TIMEOUT = 10.0
PORT_ATTEMPTS = 5


def server_binary():
    env = os.environ.get("REDIS_SERVER")
    if env:
        return env
    if os.access("/usr/bin/redis-server", os.X_OK):
        return "/usr/bin/redis-server"
    return shutil.which("redis-server") or "redis-server"


def module_path():
    return Path(os.environ.get("REDIS_LOCK_MODULE", REPO / "target/debug/libredis_lock.so"))


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """One redis-server with the module; ``client()`` / ``aclient()`` make clients for it."""

    def __init__(self):
        module = module_path()
        if not module.is_file():
            raise RuntimeError(f"module not found at {module} (run `cargo build`, or set REDIS_LOCK_MODULE)")
        self.dir = Path(tempfile.mkdtemp(prefix="redis-lock-py-"))
        for attempt in range(1, PORT_ATTEMPTS + 1):
            self.port = free_port()
            self.proc = subprocess.Popen(
                [server_binary(), "--port", str(self.port), "--bind", "127.0.0.1",
                 "--dir", str(self.dir), "--logfile", str(self.dir / "logfile"),
                 "--save", "", "--appendonly", "no", "--loadmodule", str(module)],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            )
            if self._wait_ready():
                return
            if "Address already in use" not in self.log():
                break
        raise RuntimeError(f"redis-server did not start:\n{self.log()}")

    def _wait_ready(self):
        deadline = time.monotonic() + READY_TIMEOUT
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                return False
            try:
                if redis.Redis(port=self.port, socket_timeout=1).ping():
                    return True
            except redis.ConnectionError:
                time.sleep(0.02)
        self.proc.kill()
        self.proc.wait()
        return False

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
        self.proc.kill()
        self.proc.wait()
        shutil.rmtree(self.dir, ignore_errors=True)


@pytest.fixture(scope="session")
def server():
    s = Server()
    yield s
    s.stop()


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
