"""The Python snippets of README.md and clients/python/README.md run as written through a
``RedisCluster`` client too (issue 34: a new user tries them on a cluster): every snippet's
``redis.Redis()`` becomes a ``RedisCluster`` of a 3-master test cluster. Snippets about several
independent servers (Redlock), about one server's own state (``CONFIG``, ``FLUSHALL``), or the
asyncio cluster client (which offers no blocking acquire) are left to test_readme.py."""

import re

import pytest
import redis

from conftest import REPO
from redislock_native import default_session


def snippets(path):
    return re.findall(r"```python\n(.*?)```", (REPO / path).read_text(), re.S)


SKIP = ("Redlock(", "redis.asyncio", "port=7000)")
ALL = [(p, i) for p in ("README.md", "clients/python/README.md") for i, code in enumerate(snippets(p))
       if "redislock_native" in code or "Lock(" in code or "lock." in code]


def run(cluster, code, monkeypatch):
    rc = redis.RedisCluster(host="127.0.0.1", port=cluster.ports[0])
    rc.flushall(target_nodes=redis.RedisCluster.PRIMARIES)  # the snippets use fixed key names
    # The snippets make their client from REDIS_URL (test_readme.py runs them as pasted): here
    # that URL names a cluster node and the client class is redis-py's cluster client.
    monkeypatch.setenv("REDIS_URL", f"redis://127.0.0.1:{cluster.ports[0]}")
    monkeypatch.setenv("REDIS_CLUSTER_URL", f"redis://127.0.0.1:{cluster.ports[0]}")
    prelude = "import redis\nfrom redislock_native import Lock\n"
    prelude += "r = redis.RedisCluster(host='127.0.0.1', port=%d)\n" % cluster.ports[0]
    code = prelude + code.replace("r = redis.Redis()", "").replace(
        "redis.Redis.from_url(", "redis.RedisCluster.from_url(")
    before = set(map(id, default_session._ALL.keys()))
    exec(compile(code, "<readme>", "exec"), {"__name__": "readme"})
    rc.close()
    # The default sessions of the clients a snippet made and did not close (redis-py keeps a
    # RedisCluster alive after its last use, so the garbage collector would not close them):
    # closed here, so that no keepalive of theirs reaches a later test's node
    # (test_session's cluster test counts every session command on each node).
    for client in list(default_session._ALL.keys()):
        if id(client) not in before:
            default_session.close_default_sessions(client)


@pytest.mark.parametrize("path,index", ALL)
def test_readme_snippet_on_a_cluster(cluster, path, index, monkeypatch):
    code = snippets(path)[index]
    if any(s in code for s in SKIP):
        pytest.skip("not a cluster snippet (several servers, or the asyncio cluster client)")
    if "lock.fenced(" in code and "Lock(r" not in code:  # it continues from a held lock
        code = "lock = Lock(r, '{invoice:42}', ttl=30)\nassert lock.acquire()\n" + code
    if "def stop_working" in code:
        code += "assert lock.acquire() and lock.release()\n"
    run(cluster, code, monkeypatch)


def test_a_fenced_write_across_slots_names_the_rule(cluster):
    from redislock_native import Lock

    rc = redis.RedisCluster(host="127.0.0.1", port=cluster.ports[0])
    lock = Lock(rc, "invoice:43", ttl=30)
    assert lock.acquire(blocking=False)
    with pytest.raises(ValueError, match=r"in a cluster both keys need one hash tag"):
        lock.fenced("SET", "invoice:43:total", 100)
    assert lock.release()
    tagged = Lock(rc, "{invoice:43}", ttl=30)
    assert tagged.acquire(blocking=False)
    assert tagged.fenced("SET", "{invoice:43}:total", 100) == b"OK"
    assert tagged.release()
    rc.close()
