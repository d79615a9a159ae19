"""The ``Store`` interface every store implements (the records it passes are in ``model``,
its declared traits in ``traits``, the waiter's side in ``queueing``).

A store decides expiry on its own clock. It never sees the client's deadline: that is
the supervisor's business (see ``tasklock_cli.run.keeper``).

What a store must write: every ``@abstractmethod`` (Python refuses a class that lacks one).
What it may write, each with its default here (or in ``queueing``):

- ``peek``: the lowest fencing token of ``holders``;
- ``holdup``: None (nothing but holders keep a key; else a failover quarantine met);
- ``quarantine``: None (no store-wide quarantine under way);
- ``lease_age``: 0 (a lease's TTL starts with the acquire; etcd: a lease kept alive);
- ``note_processes``: nothing (``free_if_holder_gone`` then frees only kept leases);
- ``wait_for_break``: looks at ``time_left`` every ``break_poll_s`` (0.25 s);
- ``_prepare_wait``: nothing (no turn to take, nothing to start listening to);
- ``_await_wakeup``: looks at ``_time_until_free`` every ``release_poll_s`` (0.25 s);
- ``_wait_after_trouble``: sleeps out the wait;
- ``set_io_timeout``: nothing; ``init_schema``: None; ``schema_sql``: None (no DDL);
- ``_close``: nothing (``close`` first leaves the queues: the base's part).
- ``close_before_exit``: ``close`` (SQLite: without the last close's checkpoint).

Attributes (``traits``): ``display_url`` (the URL shown, password redacted),
``waiting_trouble`` (what the waiting primitives raise on trouble), ``break_poll_s`` and
``release_poll_s`` (the polling defaults' intervals: one round trip each on a network
store), ``release_look_s``, and those the package declares in its ``CAPABILITIES``:
``signals_release``, ``concurrent_release``, ``waits_keep_places``, ``min_ttl``,
``expiry_lag``, ``byte_keys``, ``waiter_ttl``, ``failover_window``.

The base keeps the queue places: ``_acquire`` returns a ``Lease``, ``QUEUED`` (no slot; a
place in the queue under the caller's owner token) or None (no slot, no place), and the
base records it; ``stop_waiting`` and ``close`` leave the places through ``_leave_queue``.
A store's ``__init__`` owes the base nothing.

Threads: a store object serves one holder. Its main thread acquires, waits, notes the
processes, releases and closes; while a lease is held, the heartbeat thread calls
``renew``, ``wait_for_break`` and ``broken_by``. Where ``concurrent_release`` is True,
``release`` and ``close`` may run while the heartbeat is still in ``wait_for_break`` or a
renewal: such a store serialises its calls, and its release closes nothing that waiting
uses. Elsewhere the wrapper stops and joins the heartbeat before it releases, for at most
the I/O timeout: only a renewal stuck past that may still be under way.
"""

from __future__ import annotations

import time
from abc import ABC
from abc import abstractmethod

from tasklock_cli.errors import StoreUnavailable
from tasklock_cli.stores.model import EXCLUSIVE
from tasklock_cli.stores.model import LEDGER_KEEP
from tasklock_cli.stores.model import Ask
from tasklock_cli.stores.model import Holder
from tasklock_cli.stores.model import Lease
from tasklock_cli.stores.model import LeaseInfo
from tasklock_cli.stores.model import RunRecord
from tasklock_cli.stores.model import StoreCheck
from tasklock_cli.stores.model import WaiterInfo
from tasklock_cli.stores.queueing import Queued
from tasklock_cli.stores.queueing import Waiting
from tasklock_cli.util import suppressed
from tasklock_cli.util.fds import wait_readable

#: ``list`` in the store class's body is its method: annotations there say builtins.list.
TYPE_CHECKING = False
if TYPE_CHECKING:
    import builtins
    from collections.abc import Iterator
    from datetime import datetime


class Store(Waiting, ABC):
    """acquire / renew / release / peek / list / sweep, plus waiting, force release and schema.

    Every method is one round trip where the backend allows it. Methods raise
    ``StoreUnavailable`` when the store cannot be reached and ``ConfigError`` when it is
    unusable as configured; ``renew`` raises ``LeaseLost`` when the store rejects the owner.
    """

    @classmethod
    @abstractmethod
    def from_url(cls, url: str) -> Store:
        """The store a URL of one of its package's ``SCHEMES`` names (see ``registry``).
        ConfigError for a URL it cannot use (unknown parameters named)."""

    def acquire(
        self,
        key: str,
        ttl: float,
        holder: Holder,
        owner: str,
        limit: int = 1,
        queue: bool = False,
        *,
        mode: str = EXCLUSIVE,
        supersede: bool = False,
        front: bool = False,
        priority: int = 0,
        max_waiting: int | None = None,
    ) -> Lease | None:
        """Take the lowest free slot of ``key``; None when all ``limit`` slots are held.

        The slots are ``0..limit-1``; a plain lock has one. A slot is free when no live lease
        holds it. Lease, LeaseInfo and WaiterInfo carry the mode:

        - ``mode`` SHARED always comes with ``limit`` 1. The caller takes the lowest slot no
          live lease holds, unbounded, when no live lease of ``key`` is EXCLUSIVE.
        - An EXCLUSIVE caller with ``limit`` 1 takes slot 0 only when no live lease of any
          mode holds any slot of ``key``.
        - In the queue, a SHARED caller goes when every live waiter ahead of it is SHARED.
          The shared runs at the head are admitted together.
        - An EXCLUSIVE caller goes when none is ahead of it. So a waiting EXCLUSIVE run is
          never starved by SHARED arrivals: they queue behind it.

        ``supersede`` (``run --supersede``) acts when the caller joins the queue (has no
        place yet). It marks superseded every older place of ``key`` that joined with
        ``supersede``. A superseded place no longer counts: it is not ahead of anyone, and
        not in ``waiters``. Its owner's next acquire leaves the queue and raises
        ``Superseded``.

        ``front`` (``run --replace``): a caller that joins the queue takes a place ahead of
        every waiter there.

        ``priority``, ``max_waiting``: the queue's order and cap (see ``model.Ask``).

        First come, first served: the key's live waiters (see ``waiters``) are served in
        their order. So a caller takes a slot only when fewer of them are ahead of it than
        slots are free. A caller not in the queue has them all ahead. With ``queue``, a
        caller that gets nothing joins the key's queue at its end, or keeps its place there,
        for ``waiter_ttl`` seconds from now. A caller that gets a slot leaves the queue.
        Both happen in the same round trip.

        The fencing token is greater than every token issued before for ``key``, in any slot.
        Raises ``LimitMismatch`` when a live holder of ``key`` uses another limit. The
        success path stays one round trip; telling a mismatch from a conflict may take
        another. Retrying with the same ``owner`` after a lost reply returns the same lease
        (same slot and token), not a conflict with ourselves.
        """
        ask = Ask(mode, supersede, front, priority, max_waiting)
        return self._record_place(
            key, owner, lambda: self._acquire(key, ttl, holder, owner, limit, queue, ask)
        )

    @abstractmethod
    def _acquire(
        self, key: str, ttl: float, holder: Holder, owner: str, limit: int, queue: bool, ask: Ask
    ) -> Lease | Queued | None:
        """``acquire``, the store's own part: ``ask`` carries the rest of the request. The
        lease taken; else ``QUEUED`` when the caller holds a place in ``key``'s queue under
        ``owner`` now (joined or kept), None when it holds none. The base records it (a
        store whose waits keep its places, etcd, keeps them itself and returns None)."""

    def holdup(self, key: str) -> str | None:
        """Why no lease can be had on ``key`` now although none may show (a store's failover
        quarantine, met by our last acquire), for the ``waiting`` and conflict messages;
        None when nothing but its holders keep it."""
        return None

    def quarantine(self) -> str | None:
        """Why no key of the store can be had now although none may show held (a failover
        quarantine under way), read from the store, for ``peek``, ``list`` and
        ``release --force``; None when nothing but holders keep keys."""
        return None

    def lease_age(self, lease: Lease) -> float:
        """How long ``lease``'s TTL had already run on the store when the acquire that
        returned it was sent (a store may attach a lease kept alive before: etcd); its
        holder's deadline counts from then. 0 by default."""
        return 0.0

    @abstractmethod
    def renew(self, lease: Lease, ttl: float) -> Lease:
        """Extend a still-live lease we own to ``ttl`` from now; raise LeaseLost otherwise."""

    @abstractmethod
    def release(self, lease: Lease, keep_for: float = 0.0, record: RunRecord | None = None) -> bool:
        """Free the lease (or, with ``keep_for`` > 0, let it expire that long from now).

        Returns False when the lease was no longer ours. The fencing counter is kept.
        ``record`` (the run that held the lease) goes into the run ledger in the same write,
        whether the lease was still ours or not. That write also trims the key's ledger to
        its last ``LEDGER_KEEP`` runs, keeping the newest success apart (see
        ``last_success``). Writing the same run (key and token) again, as a retry does,
        keeps one record. A failing ledger write fails the release.
        """

    @abstractmethod
    def time_left(self, key: str, fencing_token: int) -> float | None:
        """Seconds until the lease on ``key`` with ``fencing_token`` expires, when it is live
        and not broken (``tasklock check``); None otherwise."""

    @abstractmethod
    def history(self, key: str, limit: int = LEDGER_KEEP) -> list[RunRecord]:
        """The key's last ``limit`` runs from the ledger, newest (highest token) first."""

    @abstractmethod
    def last_success(self, key: str) -> tuple[RunRecord | None, datetime]:
        """The key's newest run that succeeded (None when none), and the store's clock now,
        in one round trip (``--once-per``, ``metrics``). The ledger's trim never removes
        a key's newest success, however many runs came after it."""

    @abstractmethod
    def ledger_keys(self, prefix: str = "") -> list[str]:
        """The keys starting with ``prefix`` that have runs in the ledger, sorted."""

    @abstractmethod
    def holders(self, key: str) -> list[LeaseInfo]:
        """The live leases on ``key``, one per held slot, ordered by slot (one read)."""

    def peek(self, key: str) -> LeaseInfo | None:
        """The live lease on ``key`` with the lowest fencing token, or None when free."""
        live = self.holders(key)
        return min(live, key=lambda info: info.fencing_token) if live else None

    @abstractmethod
    def waiters(self, key: str) -> list[WaiterInfo]:
        """The live waiters of ``key`` (their places not run out), in the order they will
        be served (one read)."""

    @abstractmethod
    def waiting_counts(self, prefix: str = "") -> dict[str, int]:
        """How many live waiters each key starting with ``prefix`` has (keys with none are
        left out)."""

    @abstractmethod
    def list(self, prefix: str = "", include_expired: bool = False) -> Iterator[LeaseInfo]:
        """Leases whose key starts with ``prefix``, one per held slot, ordered by key then
        slot, yielded as they are read
        (in pages of ``LIST_PAGE``, each its own snapshot): a huge listing never sits whole
        in memory."""

    @abstractmethod
    def sweep(self, dry_run: bool = False) -> int:
        """Clear expired leases left in the store; never touches fencing counters."""

    @abstractmethod
    def break_lease(
        self, key: str, token: int | None = None, by: Holder | None = None
    ) -> builtins.list[LeaseInfo]:
        """Mark the live leases on ``key`` broken, in the name of ``by``.

        Every slot's lease is broken, or only the one whose fencing token is ``token``, when
        given. ``by`` is kept with the lease for ``broken_by``; the first break's breaker stays.

        From then on its renew raises LeaseLost. Nobody else can acquire its slot (peek and
        list still show it held) until its owner releases it, it expires on the store's
        clock, or ``force_release`` frees it. Its owner's release still succeeds (True) and
        frees it, ``keep_for`` or not. Its expiry is not extended. The holder is told at once
        through the store's notification path (``wait_for_break`` returns). Returns the
        leases as they were broken, ordered by slot; empty when no live lease matched.
        Idempotent."""

    @abstractmethod
    def broken_by(self, lease: Lease) -> dict | None:
        """Who broke ``lease`` (``breaker(by)`` of its first break), for its holder's ledger
        record; None when it is not broken, or no longer on the store."""

    def note_processes(self, lease: Lease, guard_pid: int) -> None:
        """Record with the lease the processes its holder runs (this process and the guard
        of its command), where the store can later tell they are gone
        (``free_if_holder_gone``). Nothing by default."""

    @abstractmethod
    def free_if_holder_gone(self, key: str, token: int) -> bool:
        """Free the lease on ``key`` with fencing ``token`` when its holder's processes are
        known to be gone (``note_processes``), or it was kept after its command ended
        (``release`` with ``keep_for``: its holder has exited, nothing runs under it); True
        when freed. Otherwise nothing is freed: the lease then runs out on the store's
        clock. Every store frees a kept lease."""

    @abstractmethod
    def force_release(self, key: str, token: int | None = None) -> builtins.list[LeaseInfo]:
        """Free the leases on ``key`` whoever holds them -- every slot's, or only the one
        with fencing token ``token`` -- broken or not; wakes a waiter and tells each holder
        (as ``break_lease``). Returns what was freed, ordered by slot. The fencing counter
        is kept."""

    def wait_for_break(self, lease: Lease, timeout: float, wake_fd: int | None = None) -> bool:
        """Called by ``lease``'s holder between renewals: block until the lease is broken or
        freed by force (True), ``timeout`` seconds pass (False), or ``wake_fd`` becomes
        readable (False; it is not read). A break from before the call is seen too.

        By default the lease is looked at every ``break_poll_s``, with ``time_left``. A lease
        broken, freed or run out is no longer current. What the look finds is a hint, which
        the caller checks with a renewal. Trouble reaching the store is not a break."""
        deadline = time.monotonic() + max(0.0, timeout)
        while True:
            with suppressed(StoreUnavailable):
                if self.time_left(lease.key, lease.fencing_token) is None:
                    return True
            left = deadline - time.monotonic()
            if left <= 0 or wait_readable([wake_fd], min(left, self.break_poll_s)):
                return False

    def set_io_timeout(self, seconds: float) -> None:
        """Bound each later call (connect, statement, socket read) to about ``seconds``.

        The supervisor sets it from the lease timing so that a renewal against a dead or
        cut-off server fails fast and can be retried before the local deadline.
        """

    def init_schema(self) -> str | None:
        """Create what the store needs and mark a store never used new (``tasklock init``:
        no failover quarantine owed); idempotent, safe to race. Returns what it found."""
        return None

    def schema_sql(self) -> str | None:
        """DDL for DBAs who create the schema themselves; None where there is none."""
        return None

    def doctor(self) -> builtins.list[StoreCheck]:
        """Reachability, schema, round-trip time, clock offset: the ``store_checks(store)``
        of the store package's ``doctor`` module, the one entry point every store has."""
        from importlib import import_module

        package = type(self).__module__.rpartition(".")[0]
        return import_module(f"{package}.doctor").store_checks(self)

    def close(self) -> None:
        """Leave the queues we hold places in (``stop_waiting``), then ``_close``."""
        self._leave_queues()
        self._close()

    def _close(self) -> None:
        """``close``, the store's own part: release connections, stop listening."""

    def close_before_exit(self) -> None:
        """``close``, in a process that ends right after (`tasklock run` ends with
        ``os._exit``): what the process's end does as well may be left to it. By default,
        ``close``; a store that overrides it leaves the queues first (``_leave_queues``)."""
        self.close()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
