"""The memory store: the store contract kept in a dict, under one lock per space.

Expiry runs on the space's clock (``SystemClock``, or a test's ``ManualClock``): a lease is
live while its ``expires`` is ahead of ``clock()``. Slots are dropped when freed; the
fencing counter of a key lives apart (``Space.counters``) and only grows.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime

from tasklock_cli.errors import ConfigError
from tasklock_cli.errors import FencingExhausted
from tasklock_cli.errors import LimitMismatch
from tasklock_cli.errors import QueueFull
from tasklock_cli.errors import Superseded
from tasklock_cli.stores.base import Store
from tasklock_cli.stores.memory import CAPABILITIES
from tasklock_cli.stores.memory.connection import Place
from tasklock_cli.stores.memory.connection import Slot
from tasklock_cli.stores.memory.connection import Space
from tasklock_cli.stores.memory.connection import space_named
from tasklock_cli.stores.memory.ledger import MemoryLedger
from tasklock_cli.stores.model import EXCLUSIVE
from tasklock_cli.stores.model import MAX_FENCING_TOKEN
from tasklock_cli.stores.model import SHARED
from tasklock_cli.stores.model import WAITER_HORIZON_S
from tasklock_cli.stores.model import Ask
from tasklock_cli.stores.model import Holder
from tasklock_cli.stores.model import Lease
from tasklock_cli.stores.model import LeaseInfo
from tasklock_cli.stores.model import RunRecord
from tasklock_cli.stores.model import WaiterInfo
from tasklock_cli.stores.model import breaker
from tasklock_cli.stores.queueing import QUEUED
from tasklock_cli.stores.queueing import Queued
from tasklock_cli.util.clock import SystemClock
from tasklock_cli.util.times import utc_from_timestamp

TYPE_CHECKING = False
if TYPE_CHECKING:
    import builtins


class MemoryStore(MemoryLedger, Store, capabilities=CAPABILITIES):
    """Leases in this process (see the package's docstring)."""

    # A look is a dict read here: the polling defaults look often (a break is heard within
    # 5 ms, as the contract asks of every store: 20 ms polls missed its 20 ms median).
    break_poll_s = 0.005
    release_poll_s = 0.05

    def __init__(self, name: str = "") -> None:
        self.name = name
        self.display_url = f"memory://{name}"
        self.space: Space = space_named(name)

    @classmethod
    def from_url(cls, url: str) -> MemoryStore:
        rest = url.removeprefix("memory://")
        name, _, query = rest.partition("?")
        if query:
            names = ", ".join(sorted({part.partition("=")[0] for part in query.split("&")}))
            raise ConfigError(f"the memory store takes no URL parameters (got {names})")
        return cls(name)

    def use_clock(self, clock: SystemClock) -> None:
        """Keep time by ``clock`` (a ``ManualClock``), for every store of this space."""
        self.space.use_clock(clock)

    # -- time ------------------------------------------------------------------------

    def _now(self) -> float:
        return self.space.clock()

    def _utc(self, moment: float) -> datetime:
        return utc_from_timestamp(self.space.wall_at(moment))

    def _live(self, key: str) -> dict[int, Slot]:
        now = self._now()
        return {n: s for n, s in self.space.leases.get(key, {}).items() if s.expires > now}

    # -- acquiring --------------------------------------------------------------------

    def _acquire(
        self, key: str, ttl: float, holder: Holder, owner: str, limit: int, queue: bool, ask: Ask
    ) -> Lease | Queued | None:
        with self.space.lock:
            self._clear_dead_places(key)
            places = self.space.places.setdefault(key, {})
            mine = places.get(owner)
            if mine is not None and mine.superseded:
                del places[owner]
                raise Superseded(key)
            lease = self._take(key, ttl, holder, owner, limit, ask)
            if lease is not None or not queue:
                places.pop(owner, None)
                return lease
            self._keep_place(key, holder, owner, ask)
            return QUEUED

    def _take(
        self, key: str, ttl: float, holder: Holder, owner: str, limit: int, ask: Ask
    ) -> Lease | None:
        """The lease ``owner`` holds or may take now; None when its turn has not come."""
        live = self._live(key)
        for slot in live.values():
            if slot.owner == owner:  # a retry after a lost reply: the same lease, unbroken
                return None if slot.broken else self._lease(key, slot, live_slot_number(live, slot))
        number = self._free_slot(key, live, owner, limit, ask.mode)
        if number is None:
            return None
        token = self.space.counters.get(key, 0) + 1
        if token > MAX_FENCING_TOKEN:
            raise FencingExhausted(key)
        now = self._now()
        slot = Slot(owner, token, holder, self.space.wall_at(now), now + ttl, limit, ask.mode)
        self.space.counters[key] = token
        self.space.leases.setdefault(key, {})[number] = slot
        return self._lease(key, slot, number)

    def _free_slot(
        self, key: str, live: dict[int, Slot], owner: str, limit: int, mode: str
    ) -> int | None:
        """The slot ``owner`` may take now (first come, first served), or None."""
        others = {s.limit for s in live.values() if s.limit != limit}
        if others:
            raise LimitMismatch(key, others.pop(), limit)
        ahead = self._ahead(key, owner)
        if mode == SHARED:
            if any(s.mode == EXCLUSIVE for s in live.values()):
                return None
            if any(p.mode == EXCLUSIVE for p in ahead):
                return None
            return lowest_free(live, None)
        if any(s.mode == SHARED for s in live.values()):
            return None
        free = limit - len(live)
        if len(ahead) >= free:
            return None
        return lowest_free(live, limit)

    def _ahead(self, key: str, owner: str) -> list[Place]:
        """The counted places ahead of ``owner``'s (all of them when it has none)."""
        now = self._now()
        places = self.space.places.get(key, {})
        mine = places.get(owner)
        return [
            p
            for p in places.values()
            if p.owner != owner
            and p.expires > now
            and not p.superseded
            and (mine is None or p.order < mine.order)
        ]

    def _keep_place(self, key: str, holder: Holder, owner: str, ask: Ask) -> None:
        """Join ``key``'s queue (at its front, or by priority, then arrival), or keep our
        place there."""
        places, now = self.space.places[key], self._now()
        mine = places.get(owner)
        if mine is not None:
            mine.expires = now + self.waiter_ttl
            return
        if ask.max_waiting is not None and len(self._ahead(key, owner)) >= ask.max_waiting:
            raise QueueFull(key, ask.max_waiting)
        if ask.supersede:
            for place in places.values():
                if place.supersede:
                    place.superseded = True
        seq = next(self.space.sequence)
        front = min((p.order[0] for p in places.values()), default=0) - 1 if ask.front else 0
        since = self.space.wall_at(now)
        order = (front, 0 if ask.front else -ask.priority, seq)
        places[owner] = Place(
            owner,
            holder,
            since,
            now + self.waiter_ttl,
            order,
            ask.mode,
            ask.supersede,
            priority=ask.priority,
        )

    def _clear_dead_places(self, key: str) -> None:
        now = self._now()
        places = self.space.places.get(key, {})
        for owner, place in list(places.items()):
            if not now < place.expires <= now + WAITER_HORIZON_S:
                del places[owner]

    def _lease(self, key: str, slot: Slot, number: int) -> Lease:
        return Lease(
            key,
            slot.owner,
            slot.fencing_token,
            utc_from_timestamp(slot.acquired_at),
            self._utc(slot.expires),
            slot=number,
            limit=slot.limit,
            mode=slot.mode,
        )

    # -- holding -----------------------------------------------------------------------

    def _own(self, lease: Lease) -> Slot | None:
        """The live slot of ``lease``, when it is still ours (broken or not)."""
        slot = self._live(lease.key).get(lease.slot)
        if slot is None or slot.owner != lease.owner_token:
            return None
        return slot if slot.fencing_token == lease.fencing_token else None

    def renew(self, lease: Lease, ttl: float) -> Lease:
        with self.space.lock:
            slot = self._own(lease)
            if slot is None or slot.broken or slot.kept:
                return lease.renewed_until(None)
            slot.expires = self._now() + ttl
            return lease.renewed_until(self._utc(slot.expires))

    def release(self, lease: Lease, keep_for: float = 0.0, record: RunRecord | None = None) -> bool:
        with self.space.lock:
            slot = self._own(lease)
            if slot is not None and keep_for > 0 and not slot.broken:
                slot.expires, slot.kept = self._now() + keep_for, True
            elif slot is not None:
                del self.space.leases[lease.key][lease.slot]
            if record is not None:
                self._record(record)
            return slot is not None

    def time_left(self, key: str, fencing_token: int) -> float | None:
        with self.space.lock:
            for slot in self._live(key).values():
                if slot.fencing_token == fencing_token and not slot.broken:
                    return max(0.0, slot.expires - self._now())
            return None

    # -- looking -----------------------------------------------------------------------

    def holders(self, key: str) -> list[LeaseInfo]:
        with self.space.lock:
            return [self._info(key, n, s, False) for n, s in sorted(self._live(key).items())]

    def _info(self, key: str, number: int, slot: Slot, expired: bool) -> LeaseInfo:
        lease = self._lease(key, slot, number)
        return LeaseInfo(
            key,
            slot.holder,
            lease.fencing_token,
            lease.acquired_at,
            lease.expires_at,
            expired,
            slot=number,
            limit=lease.limit,
            mode=lease.mode,
        )

    def waiters(self, key: str) -> list[WaiterInfo]:
        with self.space.lock:
            counted = self._ahead(key, "")
            counted.sort(key=lambda place: place.order)
            return [_waiter(place) for place in counted]

    def waiting_counts(self, prefix: str = "") -> dict[str, int]:
        with self.space.lock:
            counts = {key: len(self._ahead(key, "")) for key in self.space.places}
            return {k: n for k, n in sorted(counts.items()) if n and k.startswith(prefix)}

    def list(self, prefix: str = "", include_expired: bool = False) -> Iterator[LeaseInfo]:
        with self.space.lock:
            now, shown = self._now(), []
            for key in sorted(k for k in self.space.leases if k.startswith(prefix)):
                for number, slot in sorted(self.space.leases[key].items()):
                    expired = slot.expires <= now
                    if include_expired or not expired:
                        shown.append(self._info(key, number, slot, expired))
        yield from shown

    def sweep(self, dry_run: bool = False) -> int:
        with self.space.lock:
            now, removed = self._now(), 0
            for key, slots in self.space.leases.items():
                for number in [n for n, s in slots.items() if s.expires <= now]:
                    removed += 1
                    if not dry_run:
                        del slots[number]
                if not dry_run:
                    self._clear_dead_places(key)
            return removed

    # -- breaking ----------------------------------------------------------------------

    def _matching(self, key: str, token: int | None) -> builtins.list[tuple[int, Slot]]:
        live = sorted(self._live(key).items())
        return [(n, s) for n, s in live if token is None or s.fencing_token == token]

    def break_lease(
        self, key: str, token: int | None = None, by: Holder | None = None
    ) -> builtins.list[LeaseInfo]:
        with self.space.lock:
            broken = []
            for number, slot in self._matching(key, token):
                broken.append(self._info(key, number, slot, False))
                if not slot.broken:
                    slot.broken, slot.broken_by = True, breaker(by)
            return broken

    def broken_by(self, lease: Lease) -> dict | None:
        with self.space.lock:
            slot = self._own(lease)
            return slot.broken_by if slot is not None and slot.broken else None

    def free_if_holder_gone(self, key: str, token: int) -> bool:
        """A lease kept after its holder released it (``keep_for``) is freed; a holder in
        this process is never gone while the process runs."""
        with self.space.lock:
            kept = [s for _, s in self._matching(key, token) if s.kept]
            return bool(kept) and bool(self.force_release(key, token))

    def force_release(self, key: str, token: int | None = None) -> builtins.list[LeaseInfo]:
        with self.space.lock:
            freed = []
            for number, slot in self._matching(key, token):
                freed.append(self._info(key, number, slot, False))
                del self.space.leases[key][number]
            return freed

    # -- waiting (the base class's polling) ---------------------------------------------

    def _time_until_free(self, key: str) -> float | None:
        with self.space.lock:
            owner = self._queue_place(key) or ""
            place = self.space.places.get(key, {}).get(owner)
            mode = place.mode if place is not None else EXCLUSIVE
            ahead, live = self._ahead(key, owner), self._live(key).values()
            left = [s.expires - self._now() for s in live]
            if mode == SHARED:
                exclusive = [s.expires - self._now() for s in live if s.mode == EXCLUSIVE]
                if exclusive:
                    return min(exclusive)
                return self.waiter_ttl if any(p.mode == EXCLUSIVE for p in ahead) else None
            limit = max((s.limit for s in live), default=1)
            if left and (len(left) >= limit or any(s.mode == SHARED for s in live)):
                return min(left)
            return None if len(ahead) < limit - len(left) else self.waiter_ttl

    def _leave_queue(self, key: str, owner: str | None) -> None:
        if owner is not None:
            with self.space.lock:
                self.space.places.get(key, {}).pop(owner, None)


def lowest_free(live: dict[int, Slot], limit: int | None) -> int | None:
    """The lowest slot no live lease holds, below ``limit`` (None: unbounded)."""
    number = 0
    while number in live:
        number += 1
    return number if limit is None or number < limit else None


def live_slot_number(live: dict[int, Slot], slot: Slot) -> int:
    return next(number for number, each in live.items() if each is slot)


def _waiter(place: Place) -> WaiterInfo:
    """A place in a queue as ``peek`` shows it."""
    since = utc_from_timestamp(place.since)
    return WaiterInfo(place.holder, since, place.mode, priority=place.priority)
