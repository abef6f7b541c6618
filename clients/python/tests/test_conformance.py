"""The conformance suite (<repo>/conformance/cases/*.json) run by the Python package, sync and asyncio.

Every case of every topic file is one test per API (``test_sync[topic/i]``,
``test_asyncio[topic/i]``), run unchanged: each step of the vocabulary (conformance/README.md)
is mapped to the package's API here, each error kind to its exception type
(``conformance_cases.error_kind``). A case whose needs this runner could not meet would be
skipped with the reason, never passed. The summary per topic (passed / skipped / failed) goes to
target/conformance/python-sync.json and python-asyncio.json when the module's tests end.

All cases share one server of this module's own (the runner flushes it between cases); a case
that needs a replica gets one for its run; the cluster cases get a 3-master cluster, started on
first use.
"""

import asyncio
import time
import signal
import threading

import pytest
import redis

from conftest import Cluster, Server
from conformance_cases import (
    CLUSTER,
    REPLICA,
    STEP_DEADLINE,
    Results,
    Skip,
    case_id,
    check_error,
    info_fields,
    load_cases,
    needs_of,
    norm,
    poll,
    raw_wanted,
    same,
    subst,
)
from redislock_native import (
    AsyncElection,
    AsyncLock,
    AsyncMultiLock,
    AsyncReadWriteLock,
    AsyncSemaphore,
    AsyncSession,
    Election,
    Lock,
    MultiLock,
    ReadWriteLock,
    Semaphore,
    Session,
    awatch,
    fenced_script,
    watch,
)

CASES = load_cases()
RESULTS = Results()


@pytest.fixture(scope="module", autouse=True)
def results_file():
    yield
    RESULTS.write()


@pytest.fixture(scope="module")
def own_server():
    s = Server()
    yield s
    s.stop()


@pytest.fixture(scope="module")
def lazy_cluster():
    started = []

    def get():
        if not started:
            started.append(Cluster(masters=3, replicas=0))
        return started[0]

    yield get
    for c in started:
        c.stop()


def run_recorded(client, item, body):
    topic, _i, case = item
    try:
        body()
    except Skip as s:
        RESULTS.record(client, topic, case["description"], "skipped", s.reason, s.kind)
        pytest.skip(s.reason)
    except BaseException as e:
        RESULTS.record(client, topic, case["description"], "failed", repr(e))
        raise
    RESULTS.record(client, topic, case["description"], "passed")


def ms(value):
    return None if value is None else value / 1000


def expect(step, got):
    if "expect" in step:
        assert got == step["expect"], f"{step['do']} {step}: got {got!r}"


# --- sync -------------------------------------------------------------------------------------


class SyncRunner:
    """Runs one case's steps with the sync API on client ``r``."""

    def __init__(self, r):
        self.r = r
        self.vars, self.objs, self.pending, self.watches, self.sessions = {}, {}, {}, {}, []

    def raw(self, *args):
        return norm(self.r.execute_command(*subst(list(args), self.vars)))

    def lock_kwargs(self, step):
        kw = {}
        if "owner" in step:
            kw["owner"] = step["owner"]
        if "session" in step:
            kw["session"] = self.objs[step["session"]]
        if "lock_delay" in step:
            kw["lock_delay"] = ms(step["lock_delay"])
        if "durable" in step:
            kw["durable"] = step["durable"]
            kw["durable_timeout"] = ms(step.get("durable_timeout", 1000))
        if step.get("report_loss"):
            kw["on_lost"] = lambda lock: None
        if step.get("watchdog"):
            kw["watchdog"] = True
        return kw

    def run(self, steps):
        i = 0
        while i < len(steps):
            step = steps[i]
            cancel_at = self.cancel_of(steps, i)
            if cancel_at is not None:
                self.interrupted_wait(step, steps[i + 1:cancel_at])
                i = cancel_at + 1
                continue
            try:
                self.step(step)
            except AssertionError:
                raise
            except Skip:
                raise
            except Exception as e:
                if "error" not in step:
                    raise
                check_error(step, e)
            else:
                assert "error" not in step, f"{step}: wanted a {step['error']} error, got none"
            i += 1

    @staticmethod
    def cancel_of(steps, i):
        if steps[i]["do"] != "start_acquire":
            return None
        for j in range(i + 1, len(steps)):
            if steps[j]["do"] == "cancel" and steps[j]["pending"] == steps[i]["as"]:
                return j
        return None

    def interrupted_wait(self, start, between):
        """A sync wait is cancelled the Python way, by KeyboardInterrupt in the waiting (main)
        thread: the steps up to the cancel run in a helper thread, which then sends SIGINT."""
        lock = self.objs[start["lock"]]
        main = threading.get_ident()
        failure = []

        def helper():
            try:
                for s in between:
                    self.step(s)
            except BaseException as e:  # reported after the wait ends
                failure.append(e)
            signal.pthread_kill(main, signal.SIGINT)

        t = threading.Thread(target=helper, daemon=True)
        t.start()
        interrupted = False
        got = "not returned"
        began = time.monotonic()
        # Python's own Ctrl-C handler for the wait: a suite started in the background by a
        # non-interactive shell (tests/suites.sh) inherits SIGINT ignored, and Python then
        # leaves it ignored.
        handler = signal.signal(signal.SIGINT, signal.default_int_handler)
        try:
            got = lock.acquire(timeout=ms(start["wait"]))
        except KeyboardInterrupt:
            interrupted = True
        finally:
            signal.signal(signal.SIGINT, handler)
        t.join(STEP_DEADLINE)
        if failure:
            raise failure[0]
        assert interrupted, f"the wait ended before it was cancelled: {got!r} after {time.monotonic() - began:.3f} s"

    def step(self, step):
        do, o, v = step["do"], self.objs, self.vars
        if do == "lock":
            o[step["as"]] = Lock(self.r, step["key"], ms(step["ttl"]), **self.lock_kwargs(step))
        elif do == "semaphore":
            o[step["as"]] = Semaphore(self.r, step["key"], step["limit"], ms(step["ttl"]), **self.lock_kwargs(step))
        elif do in ("read_lock", "write_lock"):
            rw = ReadWriteLock(self.r, step["key"], ms(step["ttl"]), **self.lock_kwargs(step))
            o[step["as"]] = rw.read if do == "read_lock" else rw.write
        elif do == "multilock":
            o[step["as"]] = MultiLock(self.r, step["keys"], ms(step["ttl"]), **self.lock_kwargs(step))
        elif do == "session":
            s = Session(self.r, ms(step["ttl"]), bound=step.get("bound", False), lock_delay=ms(step.get("lock_delay")))
            self.sessions.append(s)
            o[step["as"]] = s.open()
        elif do == "election":
            session = o[step["session"]] if "session" in step else None
            o[step["as"]] = Election(self.r, step["key"], ms(step["ttl"]), session=session)
        elif do == "acquire":
            lock = o[step["lock"]]
            got = lock.acquire(blocking=False) if step.get("wait") is None else lock.acquire(timeout=ms(step["wait"]))
            expect(step, got)
        elif do == "start_acquire":
            lock, box = o[step["lock"]], {}

            def wait():
                try:
                    box["result"] = lock.acquire(timeout=ms(step["wait"]))
                except BaseException as e:
                    box["error"] = e

            t = threading.Thread(target=wait, daemon=True)
            t.start()
            self.pending[step["as"]] = (t, box, step["wait"])
        elif do == "finish":
            t, box, wait = self.pending.pop(step["pending"])
            t.join(ms(wait) + STEP_DEADLINE)
            assert not t.is_alive(), "the wait did not end"
            if "error" in box:
                raise box["error"]
            expect(step, box["result"])
        elif do == "cancel":
            raise AssertionError("cancel without its start_acquire")
        elif do == "release":
            expect(step, o[step["lock"]].release())
        elif do == "extend":
            expect(step, o[step["lock"]].extend(ms(step["ttl"])))
        elif do == "held":
            expect(step, o[step["lock"]].owned())
        elif do == "token":
            self.check_token(step, o[step["lock"]].token)
        elif do == "fenced":
            command, key, *args = step["command"]
            expect(step, norm(o[step["lock"]].fenced(command, key, *args)))
        elif do == "fenced_script":
            lock = o[step["lock"]]
            script = fenced_script(self.r, step["body"])
            expect(step, norm(script(keys=[lock.name, *step["keys"]], args=[lock.token, *step["args"]])))
        elif do == "hold":
            lock = o[step["lock"]]
            lock.blocking_timeout = ms(step["wait"])
            with lock:
                pass
        elif do == "raw":
            got = self.raw(*step["command"])
            if "expect" in step:
                want = subst(step["expect"], v)
                assert same(got, want), f"{step['command']}: got {got!r}, wanted {want!r}"
            if "save" in step:
                v[step["save"]] = got
        elif do == "wait_raw":
            want = raw_wanted(step, v)
            poll(f"{step['command']} to answer {want}", lambda: want(self.raw(*step["command"])), ms(step["timeout"]))
        elif do == "wait_waiters":
            poll(f"{step['count']} waiter(s) on {step['key']}", lambda: self.waiters(step["key"]) == step["count"],
                 STEP_DEADLINE)
        elif do == "kill_session_connection":
            fields = info_fields(self.r.execute_command("LOCK.SESSION", "INFO", o[step["session"]].id))
            assert fields is not None and fields["bound"] is not None, "the session is not bound"
            assert self.r.execute_command("CLIENT", "KILL", "ID", fields["bound"]) == 1
        elif do == "wait_session_lost":
            s = o[step["session"]]
            poll("the session reported lost", lambda: s.lost, ms(step["timeout"]))
        elif do == "wait_lost":
            lock = o[step["lock"]]
            poll("the hold reported lost", lambda: lock.lost, ms(step["timeout"]))
        elif do == "close_session":
            expect(step, o[step["session"]].close())
        elif do == "campaign":
            leadership = o[step["election"]].campaign(step["value"], timeout=ms(step.get("wait")))
            expect(step, leadership is not None)
            if leadership is not None:
                o[step["as"]] = leadership
                if "save_term" in step:
                    v[step["save_term"]] = leadership.term
        elif do == "leader":
            leader = o[step["election"]].leader()
            expect(step, None if leader is None else leader.value)
        elif do == "resign":
            expect(step, o[step["leadership"]].resign())
        elif do in ("watch", "observe"):
            w = watch(self.r, step["key"]) if do == "watch" else o[step["election"]].observe()
            self.watches[step["as"]] = w
        elif do == "next_change":
            change = self.watches[step["watch"]].get(timeout=ms(step["timeout"]))
            got = None if change.leader is None else change.leader.value
            if "expect_holder" in step:
                assert got == step["expect_holder"], f"next change: holder {got!r}, wanted {step['expect_holder']!r}"
        elif do == "close_watch":
            self.watches.pop(step["watch"]).close()
        else:
            raise Skip("unsupported", f"the runner has no step {do!r}")

    def check_token(self, step, token):
        if "expect" in step:
            assert token == step["expect"], f"token {token!r}, wanted {step['expect']!r}"
        if "greater_than" in step:
            earlier = self.vars[step["greater_than"]]
            assert token is not None and token > earlier, f"token {token!r} not greater than {earlier!r}"
        if "save" in step:
            self.vars[step["save"]] = token

    def waiters(self, key):
        fields = info_fields(self.r.execute_command("LOCK.INFO", key))
        return 0 if fields is None else fields["waiters"]

    def cleanup(self):
        for w in self.watches.values():
            w.close()
        for t, _box, _wait in self.pending.values():
            t.join(STEP_DEADLINE)
        for s in self.sessions:
            try:
                s.close()
            except Exception:
                pass


class ReplicaFor:
    """A case that needs a replica gets one of the server for its run (harness --replica-of),
    online before the case starts, stopped after it: the other cases see none."""

    def __init__(self, case, server):
        self.server = server if REPLICA in case.get("needs", []) else None
        self.replica = None

    def __enter__(self):
        if self.server is not None:
            self.replica = Server("--replica-of", str(self.server.port))
            c = self.server.client()
            try:
                poll("the replica online", lambda: c.info("replication").get("slave0", {}).get("state") == "online",
                     STEP_DEADLINE)
            except BaseException:
                self.replica.stop()
                raise
            finally:
                c.close()

    def __exit__(self, *exc):
        if self.replica is not None:
            self.replica.stop()


@pytest.mark.parametrize("item", CASES, ids=case_id)
def test_sync(item, own_server, lazy_cluster):
    def body():
        case = item[2]
        cluster = CLUSTER in case.get("needs", [])
        needs_of(case, {CLUSTER, REPLICA})
        r = lazy_cluster().client() if cluster else own_server.client(socket_timeout=STEP_DEADLINE)
        r.flushall()
        runner = SyncRunner(r)
        try:
            with ReplicaFor(case, own_server):
                runner.run(case["steps"])
        finally:
            runner.cleanup()
            r.close()

    run_recorded("python-sync", item, body)


# --- asyncio ----------------------------------------------------------------------------------


class AsyncRunner(SyncRunner):
    """The same steps with the asyncio API (``redis.asyncio``); a cancel is a task's."""

    async def araw(self, *args):
        return norm(await self.r.execute_command(*subst(list(args), self.vars)))

    async def run(self, steps):
        for step in steps:
            try:
                await self.within_deadline(step)
            except (AssertionError, Skip):
                raise
            except Exception as e:
                if "error" not in step:
                    raise
                check_error(step, e)
            else:
                assert "error" not in step, f"{step}: wanted a {step['error']} error, got none"

    async def within_deadline(self, step):
        """The step, failed as a whole if it takes longer than its deadline."""
        task = asyncio.ensure_future(self.astep(step))
        done, _ = await asyncio.wait({task}, timeout=ms(step.get("wait", 0) or 0) + STEP_DEADLINE)
        if not done:
            task.cancel()
            raise AssertionError(f"{step}: no outcome within the step's deadline")
        task.result()

    async def astep(self, step):
        do, o, v = step["do"], self.objs, self.vars
        if do == "lock":
            o[step["as"]] = AsyncLock(self.r, step["key"], ms(step["ttl"]), **self.lock_kwargs(step))
        elif do == "semaphore":
            o[step["as"]] = AsyncSemaphore(self.r, step["key"], step["limit"], ms(step["ttl"]), **self.lock_kwargs(step))
        elif do in ("read_lock", "write_lock"):
            rw = AsyncReadWriteLock(self.r, step["key"], ms(step["ttl"]), **self.lock_kwargs(step))
            o[step["as"]] = rw.read if do == "read_lock" else rw.write
        elif do == "multilock":
            o[step["as"]] = AsyncMultiLock(self.r, step["keys"], ms(step["ttl"]), **self.lock_kwargs(step))
        elif do == "session":
            s = AsyncSession(self.r, ms(step["ttl"]), bound=step.get("bound", False),
                             lock_delay=ms(step.get("lock_delay")))
            self.sessions.append(s)
            o[step["as"]] = await s.open()
        elif do == "election":
            session = o[step["session"]] if "session" in step else None
            o[step["as"]] = AsyncElection(self.r, step["key"], ms(step["ttl"]), session=session)
        elif do == "acquire":
            lock = o[step["lock"]]
            if step.get("wait") is None:
                got = await lock.acquire(blocking=False)
            else:
                got = await lock.acquire(timeout=ms(step["wait"]))
            expect(step, got)
        elif do == "start_acquire":
            task = asyncio.ensure_future(o[step["lock"]].acquire(timeout=ms(step["wait"])))
            self.pending[step["as"]] = task
        elif do == "finish":
            expect(step, await self.pending.pop(step["pending"]))
        elif do == "cancel":
            task = self.pending.pop(step["pending"])
            task.cancel()
            try:
                await task
            except asyncio.CancelledError:
                pass
            else:
                raise AssertionError("the wait ended before it was cancelled")
        elif do == "release":
            expect(step, await o[step["lock"]].release())
        elif do == "extend":
            expect(step, await o[step["lock"]].extend(ms(step["ttl"])))
        elif do == "held":
            expect(step, await o[step["lock"]].owned())
        elif do == "fenced":
            command, key, *args = step["command"]
            expect(step, norm(await o[step["lock"]].fenced(command, key, *args)))
        elif do == "fenced_script":
            lock = o[step["lock"]]
            script = fenced_script(self.r, step["body"])
            expect(step, norm(await script(keys=[lock.name, *step["keys"]], args=[lock.token, *step["args"]])))
        elif do == "hold":
            lock = o[step["lock"]]
            lock.blocking_timeout = ms(step["wait"])
            async with lock:
                pass
        elif do == "raw":
            got = await self.araw(*step["command"])
            if "expect" in step:
                want = subst(step["expect"], v)
                assert same(got, want), f"{step['command']}: got {got!r}, wanted {want!r}"
            if "save" in step:
                v[step["save"]] = got
        elif do == "wait_raw":
            want = raw_wanted(step, v)
            await self.apoll(f"{step['command']} to answer {want}", lambda: self.araw(*step["command"]), want,
                             ms(step["timeout"]))
        elif do == "wait_waiters":
            await self.apoll(f"{step['count']} waiter(s) on {step['key']}",
                             lambda: self.r.execute_command("LOCK.INFO", step["key"]),
                             lambda got: (info_fields(got) or {"waiters": 0})["waiters"] == step["count"],
                             STEP_DEADLINE)
        elif do == "kill_session_connection":
            fields = info_fields(await self.r.execute_command("LOCK.SESSION", "INFO", o[step["session"]].id))
            assert fields is not None and fields["bound"] is not None, "the session is not bound"
            assert await self.r.execute_command("CLIENT", "KILL", "ID", fields["bound"]) == 1
        elif do in ("wait_session_lost", "wait_lost"):
            obj = o[step.get("session") or step.get("lock")]
            await self.apoll(f"{step['do']}", self.nothing, lambda _: obj.lost, ms(step["timeout"]))
        elif do == "close_session":
            expect(step, await o[step["session"]].close())
        elif do == "campaign":
            leadership = await o[step["election"]].campaign(step["value"], timeout=ms(step.get("wait")))
            expect(step, leadership is not None)
            if leadership is not None:
                o[step["as"]] = leadership
                if "save_term" in step:
                    v[step["save_term"]] = leadership.term
        elif do == "leader":
            leader = await o[step["election"]].leader()
            expect(step, None if leader is None else leader.value)
        elif do == "resign":
            expect(step, await o[step["leadership"]].resign())
        elif do in ("watch", "observe"):
            w = awatch(self.r, step["key"]) if do == "watch" else o[step["election"]].observe()
            self.watches[step["as"]] = w
        elif do == "next_change":
            change = await self.watches[step["watch"]].get(timeout=ms(step["timeout"]))
            got = None if change.leader is None else change.leader.value
            if "expect_holder" in step:
                assert got == step["expect_holder"], f"next change: holder {got!r}, wanted {step['expect_holder']!r}"
        else:
            self.step(step)  # token, close_watch: no I/O

    @staticmethod
    async def nothing():
        return None

    @staticmethod
    async def apoll(what, read, predicate, timeout):
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while not predicate(await read()):
            if loop.time() > deadline:
                raise AssertionError(f"timed out after {timeout} s waiting for {what}")
            await asyncio.sleep(0.005)

    async def acleanup(self):
        for w in self.watches.values():
            w.close()
        for task in self.pending.values():
            task.cancel()
        for s in self.sessions:
            try:
                await s.close()
            except Exception:
                pass


@pytest.mark.parametrize("item", CASES, ids=case_id)
def test_asyncio(item, own_server, lazy_cluster):
    case = item[2]

    async def main():
        cluster = CLUSTER in case.get("needs", [])
        r = lazy_cluster().aclient() if cluster else own_server.aclient(socket_timeout=STEP_DEADLINE)
        await r.flushall()
        runner = AsyncRunner(r)
        try:
            with ReplicaFor(case, own_server):
                await runner.run(case["steps"])
        finally:
            await runner.acleanup()
            await r.aclose()

    def body():
        needs_of(case, {CLUSTER, REPLICA})
        asyncio.run(main())

    run_recorded("python-asyncio", item, body)


def test_every_topic_has_cases():
    topics = {topic for topic, _i, _case in CASES}
    assert len(CASES) > 0 and "basic" in topics, f"no cases read from conformance/: {topics}"


def test_redis_py_is_the_one_under_test():
    assert redis.__version__  # the suite runs for each redis-py of `make test`
