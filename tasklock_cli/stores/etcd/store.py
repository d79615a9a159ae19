"""The etcd store class: its txns and the interface methods (the overview is the
package's docstring)."""

from __future__ import annotations

import json
import math
import time
from typing import Any
from typing import NamedTuple

from tasklock_cli.errors import LimitMismatch
from tasklock_cli.errors import QueueFull
from tasklock_cli.errors import StoreUnavailable
from tasklock_cli.errors import Superseded
from tasklock_cli.errors import TasklockError
from tasklock_cli.stores.base import Store
from tasklock_cli.stores.etcd import CAPABILITIES
from tasklock_cli.stores.etcd import http
from tasklock_cli.stores.etcd.acquiring import SHARED_SLOTS_PER_TXN
from tasklock_cli.stores.etcd.acquiring import SLOTS_PER_TXN
from tasklock_cli.stores.etcd.acquiring import Taking
from tasklock_cli.stores.etcd.acquiring import acquire_txn
from tasklock_cli.stores.etcd.acquiring import free_slot
from tasklock_cli.stores.etcd.acquiring import has_free_slot
from tasklock_cli.stores.etcd.acquiring import taken_slot
from tasklock_cli.stores.etcd.breaks import SlotBreaker
from tasklock_cli.stores.etcd.connection import NOT_FOUND
from tasklock_cli.stores.etcd.connection import EtcdClient
from tasklock_cli.stores.etcd.connection import EtcdConfig
from tasklock_cli.stores.etcd.connection import EtcdError
from tasklock_cli.stores.etcd.connection import Watch
from tasklock_cli.stores.etcd.connection import b64
from tasklock_cli.stores.etcd.connection import new_lease_id
from tasklock_cli.stores.etcd.connection import parse_url
from tasklock_cli.stores.etcd.connection import revision
from tasklock_cli.stores.etcd.connection import ttl_seconds
from tasklock_cli.stores.etcd.connection import unb64
from tasklock_cli.stores.etcd.keys import EtcdKeys
from tasklock_cli.stores.etcd.keys import SlotKv
from tasklock_cli.stores.etcd.keys import decode_value
from tasklock_cli.stores.etcd.keys import family
from tasklock_cli.stores.etcd.keys import lease_value
from tasklock_cli.stores.etcd.keys import moves_to_lease
from tasklock_cli.stores.etcd.keys import range_op
from tasklock_cli.stores.etcd.ledger import EtcdLedger
from tasklock_cli.stores.etcd.ledger import LedgerAtAcquire
from tasklock_cli.stores.etcd.reads import EtcdReads
from tasklock_cli.stores.etcd.reads import read_slots
from tasklock_cli.stores.etcd.reads import with_infos
from tasklock_cli.stores.etcd.waiting import AHEAD
from tasklock_cli.stores.etcd.waiting import GONE
from tasklock_cli.stores.etcd.waiting import SUPERSEDED
from tasklock_cli.stores.etcd.waiting import WaiterQueue
from tasklock_cli.stores.etcd.waiting import poll_until
from tasklock_cli.stores.etcd.waiting import waiter_value
from tasklock_cli.stores.model import SHARED
from tasklock_cli.stores.model import Ask
from tasklock_cli.stores.model import Holder
from tasklock_cli.stores.model import Lease
from tasklock_cli.stores.model import LeaseInfo
from tasklock_cli.stores.model import RunRecord
from tasklock_cli.stores.model import breaker
from tasklock_cli.stores.model import breaker_of
from tasklock_cli.stores.urls import redact_url
from tasklock_cli.util import clock as clocks
from tasklock_cli.util.records import dataclass
from tasklock_cli.util.records import field
from tasklock_cli.util.times import utc_from_timestamp

#: ``list`` in the store class's body is its method: annotations there say builtins.list.
TYPE_CHECKING = False
if TYPE_CHECKING:
    import builtins

#: A spare lease is granted by a refused acquire and kept alive by the next ones.
#: One kept alive at most this long ago is attached as it is.
#: The acquire's exchange then has no keepalive: a woken waiter's acquire is its txn alone.
#: The lease's clock started at that keepalive.
#: So the holder's deadline counts from there (``lease_age``).
#: At most a quarter of the TTL, so that the lease taken has most of it left.
SPARE_FRESH_S = 2.0


class _Spare(NamedTuple):
    """A lease granted for an acquisition that did not take a slot, kept for the next."""

    lease_id: int
    ttl_s: int  # as asked
    granted: int  # the TTL etcd granted (or refreshed it to)
    refreshed_at: float  # clocks.monotonic() when that grant or keepalive was sent


@dataclass
class _Held:
    """What this client knows of a lease it holds."""

    lease_id: int
    value: bytes
    ttl: int  # as asked (etcd may have granted more)
    ledger: LedgerAtAcquire = field(default_factory=LedgerAtAcquire)
    broken: bool = False  # read back broken: its renewals fail, its release still frees it


class EtcdStore(EtcdReads, Store, capabilities=CAPABILITIES):
    waiting_trouble = (TasklockError, EtcdError, OSError, http.Woken)

    def __init__(self, config: EtcdConfig, display_url: str) -> None:
        self.display_url = display_url
        self.prefix = config.prefix
        self._client = EtcdClient(config, display_url)
        self._keys = EtcdKeys(config.prefix, display_url)
        self._ledger = EtcdLedger(self._client, self._keys)
        self._queue = WaiterQueue(self._client, self._keys, lambda: self.waiter_ttl)
        self._breaker = SlotBreaker(self._client, self._keys)
        self._held: dict[tuple[str, str, int], _Held] = {}
        self._spare: _Spare | None = None  # granted but not used
        self._ages: dict[tuple[str, str, int], float] = {}  # see lease_age
        self._watching: dict[str, Watch] = {}  # key -> the watch its waiter's look opened
        # keys whose wait ended on a release heard or a slot seen free (see _acquire)
        self._freed: set[str] = set()

    @classmethod
    def from_url(cls, url: str) -> EtcdStore:
        return cls(parse_url(url), redact_url(url))

    # -- acquire / renew / release ---------------------------------------------------

    def _acquire(
        self, key: str, ttl: float, holder: Holder, owner: str, limit: int, queue: bool, ask: Ask
    ) -> Lease | None:
        """Never ``QUEUED``: our places live in ``self._queue``, which the waits join and
        keep too (``waits_keep_places``), and which ``_leave_queue`` and ``_close`` leave
        (a revoke of the waiter lease at close: one write for every place)."""
        ttl_s = ttl_seconds(ttl, "lease TTL")
        start = 0  # the first slot the txn tries (past a txn's slots: where the read said)
        if queue and self._queue.place(key) is not None and key not in self._freed:
            # A waiter's look after a wait that heard no release: reads alone, which etcd
            # answers without a Raft write (a refused acquire's txn is one, fsync and all:
            # each waiting run would cost the cluster a disk write per try).
            looked = self._look(Taking(key, limit, owner, b"", 0, ttl_s, ask.mode))
            if not isinstance(looked, int):
                if looked is None:  # keeps our place (or takes a new one, if it lapsed)
                    value = waiter_value(holder, time.time(), ask)
                    self._queue.join(key, value, ask.mode, ask.front, ask.supersede, ask.priority)
                return looked
            start = looked
        self._freed.discard(key)
        per_txn = SHARED_SLOTS_PER_TXN if ask.mode == SHARED else SLOTS_PER_TXN
        tries, budget = 0, 3 + limit // per_txn
        while tries < budget:
            tries += 1
            lease_id, first, age = _lease_request(self._spare, ttl_s, clocks.monotonic())
            sent = time.time()
            value = lease_value(owner, holder, sent, ttl_s, limit)
            taking = Taking(key, limit, owner, value, lease_id, ttl_s, ask.mode)
            reads = [*self._keys.slot_reads(key), *self._queue.reads(key)]
            guards = self._queue.guard(key, ask.mode)
            extras = self._taking_extras(key)
            txn, plan = acquire_txn(self._keys, taking, start, extras, guards, reads)
            try:
                self._spare, reply, date = _exchange(self._client, self._spare, first, txn)
            except EtcdError as exc:
                if exc.code == NOT_FOUND or "lease" in exc.message.lower():
                    self._spare = None  # the spare lease ran out: grant a fresh one
                    continue
                raise self._client.translate(exc) from None
            if self._spare is None:
                continue
            slot, responses = taken_slot(reply, plan)
            if slot is not None:
                lease = self._taken(taking, slot, revision(reply), responses, date, sent, age)
                self._ages[(key, owner, lease.fencing_token)] = age
                return lease
            outcome = self._refused(taking, responses, sent)
            if not isinstance(outcome, int):
                if outcome is None and queue:
                    _refuse_if_full(self._queue, key, ask)
                    value = waiter_value(holder, sent, ask)
                    self._queue.join(key, value, ask.mode, ask.front, ask.supersede, ask.priority)
                return outcome
            if outcome >= start + per_txn:
                budget += 1  # past this txn's slots (shared ones have no limit): go on
            start = outcome  # a slot is free after all (freed meanwhile, or past this txn's)
        raise StoreUnavailable(f"{self.display_url}: could not get a lease from etcd for {key!r}")

    def _refused(
        self, taking: Taking, responses: list[dict[str, Any]], sent: float
    ) -> Lease | int | None:
        """What the reads of a refused acquire say (slots, then the queue's): our own lease
        (a lost reply), None (held, or a waiter ahead comes first), or the lowest free slot
        to try next. Raises Superseded (our place was) and LimitMismatch."""
        key, mode = taking.key, taking.mode
        slots, broken = self._keys.slots_from(responses[:2])
        outcome = _after_conflict(self._client, self._held, taking, (slots, broken), sent)
        if isinstance(outcome, Lease):
            self._queue.left(key)  # our taking (its reply lost) deleted our place
            return outcome
        verdict = self._queue.verdict(key, mode, responses[2:4])
        if verdict == SUPERSEDED:
            self._queue.left(key, wanted=False)
            raise Superseded(key)
        if verdict == GONE:  # our place lapsed: we are a caller without one now
            self._queue.lapsed(key)
            verdict = self._queue.verdict(key, mode, responses[2:4])
        if isinstance(outcome, int) and verdict == AHEAD:
            return None  # a slot is free, for a waiter ahead of us
        return outcome

    def _look(self, taking: Taking) -> Lease | int | None:
        """What a refused acquire would read, read in a txn without writes: as
        ``_refused`` tells it (a free slot is then taken by the acquire's own txn). The
        spare lease is kept alive in the same exchange when due, as an acquire would."""
        reads = [*self._keys.slot_reads(taking.key), *self._queue.reads(taking.key)]
        _, renewal, _ = _lease_request(self._spare, taking.ttl_s, clocks.monotonic())
        if renewal is not None and renewal[0][0] != "/v3/lease/keepalive":
            renewal = None  # no spare to keep alive: the acquire grants one with its txn
        txn = {"compare": [], "success": reads, "failure": []}
        try:
            self._spare, reply, _ = _exchange(self._client, self._spare, renewal, txn)
        except EtcdError as exc:
            raise self._client.translate(exc) from None
        return self._refused(taking, reply.get("responses", []), time.time())

    def lease_age(self, lease: Lease) -> float:
        """How long the etcd lease of ``lease`` had run its TTL when the acquire that took
        it began (see SPARE_FRESH_S): its holder's deadline counts from then."""
        return self._ages.pop((lease.key, lease.owner_token, lease.fencing_token), 0.0)

    def _taking_extras(self, key: str) -> list[dict[str, Any]]:
        """What a taking does besides: leave the key's queue, read the oldest ledger records."""
        extras = [self._ledger.oldest_runs_op(key)]
        entry = self._queue.entry_if_queued(key)
        if entry is not None:
            extras.insert(0, {"request_delete_range": {"key": b64(entry)}})
        return extras

    def _taken(
        self,
        taking: Taking,
        slot: int,
        token: int,
        responses: list[dict[str, Any]],
        date: str | None,
        sent: float,
        age: float,
    ) -> Lease:
        spare, self._spare = self._spare, None
        self._queue.left(taking.key)
        runs = responses[-1].get("response_range", {})
        oldest = [unb64(kv["key"]) for kv in runs.get("kvs", [])]
        ledger = LedgerAtAcquire(int(runs.get("count", 0)), oldest, date)
        known = _Held(taking.lease_id, taking.value, taking.ttl_s, ledger)
        self._held[(taking.key, taking.owner, token)] = known
        expires = utc_from_timestamp(sent - age + (spare.granted if spare else taking.ttl_s))
        acquired = utc_from_timestamp(sent)
        limit, mode = taking.limit, taking.mode
        return Lease(taking.key, taking.owner, token, acquired, expires, slot, limit, mode)

    def _held_lease(self, lease: Lease) -> _Held | None:
        """Our lease ID and value for ``lease``; read from etcd when this client did not
        acquire it. None when the slot is not held with this owner token and fencing token."""
        known = self._held.get((lease.key, lease.owner_token, lease.fencing_token))
        if known is not None:
            return known
        name = self._keys.slot_key(lease.key, lease.slot, lease.limit, lease.mode)
        mark = self._keys.broken_key(lease.key, lease.slot)
        reply = self._client.txn([], [range_op(name), range_op(mark)], [])
        slots, broken = self._keys.slots_from(reply.get("responses", []))
        mine = [held for held in slots if held.token == lease.fencing_token]
        if not mine or mine[0].owner != lease.owner_token:
            return None
        value = unb64(mine[0].kv.get("value"))
        ttl = int((decode_value(value) or {}).get("ttl", 0))
        return _Held(mine[0].lease_id, value, ttl, broken=lease.fencing_token in broken)

    def renew(self, lease: Lease, ttl: float) -> Lease:
        ttl_s = ttl_seconds(ttl, "lease TTL")
        ident = (lease.key, lease.owner_token, lease.fencing_token)
        held = self._held_lease(lease)
        if held is not None and held.broken:
            held = None  # on the breaker's lease now: not ours to keep alive
        sent = time.time()
        remaining = self._client.keepalive(held.lease_id) if held and held.lease_id else 0
        if held is not None and remaining > 0 and ttl_s != held.ttl:
            # An etcd lease keeps the TTL it was granted: another TTL takes a new lease.
            remaining = _move_own_lease(self._client, self._keys, lease, held, ttl_s)
        if held is None or remaining <= 0:
            self._held.pop(ident, None)
            return lease.renewed_until(None)
        return lease.renewed_until(utc_from_timestamp(sent + remaining))

    def release(self, lease: Lease, keep_for: float = 0.0, record: RunRecord | None = None) -> bool:
        ident = (lease.key, lease.owner_token, lease.fencing_token)
        self._ages.pop(ident, None)
        held = self._held_lease(lease)
        read = held.ledger if held is not None else None
        ledger = self._ledger.record_ops(record, read) if record is not None else []
        if held is None:
            if ledger:
                self._client.txn([], ledger, [])
            return False
        if keep_for > 0:
            # A broken lease (moved off our etcd lease) is let go at once instead.
            keep_s = ttl_seconds(keep_for, "keep-for time")
            released = _keep_done(self._client, self._keys, lease, held, keep_s, ledger) > 0
            released = released or _delete_as_owner(self._client, self._keys, lease, held, ledger)
        else:
            # Not a revoke of our lease: a break may have moved the key to another lease
            # the moment before, and a revoke would then report a release that freed
            # nothing. The emptied lease runs out on its own.
            released = _delete_as_owner(self._client, self._keys, lease, held, ledger)
        self._held.pop(ident, None)
        return released

    # -- reading ----------------------------------------------------------------------

    def sweep(self, dry_run: bool = False) -> int:
        # etcd deletes expired leases' keys itself; counters are revisions. Dead places in
        # queues (see waiting) are deleted (not counted: no leases); the read also tells an
        # unreachable store, instead of claiming success.
        if dry_run:
            self._client.call(("/v3/maintenance/status", {}))
        else:
            self._queue.sweep()
        return 0

    # -- forced release and breaking --------------------------------------------------

    def free_if_holder_gone(self, key: str, token: int) -> bool:
        """Only a lease kept after its command ended (``_done``) has nobody under it."""
        return _done(self._client, self._keys, key, token) and bool(self.force_release(key, token))

    def force_release(self, key: str, token: int | None = None) -> builtins.list[LeaseInfo]:
        return _revoke_slots(self._client, self._keys, key, token)

    def break_lease(
        self, key: str, token: int | None = None, by: Holder | None = None
    ) -> builtins.list[LeaseInfo]:
        slots, broken, _ = read_slots(self._client, self._keys, key)
        chosen = [held for held in slots if token is None or held.token == token]
        by_json = json.dumps(breaker(by)).encode()
        infos = [self._breaker.break_slot(held, held.token in broken, by_json) for held in chosen]
        return [info for info in infos if info is not None]

    def broken_by(self, lease: Lease) -> dict | None:
        return breaker_of(self._breaker.broken_by(lease))

    def wait_for_break(self, lease: Lease, timeout: float, wake_fd: int | None = None) -> bool:
        known = self._held.get((lease.key, lease.owner_token, lease.fencing_token))
        lease_id = known.lease_id if known else None
        return self._breaker.wait_for_break(lease, lease_id, timeout, wake_fd)

    # -- waiting (the skeleton is Store.wait_for_release; the queue is in waiting.py) --

    def _prepare_wait(self, key: str, deadline: float, wake_fd: int | None) -> bool:
        return self._queue.take_turn(key, deadline, wake_fd)

    def _time_until_free(self, key: str) -> float | None:
        stale = self._watching.pop(key, None)
        if stale is not None:
            stale.close()
        watch = self._client.open_watch(family(self._keys.lock_key(key)))  # before the look
        try:
            slots, _, _ = read_slots(self._client, self._keys, key)
            if has_free_slot(slots, self._queue.mode_of(key)):
                self._freed.add(key)
                watch.close()
                return None
            remaining = self._client.remaining_many(sorted({held.lease_id for held in slots}))
        except BaseException:
            watch.close()
            raise
        self._watching[key] = watch  # the wake-up's: nothing after the look is missed
        # The latest the key can go: whole seconds answered (the guess is their middle),
        # and the leader's expiry lag. Its deletion is what wakes the watch, earlier.
        return max(0.0, min(remaining.values(), default=0.0)) + 0.5 + self.expiry_lag

    def _await_wakeup(self, key: str, until: float, wake_fd: int | None) -> None:
        """Wait on the watch of every slot of ``key`` that ``_time_until_free`` opened."""
        if self._queue.await_release(self._watching.pop(key), until, wake_fd):
            self._freed.add(key)

    def _wait_after_trouble(self, key: str, deadline: float, wake_fd: int | None) -> None:
        _poll_for_a_free_slot(self._client, self._keys, self._queue, key, deadline, wake_fd)

    def _leave_queue(self, key: str, owner: str | None) -> None:
        self._queue.leave(key)

    # -- settings, diagnostics, closing -----------------------------------------------

    def set_io_timeout(self, seconds: float) -> None:
        if math.isfinite(seconds) and seconds > 0:
            self._client.members.io_timeout = seconds

    def _close(self) -> None:
        for watch in self._watching.values():
            watch.close()
        self._watching.clear()
        self._queue.close()
        self._client.members.close()


# -- reading slots ----------------------------------------------------------------------


def _poll_for_a_free_slot(
    client: EtcdClient,
    keys: EtcdKeys,
    queue: WaiterQueue,
    key: str,
    deadline: float,
    wake_fd: int | None,
) -> None:
    """Poll ``key`` until a slot is free (the watch failed), keeping our place meanwhile:
    a plain waiter's wait can outlast its waiter lease (QUIET_LOOK_CEILING_S)."""

    def free_now() -> bool:
        queue.keep_if_due()
        slots = read_slots(client, keys, key)[0]
        return has_free_slot(slots, queue.mode_of(key))

    poll_until(deadline, wake_fd, free_now)


def _lease_request(
    spare: _Spare | None, ttl_s: int, now: float
) -> tuple[int, tuple[tuple[str, dict[str, Any]], _Spare] | None, float]:
    """A lease for an acquisition begun at ``now`` (clocks.monotonic): (its ID; the
    request that grants it or keeps it alive, with the spare it makes; how long its TTL
    has been running). The spare one as it is while fresh (no request: see
    SPARE_FRESH_S), the spare one kept alive, or a new one."""
    if spare is not None and spare.ttl_s == ttl_s:
        age = now - spare.refreshed_at
        if 0 <= age <= min(SPARE_FRESH_S, ttl_s / 4) and spare.granted >= ttl_s:
            return spare.lease_id, None, age
        keepalive = ("/v3/lease/keepalive", {"ID": str(spare.lease_id)})
        return spare.lease_id, (keepalive, spare._replace(refreshed_at=now)), 0.0
    lease_id = new_lease_id()
    grant = ("/v3/lease/grant", {"ID": str(lease_id), "TTL": str(ttl_s)})
    return lease_id, (grant, _Spare(lease_id, ttl_s, 0, now)), 0.0


def _exchange(
    client: EtcdClient,
    spare: _Spare | None,
    first: tuple[tuple[str, dict[str, Any]], _Spare] | None,
    txn: dict[str, Any],
) -> tuple[_Spare | None, dict[str, Any], str | None]:
    """The acquire's exchange (``first``: the lease request sent before the txn, and the
    spare it makes): the spare lease after it (None when it is gone), the txn's reply and
    the member's Date."""
    requests = [("/v3/kv/txn", txn)] if first is None else [first[0], ("/v3/kv/txn", txn)]
    replies, date = client.members.call_dated(requests)
    if first is not None:  # granted or kept alive now: its TTL began with this call
        granted = replies[0].get("result", replies[0])
        spare = first[1]._replace(granted=int(granted.get("TTL", 0)))
    return (spare if spare is not None and spare.granted > 0 else None), replies[-1], date


def _after_conflict(
    client: EtcdClient,
    known_leases: dict[tuple[str, str, int], _Held],
    taking: Taking,
    read: tuple[list[SlotKv], set[int]],
    sent: float,
) -> Lease | int | None:
    """What the read of a refused acquire says of the slots (and the broken tokens): our
    own lease (a lost reply), None (the holders keep us out), or the lowest free slot to
    try next; raises LimitMismatch."""
    slots, broken = read
    for held in slots:
        if held.limit != taking.limit:
            raise LimitMismatch(taking.key, held.limit, taking.limit)
    for held in slots:
        if held.owner == taking.owner:
            if held.token in broken:
                return None  # broken: not even its owner may take it back
            return _own_lease(client, known_leases, taking.owner, held, sent)
    return free_slot(taking, slots)


def _own_lease(
    client: EtcdClient,
    known_leases: dict[tuple[str, str, int], _Held],
    owner_token: str,
    held: SlotKv,
    sent: float,
) -> Lease | None:
    """Our own acquisition whose reply was lost, read back (and noted in ``known_leases``);
    None when its lease ran out."""
    value = unb64(held.kv.get("value"))
    record = decode_value(value) or {}
    remaining = client.keepalive(held.lease_id) if held.lease_id else 0
    if remaining <= 0:
        return None
    known = _Held(held.lease_id, value, int(record.get("ttl", 0)))
    known_leases[(held.key, owner_token, held.token)] = known
    acquired = utc_from_timestamp(int(record.get("acquired_at", sent * 1000)) / 1000)
    expires = utc_from_timestamp(sent + remaining)
    return Lease(
        held.key, owner_token, held.token, acquired, expires, held.slot, held.limit, held.mode
    )


def _revoke_slots(
    client: EtcdClient, keys: EtcdKeys, key: str, token: int | None
) -> list[LeaseInfo]:
    """Revoke the leases of the chosen slots (revoking deletes their keys and tells the
    holder: its keepalive fails); a slot whose key moved meanwhile (a break) is read
    and revoked again."""
    freed: dict[int, LeaseInfo] = {}
    wanted: set[int] | None = None  # the tokens of the first read
    for _ in range(5):
        slots, _, _ = read_slots(client, keys, key)
        chosen = [held for held in slots if token is None or held.token == token]
        wanted = {held.token for held in chosen} if wanted is None else wanted
        left = [held for held in chosen if held.token in wanted - freed.keys()]
        if not left:
            break
        for held, info in with_infos(client, keys, left):
            if held.lease_id and client.revoke(held.lease_id):
                freed[held.token] = info
        if wanted <= freed.keys():
            break
    return sorted(freed.values(), key=lambda info: info.slot)


def _delete_as_owner(
    client: EtcdClient, keys: EtcdKeys, lease: Lease, held: _Held, ledger: list[dict]
) -> bool:
    """Delete the slot's keys if still ours by value and fencing token (our lease may be
    gone: broken, or a release whose reply was lost); ``ledger`` ops run either way."""
    names = [
        *keys.slot_names(lease.key, lease.slot, lease.limit, lease.owner_token, lease.mode),
        keys.broken_key(lease.key, lease.slot),
        keys.broken_by_key(lease.key, lease.slot),
    ]
    success = [{"request_delete_range": {"key": b64(name)}} for name in names]
    reply = client.txn(_owner_compare(keys, lease, held.value), success + ledger, ledger)
    return bool(reply.get("succeeded"))


def _keep_done(
    client: EtcdClient, keys: EtcdKeys, lease: Lease, held: _Held, ttl_s: int, ledger: list[dict]
) -> int:
    """Keep our lease ``ttl_s`` after its command ended (--hold-at-least).

    - It moves to a new etcd lease, as ``_move_own_lease`` does.
    - Its slot key's value is marked ``done``.
      A break moves the key as it is, so it keeps the mark.

    Returns the new lease's TTL, 0 when the lease is no longer ours."""
    record = decode_value(held.value)
    value = held.value if record is None else _json_done(record)
    return _move_own_lease(client, keys, lease, held, ttl_s, ledger, value)


def _json_done(record: dict[str, Any]) -> bytes:
    return json.dumps({**record, "done": True}, sort_keys=True).encode()


def _done(client: EtcdClient, keys: EtcdKeys, key: str, token: int) -> bool:
    """Is the live lease on ``key`` with fencing ``token`` one kept after its command ended
    (``_keep_done``)? Nothing runs under it, and its holder has exited."""
    for held in read_slots(client, keys, key)[0]:
        if held.token == token:
            record = decode_value(unb64(held.kv.get("value")))
            return record is not None and record.get("done") is True
    return False


def _move_own_lease(
    client: EtcdClient,
    keys: EtcdKeys,
    lease: Lease,
    held: _Held,
    ttl_s: int,
    ledger: list[dict] | None = None,
    value: bytes | None = None,
) -> int:
    """Move our slot's keys to a new lease of ``ttl_s`` (grant and txn pipelined),
    revoke the old one; the new lease's TTL, 0 when the slot was no longer ours.
    ``ledger`` ops run in the txn either way; ``value``: the slot key's new value."""
    new_id = new_lease_id()
    name = b64(keys.slot_key(lease.key, lease.slot, lease.limit, lease.mode))
    compare = [
        *_owner_compare(keys, lease, held.value),
        {"key": name, "target": "LEASE", "lease": str(held.lease_id)},
    ]
    names = keys.slot_names(lease.key, lease.slot, lease.limit, lease.owner_token, lease.mode)
    moves = moves_to_lease(names, new_id)
    if value is not None:  # names[0] is the slot key
        moves[0] = {"request_put": {"key": name, "value": b64(value), "lease": str(new_id)}}
    txn = {
        "compare": compare,
        "success": [*moves, *(ledger or [])],
        "failure": list(ledger or []),
    }
    granted = client.on_new_lease(new_id, ttl_s, txn)
    if granted is None:
        return 0
    client.revoke(held.lease_id)
    held.lease_id, held.ttl = new_id, ttl_s
    return int(granted.get("TTL", 0))


def _owner_compare(keys: EtcdKeys, lease: Lease, value: bytes) -> list[dict[str, Any]]:
    """Compares that hold while the lease's slot is still its owner's."""
    name = b64(keys.slot_key(lease.key, lease.slot, lease.limit, lease.mode))
    return [
        {"key": name, "target": "CREATE", "create_revision": str(lease.fencing_token)},
        {"key": name, "target": "VALUE", "value": b64(value)},
    ]


def _refuse_if_full(queue: WaiterQueue, key: str, ask: Ask) -> None:
    """``--max-waiting``: QueueFull when we have no place and the queue, as the refused
    acquire's txn read it, is that long (two runs joining at the same instant may both
    join: a txn cannot count a range)."""
    cap = ask.max_waiting
    if cap is not None and queue.place(key) is None and queue.length(key) >= cap:
        raise QueueFull(key, cap)
