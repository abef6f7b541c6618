"""How the change feed follows a cluster failover (issue 34), apart from ``feed.py``'s I/O loop.

A feed is built on one node's client. When that node gives up a key's slot (a planned
``CLUSTER FAILOVER``: the server's unasked ``sunsubscribe``; ``MOVED`` or ``READONLY`` from the
node; a lost connection to a killed master), the feed takes the key's holds and observers out
(``_Core.take``) and ``hand_over`` gives them to the feed of the slot's master now, from a thread
of its own (the cluster may still be electing one). There each is checked against ``LOCK.INFO``
as a new subscriber: a hold is reported lost only if the new master lacks its token; an
observer reports the leader there (``resync=True``).
"""

import threading
import time

from redis.exceptions import ResponseError

from . import _wire
from . import feed as _feed

#: How long a subscriber whose key's slot moved (a failover) waits for a master of that slot to
#: be reachable before it is given up: holds are then reported lost, observers get the error.
HANDOVER_PATIENCE = 30.0


def hand_over(feed, subs, error):
    """Give ``subs`` (taken from this feed) to the feeds of their keys' masters now, from a
    thread of its own (it may wait for the cluster to elect a master). Each is checked
    there against ``LOCK.INFO`` as a new subscriber: a hold is reported lost only if the
    new master does not show its token; an observer reports the leader there
    (``resync=True``)."""
    subs = [s for s in subs if not getattr(s, "dropped", False)]
    if not subs:
        return
    cluster = feed._cluster()
    if cluster is None:
        return

    def run():
        give_up = time.monotonic() + HANDOVER_PATIENCE
        pending, last, first = subs, error, True
        while pending:
            _wire.refresh_slots(cluster)
            left = []
            for sub in pending:
                if getattr(sub, "dropped", False):
                    continue
                key = sub.key if sub.kind == "observer" else next(iter(sub.tokens))
                try:
                    found = _feed.feed_for(cluster, key)
                    if found is feed and first:
                        # The slot table still names this node: look again once before
                        # trying it again (a failover may not have been decided yet).
                        left.append(sub)
                        continue
                    _adopt(found, sub)
                except Exception as e:  # noqa: BLE001 - no master for the slot yet
                    last = e
                    left.append(sub)
            pending, first = left, False
            if pending and time.monotonic() >= give_up:
                feed._dispatch(
                    [(s, f"feed connection lost: {last!r}" if s.kind == "hold" else last) for s in pending]
                )
                return
            if pending:
                time.sleep(_feed.MAX_BACKOFF / 4)

    threading.Thread(target=run, name="redislock-feed-handover", daemon=True).start()


def _adopt(feed, sub):
    """``sub`` (given up by another feed) subscribes through ``feed`` and is checked again."""
    sub.feed = feed
    sub.done = False
    if sub.kind == "hold":
        sub.floor = {key: -1 for key in sub.tokens}
        sub.checked = set()
    else:
        sub.floor = -1
        sub.reported = False
    keys = list(sub.tokens) if sub.kind == "hold" else [sub.key]
    if not feed._add(sub, keys):
        raise ResponseError(f"the server has no change feed: {feed._core.unsupported}")
