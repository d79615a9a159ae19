"""The etcd store's reads: what ``check``, ``peek``, ``list``, ``history``, ``metrics`` and
``--once-per`` show (the slots and their leases' time left, the queues, the run ledger),
ranges read from one member. A mixin of ``EtcdStore``."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime

from tasklock_cli.stores.etcd.connection import EtcdClient
from tasklock_cli.stores.etcd.connection import b64
from tasklock_cli.stores.etcd.connection import prefix_end
from tasklock_cli.stores.etcd.connection import revision
from tasklock_cli.stores.etcd.connection import unb64
from tasklock_cli.stores.etcd.keys import EtcdKeys
from tasklock_cli.stores.etcd.keys import SlotKv
from tasklock_cli.stores.etcd.ledger import EtcdLedger
from tasklock_cli.stores.etcd.waiting import WaiterQueue
from tasklock_cli.stores.model import LEDGER_KEEP
from tasklock_cli.stores.model import LIST_PAGE
from tasklock_cli.stores.model import LeaseInfo
from tasklock_cli.stores.model import RunRecord
from tasklock_cli.stores.model import WaiterInfo

#: ``list`` in the store class's body is its method: annotations there say builtins.list.
TYPE_CHECKING = False
if TYPE_CHECKING:
    import builtins


def read_slots(client: EtcdClient, keys: EtcdKeys, key: str) -> tuple[list[SlotKv], set[int], int]:
    """``key``'s live slots, broken tokens, and the revision they were read at."""
    reply = client.txn([], keys.slot_reads(key), [])
    slots, broken = keys.slots_from(reply.get("responses", []))
    return slots, broken, revision(reply)


def with_infos(
    client: EtcdClient, keys: EtcdKeys, slots: list[SlotKv]
) -> list[tuple[SlotKv, LeaseInfo]]:
    """Each slot with what an observer sees of it; those whose lease ran out meanwhile
    are left out."""
    remaining = client.remaining_many(sorted({held.lease_id for held in slots}))
    pairs = []
    for held in slots:
        info = keys.info(held, remaining.get(held.lease_id, -1.0))
        if info is not None:
            pairs.append((held, info))
    return pairs


class EtcdReads:
    """The reads of ``EtcdStore`` (see the module's docstring)."""

    _client: EtcdClient
    _keys: EtcdKeys
    _ledger: EtcdLedger
    _queue: WaiterQueue

    def time_left(self, key: str, fencing_token: int) -> float | None:
        slots, broken, _ = read_slots(self._client, self._keys, key)
        mine = [held for held in slots if held.token == fencing_token]
        if not mine or fencing_token in broken:
            return None
        remaining = self._client.remaining(mine[0].lease_id) if mine[0].lease_id else -1.0
        return remaining if remaining > 0 else None

    def history(self, key: str, limit: int = LEDGER_KEEP) -> list[RunRecord]:
        return self._ledger.history(key, limit)

    def last_success(self, key: str) -> tuple[RunRecord | None, datetime]:
        return self._ledger.last_success(key)

    def ledger_keys(self, prefix: str = "") -> list[str]:
        return self._ledger.ledger_keys(prefix)

    def holders(self, key: str) -> list[LeaseInfo]:
        slots, _, _ = read_slots(self._client, self._keys, key)
        return [info for _, info in with_infos(self._client, self._keys, slots)]

    def list(self, prefix: str = "", include_expired: bool = False) -> Iterator[LeaseInfo]:
        # etcd deletes a key with its lease: include_expired can only ever show live leases.
        # A key's slots follow its lock key: NUL sorts before any character of a key.
        start = self._keys.lock_key(prefix)
        end = prefix_end(start)
        while True:
            body = {"key": b64(start), "range_end": b64(end), "limit": str(LIST_PAGE)}
            reply = self._client.call(("/v3/kv/range", body))[0]
            kvs = reply.get("kvs", [])
            slots = [held for kv in kvs if (held := self._keys.slot_of(kv)) is not None]
            for _, info in with_infos(self._client, self._keys, slots):
                yield info
            if not reply.get("more") or not kvs:
                return
            start = unb64(kvs[-1]["key"]) + b"\0"

    def waiters(self, key: str) -> builtins.list[WaiterInfo]:
        return self._queue.waiters(key)

    def waiting_counts(self, prefix: str = "") -> dict[str, int]:
        return self._queue.counts(prefix)
