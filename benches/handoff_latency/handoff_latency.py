#!/usr/bin/env python3
"""Delay from LOCK.RELEASE to the queued waiter's grant, and from a holder's deadline to the
waiter's grant, seen by redis-py clients on loopback.

Usage: python3 benches/handoff_latency/handoff_latency.py PORT   (a redis-server with the module loaded)
The deadline figure is a lower bound: it counts from the moment the holder's acquire returned
plus its ttl, and the server's deadline is no later than that.
"""
import statistics
import sys
import threading
import time

import redis

PORT = int(sys.argv[1]) if len(sys.argv) > 1 else 6379
r = redis.Redis(port=PORT)


def pct(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(len(xs) * p))]


def wait_blocked(n):
    while int(r.info("clients")["blocked_clients"]) != n:
        time.sleep(0.0005)


def blocked_waiter(key, out):
    c = redis.Redis(port=PORT)
    c.execute_command("LOCK.ACQUIRE", key, "waiter", 10000, "BLOCK", 5000)
    out["granted"] = time.perf_counter()


release, expiry = [], []
for i in range(200):
    key = f"handoff:release:{time.time_ns()}:{i}"
    r.execute_command("LOCK.ACQUIRE", key, "holder", 10000)
    out = {}
    t = threading.Thread(target=blocked_waiter, args=(key, out))
    t.start()
    wait_blocked(1)
    sent = time.perf_counter()
    r.execute_command("LOCK.RELEASE", key, "holder")
    t.join()
    release.append((out["granted"] - sent) * 1000)
for i in range(100):
    key = f"handoff:expiry:{time.time_ns()}:{i}"
    r.execute_command("LOCK.ACQUIRE", key, "holder", 30)
    deadline = time.perf_counter() + 0.030
    out = {}
    t = threading.Thread(target=blocked_waiter, args=(key, out))
    t.start()
    t.join()
    expiry.append((out["granted"] - deadline) * 1000)
for name, xs in (("release -> grant", release), ("deadline -> grant (lower bound)", expiry)):
    print(f"{name}: n={len(xs)} p50={statistics.median(xs):.3f} ms "
          f"p99={pct(xs, 0.99):.3f} ms max={max(xs):.3f} ms")
