"""The lock metrics in Prometheus (issue 32): the real oliver006/redis_exporter, given
``docs/prometheus/redis-lock.lua`` with ``--script``, scrapes a server with the module, and its
``/metrics`` has every numeric ``INFO lock`` field by name; every query of the Grafana dashboard
(``docs/grafana/redis-lock.json``) names series the exporter emits.

The exporter is built once from the Go module proxy (``go``; cached as
``target/tools/redis_exporter``, or ``REDIS_EXPORTER`` names a binary). Without ``go`` and without
a cached binary the test is skipped, saying why.
"""

import fcntl
import json
import os
import re
import shutil
import socket
import subprocess
import tempfile
import threading
import time
import urllib.request

import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from conftest import REPO, Server, wait_until

EXPORTER_VERSION = "v1.88.0"
EXPORTER_MODULE = "github.com/oliver006/redis_exporter"
SCRIPT = REPO / "docs/prometheus/redis-lock.lua"
DASHBOARD = REPO / "docs/grafana/redis-lock.json"


def exporter_binary():
    """The exporter binary: REDIS_EXPORTER, the cached build, or a new build (go)."""
    named = os.environ.get("REDIS_EXPORTER")
    if named:
        return named
    cached = REPO / "target/tools/redis_exporter"
    if os.access(cached, os.X_OK):
        return str(cached)
    go = shutil.which("go")
    if go is None:
        pytest.skip(f"go is not installed and {cached} does not exist: cannot build "
                    f"{EXPORTER_MODULE}@{EXPORTER_VERSION} (set REDIS_EXPORTER to a binary)")
    cached.parent.mkdir(parents=True, exist_ok=True)
    # `make test` runs the suite twice side by side (redis-py 8.1 and 5.0) and `make
    # test-servers` three times: one builds, the others wait for it under the lock.
    with open(cached.with_name("redis_exporter.lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if os.access(cached, os.X_OK):
            return str(cached)
        # `go install module@version` also asks the proxy for the module's version list, which
        # the project's proxy refuses; downloading the one version and building it in place
        # does not.
        with tempfile.TemporaryDirectory() as scratch:
            subprocess.run([go, "mod", "init", "example.com/exporterbuild"], cwd=scratch,
                           check=True, capture_output=True)
            got = subprocess.run(
                [go, "mod", "download", "-json", f"{EXPORTER_MODULE}@{EXPORTER_VERSION}"],
                cwd=scratch, check=True, capture_output=True, text=True)
            source = json.loads(got.stdout)["Dir"]
        building = cached.with_name(f"redis_exporter.{os.getpid()}")
        subprocess.run([go, "build", "-o", str(building), "."], cwd=source, check=True, timeout=900)
        os.replace(building, cached)
    return str(cached)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Exporter:
    """redis_exporter scraping ``port`` with the lock script, on a port of its own."""

    def __init__(self, binary, port):
        for _ in range(3):
            self.url = f"http://127.0.0.1:{free_port()}/metrics"
            self.proc = subprocess.Popen(
                [binary, "--redis.addr", f"redis://127.0.0.1:{port}",
                 "--web.listen-address", self.url.split("/")[2],
                 "--script", str(SCRIPT), "--lua-script-read-only"],
                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
            if self._answers():
                return
            self.stop()
        raise AssertionError("redis_exporter did not start (its port taken three times?)")

    def _answers(self):
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                return False
            try:
                urllib.request.urlopen(self.url, timeout=2).read()
                return True
            except OSError:
                time.sleep(0.05)
        return False

    def scrape(self):
        """{(metric, key label or None): value} of one scrape."""
        text = urllib.request.urlopen(self.url, timeout=10).read().decode()
        series = {}
        for line in text.splitlines():
            if line.startswith("#") or not line.strip():
                continue
            m = re.match(r'^([a-zA-Z_:][\w:]*)(\{[^}]*\})?\s+(\S+)$', line)
            if not m:
                continue
            key = re.search(r'key="([^"]*)"', m.group(2) or "")
            series[(m.group(1), key.group(1) if key else None)] = float(m.group(3))
        return series

    def stop(self):
        self.proc.kill()
        self.proc.wait()


@pytest.fixture(scope="module")
def scraped():
    """One server with the module, some lock traffic on it, and the exporter scraping it:
    (the INFO lock fields, a scrape, the exporter)."""
    binary = exporter_binary()
    server = Server()
    exporter = None
    try:
        c = server.client()
        nobody_retries = redis.Redis(port=server.port, retry=Retry(NoBackoff(), 0))
        assert c.execute_command("LOCK.ACQUIRE", "m:a", "holder", 60000) > 0
        got = {}
        waiter = threading.Thread(target=lambda: got.update(
            token=nobody_retries.execute_command("LOCK.ACQUIRE", "m:a", "next", 60000, "BLOCK", 10000)))
        waiter.start()
        wait_until("the waiter to block", lambda: c.info("clients")["blocked_clients"] == 1)
        assert c.execute_command("LOCK.RELEASE", "m:a", "holder") == 1
        waiter.join()
        assert got["token"] > 0
        assert c.execute_command("LOCK.RELEASE", "m:a", "next") == 1
        sid = c.execute_command("LOCK.SESSION", "OPEN", 30000)
        c.execute_command("LOCK.ACQUIRE", "m:b", "s", 0, "SESSION", sid)
        info = c.info("lock")
        exporter = Exporter(binary, server.port)
        yield info, exporter.scrape(), exporter
    finally:
        if exporter is not None:
            exporter.stop()
        server.stop()


@pytest.mark.own_server
# The first run builds the exporter (about 1.5 min here, more under load), or waits for the
# suite beside it that does: longer than the suite's 120 s per test.
@pytest.mark.timeout(1200)
def test_the_exporter_exports_every_numeric_lock_field_by_name(scraped):
    info, series, _ = scraped
    assert series[("redis_up", None)] == 1
    assert series[("redis_script_result", None)] == 1, "the lock script ran"
    numeric = {k: v for k, v in info.items() if isinstance(v, int)}
    # Every field but the two count=..,mean=.. summaries.
    assert sorted(set(info) - set(numeric)) == ["lock_hold_ms", "lock_wait_ms"]
    exported = {key: v for (metric, key), v in series.items() if metric == "redis_script_values"}
    assert sorted(exported) == sorted(numeric)
    for name in ["lock_acquired", "lock_handed_off", "lock_released", "lock_sessions",
                 "lock_wait_ms_count", "lock_wait_ms_le_inf", "lock_hold_ms_count"]:
        assert exported[name] == numeric[name], name
    assert exported["lock_acquired"] == 3
    assert exported["lock_handed_off"] == 1
    assert exported["lock_sessions"] == 1
    assert exported["lock_locks"] == 1
    assert exported["lock_wait_ms_count"] == 1 == exported["lock_wait_ms_le_inf"]
    assert exported["lock_hold_ms_count"] == 2
    # Cumulative buckets never go down.
    for name in ("wait", "hold"):
        buckets = [exported[f"lock_{name}_ms_le_{b}"] for b in
                   (1, 5, 10, 50, 100, 500, 1000, 5000, 10000, 60000)] + [exported[f"lock_{name}_ms_le_inf"]]
        assert buckets == sorted(buckets), (name, buckets)


def dashboard_queries():
    dashboard = json.loads(DASHBOARD.read_text())
    return [t["expr"] for p in dashboard["panels"] for t in p["targets"]]


@pytest.mark.own_server
@pytest.mark.timeout(1200)
def test_every_dashboard_query_names_series_the_exporter_emits(scraped):
    _, series, _ = scraped
    metrics = {metric for metric, _ in series}
    keys = {key for metric, key in series if metric == "redis_script_values"}
    queries = dashboard_queries()
    assert len(queries) >= 10
    functions = {"rate", "sum", "by", "histogram_quantile", "label_replace"}
    for expr in queries:
        # Label values and strings are not metric names.
        bare = re.sub(r'"[^"]*"', '""', expr)
        bare = re.sub(r'\{[^}]*\}', '', bare)
        bare = re.sub(r'\[[^\]]*\]', '', bare)
        names = set(re.findall(r'[a-zA-Z_][\w:]*', bare)) - functions - {"instance", "le"}
        assert names, expr
        for name in names:
            assert name in metrics, f"{name} in {expr!r} is not in /metrics"
        for op, value in re.findall(r'key(=~|=)"([^"]*)"', expr):
            matching = [k for k in keys if (re.fullmatch(value, k) if op == "=~" else k == value)]
            assert matching, f"key{op}{value!r} in {expr!r} matches no exported key"
