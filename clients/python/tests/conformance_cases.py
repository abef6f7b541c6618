"""What the Python runners of the conformance suite (test_conformance.py) share: reading the
cases of <repo>/conformance/cases/, the values a case saves and compares, the outcome kind of an
exception, and the results summary written to target/conformance/<client>.json.

conformance/README.md describes the cases and their vocabulary.
"""

import json
import os
import time
from pathlib import Path

import redis
from redis.exceptions import ResponseError

from redislock_native import LockBusyError, NotDurableError, StaleTokenError

REPO = Path(__file__).resolve().parents[3]
CASES_DIR = REPO / "conformance" / "cases"
RESULTS_DIR = REPO / "target" / "conformance"

#: The longest any one step may take before the case fails (a wait the step itself bounds is
#: added on top): no case can hang its runner.
STEP_DEADLINE = 30.0

#: The `needs` this runner can meet, and how.
CLUSTER = "cluster"
REPLICA = "replica"


def load_cases():
    """Every case of every topic file, as (topic, index, case), in file order."""
    out = []
    for path in sorted(CASES_DIR.glob("*.json")):
        topic = json.loads(path.read_text())
        for i, case in enumerate(topic["cases"]):
            out.append((topic["topic"], i, case))
    return out


def case_id(item):
    topic, i, case = item
    return f"{topic}/{i}"


class Skip(Exception):
    """The runner cannot run this case: ``kind`` is "needs" (the environment lacks what the case
    needs, e.g. a replica) or "unsupported" (this client or runner cannot do a step yet)."""

    def __init__(self, kind, reason):
        super().__init__(reason)
        self.kind = kind
        self.reason = reason


class Results:
    """Per client and topic: passed / skipped / failed, and each skip's reason."""

    def __init__(self):
        self.clients = {}

    def record(self, client, topic, description, outcome, reason=None, kind=None):
        topics = self.clients.setdefault(client, {})
        t = topics.setdefault(topic, {"passed": 0, "skipped": 0, "failed": 0, "skips": [], "failures": []})
        t[outcome] += 1
        if outcome == "skipped":
            t["skips"].append({"case": description, "kind": kind, "reason": reason})
        elif outcome == "failed":
            t["failures"].append({"case": description, "error": reason})

    def write(self):
        """``<client>@redis-py-<major>.json``: `make test` runs the suite with two redis-py
        versions side by side, each its own file (conformance/check_table.py reads them all)."""
        RESULTS_DIR.mkdir(parents=True, exist_ok=True)
        variant = f"redis-py-{redis.__version__.split('.')[0]}"
        for client, topics in self.clients.items():
            summary = {
                "client": client,
                "variant": f"redis-py {redis.__version__}",
                "runner": "clients/python/tests/test_conformance.py",
                "topics": topics,
            }
            (RESULTS_DIR / f"{client}@{variant}.json").write_text(json.dumps(summary, indent=2, sort_keys=True) + "\n")


# --- values ---------------------------------------------------------------------------------


def norm(value):
    """A reply as JSON would hold it: bytes as text, lists as lists, ints, None."""
    if isinstance(value, bytes):
        return value.decode()
    if isinstance(value, (list, tuple)):
        return [norm(v) for v in value]
    if value is True:  # redis-py's response callbacks turn a +OK status into True
        return "OK"
    return value


def subst(value, variables):
    """A "$name" string is the value saved as name (a token, a term)."""
    if isinstance(value, str) and value.startswith("$"):
        if value[1:] not in variables:
            raise AssertionError(f"no saved value {value}")
        return variables[value[1:]]
    if isinstance(value, list):
        return [subst(v, variables) for v in value]
    return value


def same(got, want):
    """Replies compare as text when one side is text (LOCK.FENCE's token against a saved int)."""
    if isinstance(want, int) and isinstance(got, str) and got.lstrip("-").isdigit():
        return int(got) == want
    return got == want


class raw_wanted:
    """What ``wait_raw`` waits for: the reply ``expect``, or a number ``below`` / ``above`` a bound."""

    def __init__(self, step, variables):
        self.step = {k: subst(step[k], variables) for k in ("expect", "below", "above") if k in step}

    def __call__(self, got):
        if "expect" in self.step:
            return same(got, self.step["expect"])
        if not isinstance(got, int):
            return False
        return got < self.step.get("below", got + 1) and got > self.step.get("above", got - 1)

    def __str__(self):
        return repr(self.step)


def error_kind(e):
    """The vocabulary's outcome kind of an exception (conformance/README.md, "Errors")."""
    if isinstance(e, LockBusyError):
        return "busy"
    if isinstance(e, StaleTokenError):
        return "stale_token"
    if isinstance(e, NotDurableError):
        return "not_durable"
    if isinstance(e, TimeoutError) and not isinstance(e, redis.exceptions.RedisError):
        return "timeout"
    if isinstance(e, ValueError):
        return "invalid_argument"
    if isinstance(e, ResponseError):
        return "server"
    return f"unexpected {type(e).__module__}.{type(e).__name__}"


def check_error(step, e):
    kind = error_kind(e)
    assert kind == step["error"], f"{step['do']}: wanted a {step['error']} error, got {kind}: {e!r}"
    if "code" in step:
        assert str(e).split(" ", 1)[0] == step["code"], f"{step['do']}: wanted code {step['code']}, got {e}"


def info_fields(reply):
    """LOCK.INFO / LOCK.SESSION INFO as a dict of text keys (RESP2 list or RESP3 map)."""
    if reply is None:
        return None
    if isinstance(reply, dict):
        return {norm(k): v for k, v in reply.items()}
    return {norm(k): v for k, v in zip(reply[::2], reply[1::2])}


def poll(what, predicate, timeout):
    deadline = time.monotonic() + timeout
    while True:
        if predicate():
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.005)


def needs_of(case, can):
    """Raise Skip for a need this runner cannot meet (`can`: the needs it meets)."""
    for need in case.get("needs", []):
        if need not in can:
            raise Skip("needs", f"needs a {need}: {NEEDS_REASONS.get(need, 'this runner starts none')}")


NEEDS_REASONS = {
    "replica": "this runner starts no replica",
    "cluster": "this runner starts no cluster",
}


def env_flag(name):
    return os.environ.get(name, "") not in ("", "0")
