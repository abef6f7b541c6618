"""The Python blocks of every Markdown file in the repository run as pasted, so the docs cannot
drift from the package.

Every ```python block of README.md, docs/, the clients' READMEs and any other ``*.md`` (new ones
included: nothing lists them) runs against a server of its own, with ``REDIS_URL`` set to it (the
blocks read it, and fall back to ``make run``'s localhost:6379 without it), ``REDIS_CLUSTER_URL``
to a test cluster, and three test servers in place of a Redlock block's ``(6379, 6380, 6381)``. A
block is left out only when the nearest non-blank line before it is ``<!-- not run: why -->``. A
failing block's traceback names its Markdown file and line (the code is compiled with the file's
name and at its own line numbers). What some blocks print is checked too."""

import re
from pathlib import Path

import pytest

from conftest import REPO, Server

# The blocks use fixed key names: each gets its own server.
pytestmark = pytest.mark.own_server

SKIP_DIRS = {".git", "node_modules", "target"}
FENCE = re.compile(r"^\s*(`{3,}|~{3,})\s*([^\s`]*)")
NOT_RUN = re.compile(r"^<!--\s*not run:\s*(.*?)\s*-->$")


def markdown_files():
    """Every ``*.md`` under the repository (relative paths, sorted)."""
    return sorted(
        str(p.relative_to(REPO)) for p in REPO.rglob("*.md")
        if not any(part in SKIP_DIRS or part.startswith(".") for part in p.relative_to(REPO).parts[:-1]))


def blocks(path):
    """(line of the opening fence, language, code, not-run reason or None) of each fenced block."""
    lines = (REPO / path).read_text().split("\n")
    out, i = [], 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        j = i + 1
        while j < len(lines) and not lines[j].lstrip().startswith(m.group(1)):
            j += 1
        k = i - 1
        while k >= 0 and not lines[k].strip():
            k -= 1
        note = NOT_RUN.match(lines[k].strip()) if k >= 0 else None
        lang = m.group(2).split(",")[0].lower()
        out.append((i + 1, lang, "\n".join(lines[i + 1:j]) + "\n", note and note.group(1)))
        i = j + 1
    return out


PYTHON = [(path, line, code) for path in markdown_files()
          for line, lang, code, skip in blocks(path) if lang in ("python", "py", "python3") and not skip]


def test_the_blocks_are_found():
    assert len(PYTHON) >= 15, PYTHON


@pytest.mark.parametrize("path,line,code", PYTHON, ids=[f"{p}:{n}" for p, n, _ in PYTHON])
def test_python_block_runs(path, line, code, server, request, monkeypatch, capsys):
    # A client made without REDIS_URL would find no server here, or another one: fail instead.
    assert not re.search(r"\bRedis\(\s*\)", code), \
        f"{path}:{line}: a client made without REDIS_URL (redis.Redis.from_url(os.environ.get(\"REDIS_URL\", ...)))"
    monkeypatch.setenv("REDIS_URL", f"redis://127.0.0.1:{server.port}")
    others = []
    if "RedisCluster" in code:
        cluster = request.getfixturevalue("cluster")
        monkeypatch.setenv("REDIS_CLUSTER_URL", f"redis://127.0.0.1:{cluster.ports[0]}")
        code += "rc.close()\n"
    if "(6379, 6380, 6381)" in code:  # Redlock over three masters: this server and two more
        others = [Server(), Server()]
        request.addfinalizer(lambda: [s.stop() for s in others])
        code = code.replace("(6379, 6380, 6381)", f"({server.port}, {others[0].port}, {others[1].port})")
    # Compiled at the block's own lines of the Markdown file, so a traceback names file:line.
    exec(compile("\n" * line + code, str(REPO / path), "exec"), {"__name__": "readme"})
    out = capsys.readouterr().out
    if "Redlock(masters" in code:
        assert re.fullmatch(r"valid for [\d.]+ s; tokens \[\d+, \d+, \d+\]\n", out)
    if "Election(r, \"scheduler\", session=session)" in code:  # the README's election: a term
        assert re.fullmatch(r"\d+\n", out)
        assert server.client().get("scheduler:config") == b"v2"
    if "Election(r, \"scheduler\")" in code:
        assert out == "None\nworker-a:8080\nTrue\nNone\n"
    if "on_lost=on_session_lost" in code:  # the session ran to its end, never lost
        assert re.fullmatch(r"held with fencing token \d+\n", out)
    if "LOCKDELAY" in code and "Session(" in code:
        assert out == "1\n"
    if "{invoice:42}:default" in code:  # the default session's serial is on the hold
        assert out == "True\n"
    if "NotDurableError" in code:  # no replica here: the grant was given back
        assert out == "0 True\n"
