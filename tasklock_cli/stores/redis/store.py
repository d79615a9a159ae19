"""The Redis store class: the interface methods and their queries (the overview is the
package's docstring)."""

from __future__ import annotations

import contextlib
import json
import math
from typing import Any

import redis

from tasklock_cli.errors import ConfigError
from tasklock_cli.errors import FencingExhausted
from tasklock_cli.errors import LimitMismatch
from tasklock_cli.errors import QueueFull
from tasklock_cli.errors import StoreUnavailable
from tasklock_cli.errors import Superseded
from tasklock_cli.errors import TasklockError
from tasklock_cli.stores import rows as row_parsing
from tasklock_cli.stores.base import Store
from tasklock_cli.stores.failover import DEFAULT_TTL_S
from tasklock_cli.stores.failover import Quarantines
from tasklock_cli.stores.failover import fresh_server_text
from tasklock_cli.stores.failover import quarantine_text
from tasklock_cli.stores.model import BROKEN_OWNER_PREFIX
from tasklock_cli.stores.model import SHARED
from tasklock_cli.stores.model import Ask
from tasklock_cli.stores.model import Holder
from tasklock_cli.stores.model import Lease
from tasklock_cli.stores.model import LeaseInfo
from tasklock_cli.stores.model import RunRecord
from tasklock_cli.stores.model import breaker
from tasklock_cli.stores.model import breaker_of
from tasklock_cli.stores.model import place_record as model_place_record
from tasklock_cli.stores.queueing import QUEUED
from tasklock_cli.stores.queueing import Queued
from tasklock_cli.stores.redis import CAPABILITIES
from tasklock_cli.stores.redis.breaks import open_break_subscription
from tasklock_cli.stores.redis.connection import RedisConnection
from tasklock_cli.stores.redis.connection import split_url
from tasklock_cli.stores.redis.connection import wait_replicas
from tasklock_cli.stores.redis.epochs import mark_new
from tasklock_cli.stores.redis.epochs import met_quarantine
from tasklock_cli.stores.redis.epochs import quarantine_state
from tasklock_cli.stores.redis.keys import DEFAULT_PREFIX
from tasklock_cli.stores.redis.keys import RedisKeys
from tasklock_cli.stores.redis.queue import place_mode
from tasklock_cli.stores.redis.queue import place_record
from tasklock_cli.stores.redis.reads import RedisReads
from tasklock_cli.stores.redis.reads import lease_info_of
from tasklock_cli.stores.redis.reads import scan
from tasklock_cli.stores.redis.waiting import WAITING_TROUBLE
from tasklock_cli.stores.redis.waiting import RedisWakeLists
from tasklock_cli.stores.urls import redact_url
from tasklock_cli.stores.watches import BreakWatches
from tasklock_cli.util.times import utc_from_timestamp

#: ``list`` in the store class's body is its method: annotations there say builtins.list.
TYPE_CHECKING = False
if TYPE_CHECKING:
    import builtins

#: Lease hashes per script call of a sweep.
SWEEP_BATCH = 500


def _record_json(record: RunRecord | None) -> str:
    """The run's ledger entry without ``ended_at``, which the release script appends
    (so it must end with ``}``); '' for no record."""
    if record is None:
        return ""
    started_ms = math.floor(record.started_at.timestamp() * 1000)
    return json.dumps(
        {"fencing_token": record.fencing_token, "started_at": started_ms, **record.fields()}
    )


def _ttl_ms(seconds: float, what: str) -> int:
    if not math.isfinite(seconds) or seconds <= 0:
        raise ConfigError(f"the {what} must be a positive, finite duration (got {seconds!r})")
    return max(1, math.ceil(seconds * 1000))


class RedisStore(RedisReads, Store, capabilities=CAPABILITIES):
    waiting_trouble = WAITING_TROUBLE

    def __init__(
        self,
        url: str,
        prefix: str = DEFAULT_PREFIX,
        display_url: str | None = None,
        wait_replicas: int = 0,
    ):
        self.prefix = prefix
        self.display_url = display_url or redact_url(url)
        self._names = RedisKeys(prefix)
        self._conn = RedisConnection(url, self.display_url, self._names, wait_replicas)
        # (a lease the replicas confirmed survives a promotion, its TTL and the longest too)
        self.failover_window = None if wait_replicas else DEFAULT_TTL_S
        self._wake_lists = RedisWakeLists(self._conn)
        #: The mode of our last acquire of each key, for its wait (see _time_until_free).
        self._place_modes: dict[str, str] = {}
        self._quarantines = Quarantines()  # the failover quarantines our acquires met
        self._break_watches = BreakWatches(
            lambda lease: open_break_subscription(self._conn, lease), WAITING_TROUBLE
        )

    @classmethod
    def from_url(cls, url: str) -> RedisStore:
        clean, prefix, _ = split_url(url)
        replicas = wait_replicas(url)
        return cls(clean, prefix=prefix, display_url=redact_url(url), wait_replicas=replicas)

    def set_io_timeout(self, seconds: float) -> None:
        self._conn.set_io_timeout(seconds)

    # -- the interface --------------------------------------------------------------

    def _acquire(
        self, key: str, ttl: float, holder: Holder, owner: str, limit: int, queue: bool, ask: Ask
    ) -> Lease | Queued | None:
        names = self._names
        keys = [names.lease(key), *(names.name(key, part) for part in ("fence", "wake", "limit"))]
        keys.append(names.epoch_record())
        args = [
            owner,
            _ttl_ms(ttl, "lease TTL"),
            json.dumps(model_place_record(holder, ask)),
            limit,
        ]
        args += ["1" if queue else "", _ttl_ms(self.waiter_ttl, "waiter TTL")]
        args += ["shared" if ask.mode == SHARED else "", "1" if ask.supersede else ""]
        args += ["1" if ask.front else "", place_record(holder, ask)]
        args.append(self._conn.durability())
        args += [str(int(ask.priority)), "" if ask.max_waiting is None else ask.max_waiting]
        confirmed = None
        if self._conn.wait_replicas:
            result, confirmed = self._conn.script_and_wait("acquire", keys, args, key)
        else:
            result = self._conn.script("acquire", keys, args, key)
        self._place_modes[key] = ask.mode
        if met_quarantine(self._quarantines, key, result):
            return None
        if result is None:  # held: a queued caller joined or kept its place
            return QUEUED if queue else None
        _raise_refusal(result, key, limit, ask)
        token, acquired_ms, expires_ms, slot = (int(v) for v in result)
        acquired_at = utc_from_timestamp(acquired_ms / 1000)
        expires_at = utc_from_timestamp(expires_ms / 1000)
        lease = Lease(key, owner, token, acquired_at, expires_at, slot, limit, ask.mode)
        if confirmed is not None and confirmed < self._conn.wait_replicas:
            self._unconfirmed(lease, confirmed)
        return lease

    def _unconfirmed(self, lease: Lease, confirmed: int) -> None:
        """The acquire's writes reached fewer replicas than ``wait_replicas=`` asks: a
        failover could lose the lease. Give it back and report the store unavailable."""
        with contextlib.suppress(TasklockError):
            self.release(lease)
        raise StoreUnavailable(
            f"{self.display_url}: only {confirmed} of the {self._conn.wait_replicas} replicas "
            "that wait_replicas= asks for confirmed the lease in time; it was given back"
        )

    def holdup(self, key: str) -> str | None:
        return _quarantine_text(self._quarantines.left(key), self._quarantines.cause(key))

    def quarantine(self) -> str | None:
        return _quarantine_text(*quarantine_state(self._conn))

    def renew(self, lease: Lease, ttl: float) -> Lease:
        keys = [self._names.lease(lease.key, lease.slot), self._names.name(lease.key, "limit")]
        args = [lease.owner_token, lease.fencing_token, _ttl_ms(ttl, "lease TTL")]
        args.append(_slots_covered(lease))
        # (with wait_replicas=, a renewal fewer replicas confirm fails: an old primary cut
        # off from its replicas, which a failover left behind, keeps no holder alive)
        result = self._conn.confirmed_script("renew", keys, args, lease.key, "the renewal")
        return lease.renewed_until(
            None if result is None else utc_from_timestamp(int(result) / 1000)
        )

    def release(self, lease: Lease, keep_for: float = 0.0, record: RunRecord | None = None) -> bool:
        keep_ms = _ttl_ms(keep_for, "keep-for time") if keep_for > 0 else 0
        script = self._conn.scripts["release"]
        attempts = 0
        parts = ("wake", "runs", "success", "limit")
        keys = [self._names.lease(lease.key, lease.slot)]
        keys += [self._names.name(lease.key, part) for part in parts]
        keys.append(self._names.lease(lease.key))
        succeeded = "1" if record is not None and record.outcome == "succeeded" else ""
        args: list[str | int] = [
            lease.owner_token,
            lease.fencing_token,
            keep_ms,
            _record_json(record),
            succeeded,
        ]
        args.append(_slots_covered(lease))

        def run(client: redis.Redis) -> Any:
            nonlocal attempts
            attempts += 1
            return script(keys=keys, args=args, client=client)

        self._break_watches.drop(lease)
        result = int(self._conn.call(run, lease.key))
        if result == 1:
            return True
        # No lease at all on a second attempt: the first one may have deleted it before its
        # reply was lost. Either way nobody holds the key in our name or anyone else's.
        return result == 0 and attempts > 1 and keep_ms == 0

    def time_left(self, key: str, fencing_token: int) -> float | None:
        for row in self._slots(key):
            if row[1] == str(fencing_token).encode():
                broken, pttl = int(row[7]), int(row[6])
                return None if broken or pttl <= 0 else pttl / 1000
        return None

    def sweep(self, dry_run: bool = False) -> int:
        # Expired leases vanish by themselves (PX) and there is no index to prune; counters
        # are never touched. A lease hash whose expiry cannot be read (no PX: it would never
        # vanish) gets a bounded one (scripts.BOUND_EXPIRIES), and then vanishes as others
        # do. (The SCAN also tells an unreachable store, instead of claiming success.)
        pattern = self._names.pattern("", b"lease*")
        scanned = self._conn.call(lambda c: scan(c, pattern))
        names = [name for name in scanned if self._names.slot_of(name) is not None]
        if not dry_run:
            record = self._names.epoch_record()
            for start in range(0, len(names), SWEEP_BATCH):
                batch = [record, *names[start : start + SWEEP_BATCH]]
                self._conn.script("bound_expiries", batch, [], None)
        return 0

    def break_lease(
        self, key: str, token: int | None = None, by: Holder | None = None
    ) -> builtins.list[LeaseInfo]:
        more_keys = [self._names.epoch_record()]
        return self._each_slot("break", key, token, more_keys, [json.dumps(breaker(by))])

    def broken_by(self, lease: Lease) -> dict | None:
        name = self._names.lease(lease.key, lease.slot)
        fields = ("owner", "fencing_token", "broken_by")
        owner, token, by = self._conn.call(lambda c: c.hmget(name, fields), lease.key)
        ours = (BROKEN_OWNER_PREFIX + lease.owner_token).encode()
        if owner != ours or token != str(lease.fencing_token).encode():
            return None
        return breaker_of(by)

    def free_if_holder_gone(self, key: str, token: int) -> bool:
        """Only a lease kept after its command ended (``_done``) has nobody under it."""
        return _done(self, key, token) and bool(self.force_release(key, token))

    def force_release(self, key: str, token: int | None = None) -> builtins.list[LeaseInfo]:
        return self._each_slot("force_release", key, token, [self._names.name(key, "wake")])

    def _each_slot(
        self,
        script: str,
        key: str,
        token: int | None,
        more_keys: builtins.list[bytes],
        more_args: builtins.list[str] | None = None,
    ) -> builtins.list[LeaseInfo]:
        """Break or force release the live slots with ``token`` (None: all); what they were."""
        name = self._names.lease(key)
        keys = [name, self._names.name(key, "limit"), *more_keys]
        args = ["" if token is None else token, self._names.break_channel(key), *(more_args or [])]
        flats = self._conn.script(script, keys, args, key)
        return [self._info(key, name, dict(zip(f[0::2], f[1::2], strict=True))) for f in flats]

    def wait_for_break(self, lease: Lease, timeout: float, wake_fd: int | None = None) -> bool:
        """A subscription to the lease's break channel (see ``breaks``)."""
        return self._break_watches.wait(lease, timeout, wake_fd)

    # -- waiting for a release: the skeleton is Store.wait_for_release, the wake lists are
    # in waiting; a waiter's place in the queue is kept by its acquire (nothing to prepare).

    def _time_until_free(self, key: str) -> float | None:
        """None while a slot is free for us (see Store); else the PTTL of the first live
        slot to run out that keeps us out (nobody pushes a wake-up for an expiry)."""
        quarantine_left = self._quarantines.left(key)
        if quarantine_left > 0:
            return quarantine_left
        rows = self._slots(key)
        exclusive = [row for row in rows if row[8] != SHARED.encode()]
        if self._place_modes.get(key) == SHARED:
            if exclusive:
                return _first_expiry(exclusive)
            ahead, *places = self._queue(key, self._queue_place(key) or "")
            readers = all(place_mode(place) == SHARED for place in places[: int(ahead)])
            return None if readers else self.waiter_ttl
        limit = max((row_parsing.as_integer(row[5] or 1) or 1 for row in rows), default=1)
        if len(rows) < limit and len(exclusive) == len(rows):  # (shared ones keep us out)
            ahead = int(self._queue(key, self._queue_place(key) or "")[0])
            free = limit - len(rows) if rows else 1  # (a free key's limit: the next taker's)
            return None if ahead < free else self.waiter_ttl
        return _first_expiry(rows)

    def _await_wakeup(self, key: str, until: float, wake_fd: int | None) -> None:
        """On our own wake list while we have a place in the queue (a release wakes the
        head of the queue), else on the key's."""
        wake = self._names.name(key, "wake")
        owner = self._queue_place(key)
        if owner is not None:
            wake += b":" + owner.encode()
        self._wake_lists.await_wakeup(key, until, wake_fd, wake)

    def _leave_queue(self, key: str, owner: str | None) -> None:
        if owner is None:
            return
        names = self._names
        keys = [names.lease(key), names.name(key, "wake"), names.name(key, "limit")]
        with contextlib.suppress(TasklockError):
            self._conn.script("leave", keys, [owner], key)

    # -- schema and diagnostics --------------------------------------------------------

    def init_schema(self) -> str | None:
        """No schema (keys appear on first use): marks the namespace new (``epochs``)."""
        return mark_new(self._conn)

    def _close(self) -> None:
        self._wake_lists.close()
        self._break_watches.close()
        self._conn.close()

    # -- records ----------------------------------------------------------------------

    def _info(self, key: str, name: bytes, data: dict[bytes, bytes]) -> LeaseInfo:
        fields = [b"fencing_token", b"acquired_at", b"expires_at", b"holder", b"limit"]
        fields += [b"mode", b"done"]
        slot = data.get(b"slot") or 0  # (read by rows: a forged "x" is malformed)
        return lease_info_of(key, slot, *(data.get(field) for field in fields))


def _quarantine_text(left: float, cause: str) -> str | None:
    """What a quarantine with ``left`` seconds to run for ``cause`` means; None when over."""
    if cause == "fresh":
        return fresh_server_text("this Redis server", "namespace", left)
    change = "the Redis primary changed (a failover, or a restart that may have lost writes)"
    return quarantine_text(change, "namespace", left)


def _first_expiry(rows: list[list[Any]]) -> float:
    """Seconds until the first of these slots runs out (``RedisStore._slots``' rows)."""
    pttls = [int(row[6]) for row in rows if int(row[6]) >= 0]
    return min(pttls) / 1000 if pttls else math.inf


def _done(store: RedisStore, key: str, token: int) -> bool:
    """Is the live lease on ``key`` with fencing ``token`` one kept after its command ended
    (--hold-at-least: ``done`` in its hash)? Nothing runs under it, and its holder has
    exited."""
    slots = [int(row[0]) for row in store._slots(key) if row[1] == str(token).encode()]
    if not slots:
        return False
    name = store._names.lease(key, slots[0])
    held, done = store._conn.call(lambda c: c.hmget(name, ("fencing_token", "done")), key)
    return held == str(token).encode() and done == b"1"


def _slots_covered(lease: Lease) -> int:
    """How many slots the key's limit record must cover while ``lease`` is live: its
    limit, or for a shared lease, its slot's and those below."""
    return lease.slot + 1 if lease.mode == SHARED else lease.limit


def _raise_refusal(result: list, key: str, limit: int, ask: Ask) -> None:
    """The acquire script's refusals, raised: superseded, the queue full (--max-waiting),
    another limit, no next token. Nothing for a lease."""
    if result[0] == b"superseded":
        raise Superseded(key)
    if result[0] == b"full":
        raise QueueFull(key, ask.max_waiting or 0)
    if result[0] == b"limit":
        raise LimitMismatch(key, int(result[1]), limit)
    if result[0] == b"exhausted":
        raise FencingExhausted(key)
