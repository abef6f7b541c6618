"""The Python snippets of README.md and clients/python/README.md run as written (on the test
server's port instead of 6379), so the docs cannot drift from the package."""

import re

import pytest

from conftest import REPO, Server

# The snippets use fixed key names: each test flushes its own server first.
pytestmark = pytest.mark.own_server


def snippets(path):
    return re.findall(r"```python\n(.*?)```", (REPO / path).read_text(), re.S)


def run(server, code, prelude=""):
    server.client().flushall()  # the snippets use fixed key names
    port = f"port={server.port}"
    code = code.replace("redis.Redis()", f"redis.Redis({port})")
    code = code.replace("redis.asyncio.Redis()", f"redis.asyncio.Redis({port})")
    exec(compile(prelude + code, "<readme>", "exec"), {"__name__": "readme"})


def test_readme_from_python(server, capsys):
    first, election = [s for s in snippets("README.md") if "redislock_native" in s]
    run(server, first)
    assert re.fullmatch(r"token \d+\n", capsys.readouterr().out)
    # The leader-election snippet: a term, the fenced write's reply, then the leader resigns.
    run(server, election)
    assert re.fullmatch(r"\d+\n", capsys.readouterr().out)
    assert server.client().get("{scheduler}:config") == b"v2"


PRELUDE = "import redis\nfrom redislock_native import Lock\nr = redis.Redis()\n"


@pytest.mark.parametrize("index", range(len(snippets("clients/python/README.md"))))
def test_package_readme_snippets(server, index, capsys, request):
    code = snippets("clients/python/README.md")[index]
    if "port=7000)" in code:
        cluster = request.getfixturevalue("cluster")
        code = code.replace("port=7000)", f"port={cluster.ports[0]})")
        run(server, code + "rc.close()\n", PRELUDE.replace("redis.Redis()", f"redis.Redis(port={server.port})"))
        return
    if "lock.fenced(" in code and "Lock(r" not in code:
        # The fencing snippet continues from a held lock.
        prelude = PRELUDE + "lock = Lock(r, '{invoice:42}', ttl=30)\nassert lock.acquire()\n"
        run(server, code, prelude.replace("redis.Redis()", f"redis.Redis(port={server.port})"))
        return
    if "def stop_working" in code:
        run(server, code + "assert lock.acquire() and lock.release()\n", PRELUDE.replace(
            "redis.Redis()", f"redis.Redis(port={server.port})"))
        return
    if "Redlock(masters" in code:
        # Three masters: the test server and two more, in place of 6379, 6380, 6381.
        others = [Server(), Server()]
        try:
            ports = f"({server.port}, {others[0].port}, {others[1].port})"
            run(server, code.replace("(6379, 6380, 6381)", ports))
        finally:
            for s in others:
                s.stop()
        assert re.fullmatch(r"valid for [\d.]+ s; tokens \[\d+, \d+, \d+\]\n", capsys.readouterr().out)
        return
    prelude = "" if "import redis" in code else PRELUDE
    run(server, code, prelude.replace("redis.Redis()", f"redis.Redis(port={server.port})"))
    if "on_lost=on_session_lost" in code:  # the session ran to its end, never lost
        assert re.fullmatch(r"held with fencing token \d+\n", capsys.readouterr().out)
    if "LOCKDELAY" in code:
        assert capsys.readouterr().out == "1\n"
    if "Election(r" in code:
        assert capsys.readouterr().out == "None\nworker-a:8080\nTrue\nNone\n"
