"""The repository's Markdown, checked as a reader meets it: every fenced block says what it is
(a language tag), every relative link and anchor resolves, and every ``redis-cli`` session
(lines ``127.0.0.1:6379> COMMAND`` followed by the reply) gives the replies it shows when its
commands are sent to a server with the module.

Here rather than in the module's Rust tests because the Python suite already extracts the
Markdown blocks (test_readme.py) and needs no build. A session's blocks run in file order on
one server per file, so a block may continue from the one before, as the prose does; a block
preceded by ``<!-- not run: why -->`` is left out (two clients side by side, state the text
does not show). Replies are compared line by line with every number of 4 digits or more
(tokens, ttls, deadlines) read as "some number", and ``(N.NNs)`` timings dropped."""

import re
import shutil
import subprocess
import unicodedata
from pathlib import Path

import pytest

from conftest import REPO, Server
from test_readme import blocks, markdown_files

PROMPT = "127.0.0.1:6379> "
# Info strings a block may have; anything else is probably a typo that would hide a block from
# the tests that run python, js, ts and rust blocks. java, go, yaml and the rest are accepted
# but not run by any test yet.
KNOWN = {"python", "js", "ts", "mjs", "rust", "sh", "bash", "console", "toml", "text", "json",
         "lua", "java", "kotlin", "xml", "go", "yaml", "ini", "conf", "diff"}


def test_every_block_says_what_it_is():
    untagged = [f"{path}:{line} ({lang or 'no language'})" for path in markdown_files()
                for line, lang, _, _ in blocks(path) if lang not in KNOWN]
    assert not untagged, ("fenced blocks without a known language tag (```text for output, synopses "
                          "and redis-cli sessions; ```python, ```js ... are run): " + ", ".join(untagged))


# --- Links -------------------------------------------------------------------------------------

def slug(heading):
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"`|\*\*|\[([^\]]*)\]\([^)]*\)", r"\1", heading.strip()).lower()
    text = "".join(ch for ch in text if ch in " -_" or unicodedata.category(ch)[0] in "LN")
    return text.replace(" ", "-")


def anchors(path):
    seen, out = {}, set()
    text = re.sub(r"(?ms)^\s*(```|~~~).*?^\s*\1", "", path.read_text())
    for heading in re.findall(r"(?m)^#{1,6} (.+?)\s*#*$", text):
        base = slug(heading)
        n = seen.get(base, 0)
        seen[base] = n + 1
        out.add(base if n == 0 else f"{base}-{n}")
    out.update(re.findall(r'<a (?:name|id)="([^"]+)"', text))
    return out


def links(path):
    """(line, target) of each inline link outside code blocks and code spans."""
    out, fence = [], None
    for n, line in enumerate((REPO / path).read_text().split("\n"), 1):
        m = re.match(r"^\s*(`{3,}|~{3,})", line)
        if m:
            fence = None if fence and m.group(1).startswith(fence) else (fence or m.group(1))
            continue
        if fence:
            continue
        line = re.sub(r"`[^`]*`", "", line)
        out += [(n, t) for t in re.findall(r"\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)", line)]
    return out


def test_relative_links_and_anchors_resolve():
    broken = []
    for path in markdown_files():
        for line, target in links(path):
            if re.match(r"^[a-z]+:", target):
                continue  # http(s), mailto: not checked here
            file, _, anchor = target.partition("#")
            dest = (REPO / path).parent / file if file else REPO / path
            if not dest.exists():
                broken.append(f"{path}:{line}: {target} (no such file)")
            elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
                broken.append(f"{path}:{line}: {target} (no such heading)")
    assert not broken, "broken links:\n" + "\n".join(broken)


# --- redis-cli sessions ------------------------------------------------------------------------

def sessions(path):
    """(line, [(line, command, expected reply lines)]) of each redis-cli block that runs."""
    out = []
    for line, lang, code, skip in blocks(path):
        if skip or not any(l.startswith(PROMPT) for l in code.split("\n")):
            continue
        steps = []
        for n, l in enumerate(code.rstrip("\n").split("\n"), line + 1):
            if l.startswith(PROMPT):
                steps.append((n, l[len(PROMPT):], []))
            elif steps:
                steps[-1][2].append(l)
        out.append((line, steps))
    return out


SESSIONS = [path for path in markdown_files() if sessions(path)]


def normal(lines):
    text = "\n".join(lines).replace("\r", "")
    text = re.sub(r"\(\d+\.\d+s\)", "", text)
    text = re.sub(r"\d{4,}", "N", text)
    return [l.rstrip() for l in text.strip("\n").split("\n")]


def test_sessions_are_found():
    assert sum(len(sessions(p)) for p in SESSIONS) >= 5, SESSIONS


@pytest.mark.parametrize("path", SESSIONS)
def test_redis_cli_session_replies_as_shown(path):
    # Fails rather than skips: a test that cannot run must not count as a pass.
    assert shutil.which("redis-cli"), "redis-cli is not installed (Debian: redis-tools, with redis-server)"
    server = Server()
    try:
        for _, steps in sessions(path):
            for n, command, expected in steps:
                # One redis-cli per command, the line on its standard input as typed at the
                # prompt: it splits and quotes as the interactive prompt does and prints the
                # replies in the same form (--no-raw).
                got = subprocess.run(["redis-cli", "--no-raw", "-h", "127.0.0.1", "-p", str(server.port)],
                                     input=command + "\n", capture_output=True, text=True, timeout=30).stdout
                assert normal(got.split("\n")) == normal(expected), \
                    f"{path}:{n}: {command}\n  the doc shows: {expected}\n  the server said: {got.splitlines()}"
    finally:
        server.stop()
