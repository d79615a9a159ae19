"""Reading the etcd queues' places: which are live (a place whose waiter lease was
granted for longer than any waiter asks is dead: see ``waiting``), the waiters shown,
the counts per key, and the sweep of dead places. A mixin of ``WaiterQueue``."""

from __future__ import annotations

import contextlib
import json
from typing import Any
from typing import NamedTuple

from tasklock_cli.errors import TasklockError
from tasklock_cli.stores import rows as row_parsing
from tasklock_cli.stores.etcd.connection import EtcdClient
from tasklock_cli.stores.etcd.connection import b64
from tasklock_cli.stores.etcd.connection import prefix_end
from tasklock_cli.stores.etcd.connection import unb64
from tasklock_cli.stores.etcd.keys import EtcdKeys
from tasklock_cli.stores.etcd.keys import code_priority
from tasklock_cli.stores.model import EXCLUSIVE
from tasklock_cli.stores.model import SHARED
from tasklock_cli.stores.model import WAITER_HORIZON_S
from tasklock_cli.stores.model import WaiterInfo


class Queued(NamedTuple):
    """A place in a queue as read back: its key, class letters and create_revision."""

    name: bytes
    letters: str
    revision: int
    kv: dict[str, Any]
    priority: int = 0

    @property
    def front(self) -> bool:
        return self.letters[0] == "F"

    @property
    def mode(self) -> str:
        return SHARED if self.letters[1] == "S" else EXCLUSIVE


def _lease_if_its_own(kv: dict[str, Any]) -> int | None:
    """The lease of a place (as read) when it is the waiter lease its name ends with
    (``keys.queue_entry``), else None (a place no waiter put)."""
    tail = unb64(kv["key"]).rpartition(b"/")[2]
    try:
        named = int(tail, 16) if len(tail) == 16 else None
    except ValueError:
        return None
    return named if named is not None and int(kv.get("lease", 0)) == named else None


def ordered(queue: bytes, kvs: list[dict[str, Any]]) -> list[Queued]:
    """The places read under ``queue``, in the order they are served: the front ones
    newest first, then the others by band (highest priority first), oldest first."""
    placed = [_queued(queue, kv) for kv in kvs]
    fronts = sorted((queued for queued in placed if queued.front), key=lambda q: -q.revision)
    others = sorted(
        (queued for queued in placed if not queued.front), key=lambda q: (-q.priority, q.revision)
    )
    return fronts + others


def _queued(queue: bytes, kv: dict[str, Any]) -> Queued:
    """A place as read: its class letters (OMS) and band from its name; a name of no class
    (an older tasklock's) is a plain exclusive place of priority 0."""
    name = unb64(kv["key"])
    found = name[len(queue) :].partition(b"/")[0].decode("ascii", "replace")
    letters, priority = found, 0
    if len(found) > 3 and found[:1] == "N":
        banded = code_priority(found[1:-2])
        letters, priority = ("N" + found[-2:], banded) if banded is not None else ("", 0)
    if len(letters) != 3 or letters[:1] not in ("F", "N"):
        letters = "NXP"
    return Queued(name, letters, int(kv.get("create_revision", 0)), kv, priority)


def _waiter_info(value: bytes, mode: str) -> WaiterInfo:
    """A place's value (see ``waiter_value``), read defensively (see rows)."""
    try:
        data = json.loads(value) if value else None
    except ValueError:
        data = None
    fields = data if isinstance(data, dict) else {}
    return row_parsing.waiter_info(fields.get("holder"), fields.get("since"), mode, per_second=1000)


def _queue_key(rest: bytes) -> str | None:
    """The lock key of a queue entry's name after ``P wait/`` (``<len>:K/<id>``)."""
    length, colon, tail = rest.partition(b":")
    if not colon or not length.isdigit() or len(tail) <= int(length):
        return None
    return tail[: int(length)].decode("utf-8", "replace")


class QueueReads:
    """The reads of ``WaiterQueue`` (see the module's docstring)."""

    _client: EtcdClient
    _keys: EtcdKeys
    _too_long: dict[int, bool]

    def waiters(self, key: str) -> list[WaiterInfo]:
        """The places in ``key``'s queue, in the order they are served."""
        queue = self._keys.queue_prefix(key)
        body = {"key": b64(queue), "range_end": b64(prefix_end(queue))}
        kvs = self.live_places(self._client.call(("/v3/kv/range", body))[0].get("kvs", []))
        return [
            _waiter_info(unb64(queued.kv.get("value")), queued.mode)
            for queued in ordered(queue, kvs)
        ]

    def counts(self, prefix: str) -> dict[str, int]:
        """How many places each key starting with ``prefix`` has in its queue."""
        everything = self._keys.queue_prefix("")[: -len(b"0:/")]
        body = {"key": b64(everything), "range_end": b64(prefix_end(everything))}
        reply = self._client.call(("/v3/kv/range", {**body, "keys_only": True}))[0]
        counts: dict[str, int] = {}
        for kv in self.live_places(reply.get("kvs", [])):
            key = _queue_key(unb64(kv["key"])[len(everything) :])
            if key is not None and key.startswith(prefix):
                counts[key] = counts.get(key, 0) + 1
        return dict(sorted(counts.items()))

    def live_places(self, kvs: list[dict[str, Any]], delete: bool = False) -> list[dict[str, Any]]:
        """The places among ``kvs`` (a queue's, as read) that are not dead (see
        ``waiting``'s docstring); with ``delete``, the dead ones are deleted."""
        # (a place's lease is its name's, and that lease is known: it may be live)
        placed = [(kv, _lease_if_its_own(kv)) for kv in kvs]
        unknown = {lease for _, lease in placed if lease is not None} - set(self._too_long)
        if unknown:
            self._learn_leases(sorted(unknown))
        live, dead = [], []
        for kv, lease in placed:
            if lease is not None and not self._too_long.get(lease, False):
                live.append(kv)
            else:
                dead.append(kv["key"])
        if delete and dead:
            deletes = [("/v3/kv/deleterange", {"key": name}) for name in dead]
            with contextlib.suppress(TasklockError):
                self._client.call(*deletes)
        return live

    def sweep(self) -> int:
        """Delete the dead places of every key's queue; how many."""
        everything = self._keys.queue_prefix("")[: -len(b"0:/")]
        body = {"key": b64(everything), "range_end": b64(prefix_end(everything))}
        kvs = self._client.call(("/v3/kv/range", {**body, "keys_only": True}))[0].get("kvs", [])
        return len(kvs) - len(self.live_places(kvs, delete=True))

    def _learn_leases(self, lease_ids: list[int]) -> None:
        """Whether each lease was granted for longer than any waiter asks (a gone lease's
        places are gone with it: not dead)."""
        asks = [("/v3/lease/timetolive", {"ID": str(lease_id)}) for lease_id in lease_ids]
        for lease_id, reply in zip(lease_ids, self._client.call(*asks), strict=True):
            granted = int(reply.get("grantedTTL", 0))
            self._too_long[lease_id] = granted > WAITER_HORIZON_S
