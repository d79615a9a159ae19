"""The etcd store's queues of waiters, as etcd's own lock recipe keeps them.

A waiter puts a key of its own in the lock key's queue (``P wait/<len>:K/<id>``, on its
waiter lease; its value is the waiter's holder record and arrival, for ``peek``); the
queue is ordered by create_revision, and an acquire takes a slot only while no place in
it is older than the caller's (none at all, for a caller with no place: see ``store``).
The first waiter watches every slot of the key, each other one the waiter before it, so
a release wakes exactly one waiter, and a waiter that goes (it got the lease, gave up,
or crashed and its waiter lease ran out) hands the turn on. A watch starts at the
revision of the read before it, so nothing in between is missed.
"""

from __future__ import annotations

import contextlib
import json
import math
import threading
import time
from collections.abc import Callable
from typing import Any

from tasklock_cli.errors import TasklockError
from tasklock_cli.stores.base import Holder
from tasklock_cli.stores.base import WaiterInfo
from tasklock_cli.stores.base import utc_from_timestamp
from tasklock_cli.stores.base import wait_readable
from tasklock_cli.stores.etcd.connection import EtcdClient
from tasklock_cli.stores.etcd.connection import EtcdError
from tasklock_cli.stores.etcd.connection import b64
from tasklock_cli.stores.etcd.connection import new_lease_id
from tasklock_cli.stores.etcd.connection import prefix_end
from tasklock_cli.stores.etcd.connection import revision
from tasklock_cli.stores.etcd.connection import unb64
from tasklock_cli.stores.etcd.keys import EtcdKeys
from tasklock_cli.stores.etcd.keys import absent

#: A waiter's place in a queue lives this long without a refresh (a crashed waiter's place
#: is given up after it); waiting refreshes it every third of it.
WAITER_TTL_S = 3
#: When the watch breaks, waiting falls back to reading the key this often.
POLL_S = 0.1


class WaiterQueue:
    """This client's places in the queues of keys: one waiter lease for all of them,
    refreshed while waiting."""

    def __init__(self, client: EtcdClient, keys: EtcdKeys, ttl: Callable[[], float]) -> None:
        self._client = client
        self._keys = keys
        self._ttl = ttl  # the store's waiter_ttl
        self._waiter_lease: int | None = None
        self._waiter_refreshed = 0.0
        self._queued: set[str] = set()
        self._values: dict[str, bytes] = {}  # key -> our place's value
        self._revisions: dict[str, int] = {}  # key -> our place's create_revision
        self._lock = threading.Lock()

    @property
    def ttl_s(self) -> int:
        """Our waiter lease's TTL: whole seconds (etcd raises it to its own minimum)."""
        return max(1, math.ceil(self._ttl()))

    def guard(self, key: str) -> dict[str, Any]:
        """A compare that holds while no place in ``key``'s queue is older than ours (no
        place at all, when we have none): an acquire's first come, first served."""
        queue = self._keys.queue_prefix(key)
        ours = self.place_revision(key)
        if ours is None:
            return {**absent(queue), "range_end": b64(prefix_end(queue))}
        return {
            "key": b64(queue),
            "range_end": b64(prefix_end(queue)),
            "target": "CREATE",
            "result": "GREATER",
            "create_revision": str(ours - 1),
        }

    def someone_ahead(self, key: str) -> bool:
        """Whether the oldest place in ``key``'s queue is older than ours (or there is one
        at all, when we have none)."""
        oldest = self._read(key, limit=1, keys_only=True)
        if not oldest:
            return False
        ours = self.place_revision(key)
        return ours is None or int(oldest[0].get("create_revision", 0)) < ours

    def waiters(self, key: str) -> list[WaiterInfo]:
        """The places in ``key``'s queue, oldest first (see ``waiter_value``)."""
        return [_waiter_info(unb64(kv.get("value"))) for kv in self._read(key)]

    def counts(self, prefix: str) -> dict[str, int]:
        """How many places each key starting with ``prefix`` has in its queue."""
        everything = self._keys.queue_prefix("")[: -len(b"0:/")]
        body = {"key": b64(everything), "range_end": b64(prefix_end(everything))}
        reply = self._client.call(("/v3/kv/range", {**body, "keys_only": True}))[0]
        counts: dict[str, int] = {}
        for kv in reply.get("kvs", []):
            key = _queue_key(unb64(kv["key"])[len(everything) :])
            if key is not None and key.startswith(prefix):
                counts[key] = counts.get(key, 0) + 1
        return dict(sorted(counts.items()))

    def _read(self, key: str, limit: int = 0, keys_only: bool = False) -> list[dict[str, Any]]:
        queue = self._keys.queue_prefix(key)
        body: dict[str, Any] = {
            "key": b64(queue),
            "range_end": b64(prefix_end(queue)),
            "sort_order": "ASCEND",
            "sort_target": "CREATE",
            "limit": str(limit),
            "keys_only": keys_only,
        }
        return self._client.call(("/v3/kv/range", body))[0].get("kvs", [])

    def join(self, key: str, value: bytes) -> None:
        """Take a place in ``key``'s queue, with ``value``, when we have none."""
        with self._lock:
            self._values[key] = value
        self._join(key)

    def place_revision(self, key: str) -> int | None:
        """Our place's create_revision in ``key``'s queue; None when we have none."""
        with self._lock:
            return self._revisions.get(key) if key in self._queued else None

    def entry_if_queued(self, key: str) -> bytes | None:
        """Our place in ``key``'s queue, for an acquire to delete with its taking."""
        with self._lock:
            if key in self._queued and self._waiter_lease is not None:
                return self._keys.queue_entry(key, self._waiter_lease)
            return None

    def left(self, key: str) -> None:
        """An acquire deleted our place in ``key``'s queue."""
        with self._lock:
            self._queued.discard(key)
            self._revisions.pop(key, None)

    def take_turn(self, key: str, deadline: float, wake_fd: int | None) -> bool:
        """Join ``key``'s queue and wait until we are first in it (watching the waiter
        before us); False when the turn did not come before the deadline or wake_fd."""
        while time.monotonic() < deadline:
            entry = self._join(key)
            ahead, present, rev = self._place(key, entry)
            if not present:
                self._forget()
                continue
            if ahead is None:
                return True
            until = min(deadline, self._waiter_refreshed + self.ttl_s / 3)
            if self._client.watch({"key": b64(ahead)}, rev + 1, until, wake_fd) == "woken":
                return False
        return False

    def await_release(
        self, keys: dict[str, str], start_revision: int, until: float, wake_fd: int | None
    ) -> None:
        """Watch ``keys`` from ``start_revision`` until one is deleted (a release, a forced
        release, an expiry), ``until`` or wake_fd, keeping our place meanwhile."""
        while time.monotonic() < until:
            refresh_by = min(until, self._waiter_refreshed + self.ttl_s / 3)
            event = self._client.watch(keys, start_revision, refresh_by, wake_fd)
            if event != "timeout" or not self._refresh():
                return  # woken, or our place in the queue is gone: look again

    def leave(self, key: str) -> None:
        """Give up our place in ``key``'s queue (so the next waiter moves up)."""
        with self._lock:
            if key not in self._queued or self._waiter_lease is None:
                return
            entry = self._keys.queue_entry(key, self._waiter_lease)
            self._queued.discard(key)
            self._revisions.pop(key, None)
        with contextlib.suppress(TasklockError):
            self._client.call(("/v3/kv/deleterange", {"key": b64(entry)}))

    def close(self) -> None:
        """Our places in queues go, so the waiters behind move up."""
        with self._lock:
            waiter, self._waiter_lease = self._waiter_lease, None
            self._queued.clear()
            self._revisions.clear()
        if waiter is not None:
            with contextlib.suppress(TasklockError):
                self._client.revoke(waiter)

    def _join(self, key: str) -> bytes:
        """Our place in ``key``'s queue (joining, or refreshing our waiter lease when due)."""
        if time.monotonic() - self._waiter_refreshed > self.ttl_s / 3:
            self._refresh()
        with self._lock:
            now = time.monotonic()
            requests: list[tuple[str, dict[str, Any]]] = []
            if self._waiter_lease is None:
                self._waiter_lease = new_lease_id()
                self._waiter_refreshed = now
                grant = {"ID": str(self._waiter_lease), "TTL": str(self.ttl_s)}
                requests.append(("/v3/lease/grant", grant))
            entry = self._keys.queue_entry(key, self._waiter_lease)
            if key not in self._queued:
                value = b64(self._values.get(key, b""))
                put = {"key": b64(entry), "value": value, "lease": str(self._waiter_lease)}
                requests.append(("/v3/kv/put", put))
            if requests:
                replies = self._client.call(*requests)
                if key not in self._queued:
                    self._revisions[key] = revision(replies[-1])  # the put's: our place's
                self._queued.add(key)
            return entry

    def _refresh(self) -> bool:
        """Keep our places in queues; False when they are gone (the waiter lease ran out)."""
        with self._lock:
            if self._waiter_lease is None:
                return False
            if self._client.keepalive(self._waiter_lease) <= 0:
                self._waiter_lease = None
                self._queued.clear()
                self._revisions.clear()
                return False
            self._waiter_refreshed = time.monotonic()
            return True

    def _forget(self) -> None:
        with self._lock:
            self._waiter_lease = None
            self._queued.clear()
            self._revisions.clear()

    def _place(self, key: str, entry: bytes) -> tuple[bytes | None, bool, int]:
        """(the waiter just before us or None, whether we are queued, the read's revision)."""
        queue = self._keys.queue_prefix(key)
        body = {
            "key": b64(queue),
            "range_end": b64(prefix_end(queue)),
            "sort_order": "ASCEND",
            "sort_target": "CREATE",
            "keys_only": True,
        }
        reply = self._client.call(("/v3/kv/range", body))[0]
        names = [unb64(kv["key"]) for kv in reply.get("kvs", [])]
        if entry not in names:
            return None, False, revision(reply)
        at = names.index(entry)
        return (names[at - 1] if at > 0 else None), True, revision(reply)


def waiter_value(holder: Holder, sent: float) -> bytes:
    """A place's value: the waiter's holder record and when it came (ms, its clock)."""
    return json.dumps({"holder": holder.to_dict(), "since": int(sent * 1000)}).encode()


def _waiter_info(value: bytes) -> WaiterInfo:
    try:
        data = json.loads(value) if value else {}
    except ValueError:
        data = {}
    holder = Holder.from_dict(data.get("holder") or {})
    return WaiterInfo(holder, utc_from_timestamp(int(data.get("since", 0)) / 1000))


def _queue_key(rest: bytes) -> str | None:
    """The lock key of a queue entry's name after ``P wait/`` (``<len>:K/<id>``)."""
    length, colon, tail = rest.partition(b":")
    if not colon or not length.isdigit() or len(tail) <= int(length):
        return None
    return tail[: int(length)].decode("utf-8", "replace")


def poll_until(deadline: float, wake_fd: int | None, done: Callable[[], bool]) -> bool:
    """Ask ``done()`` every POLL_S until it is True; False at the deadline or on wake_fd."""
    while True:
        with contextlib.suppress(TasklockError, EtcdError, OSError):
            if done():
                return True
        left = deadline - time.monotonic()
        if left <= 0 or wait_readable([wake_fd], min(POLL_S, left)):
            return False
