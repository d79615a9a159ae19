"""The lease engine's keeper: one lease's client-side deadline, renewal and release.

The store's clock decides expiry. The client keeps its own, stricter deadline: ``ttl``
after the moment the acquire or renew request was *sent*, on a monotonic clock, so that
however long the reply took, the client never believes in a lease the store has freed.
Where a failover could lose the lease unseen, the deadline is nearer still: the store's
``failover_window`` after the request (see ``Store.failover_window``).
"""

from __future__ import annotations

import _thread
import os
import time

from tasklock_cli.errors import LeaseLost
from tasklock_cli.errors import StoreUnavailable
from tasklock_cli.errors import TasklockError
from tasklock_cli.stores.base import Store
from tasklock_cli.stores.model import EXCLUSIVE
from tasklock_cli.stores.model import Holder
from tasklock_cli.stores.model import Lease
from tasklock_cli.stores.model import RunRecord
from tasklock_cli.util import clock as clocks
from tasklock_cli.util import suppressed
from tasklock_cli.util.records import dataclass

TYPE_CHECKING = False
if TYPE_CHECKING:
    from tasklock_cli.run.options import RunOptions

#: Releases tried with the run's record before the record is given up (release_retrying).
LEDGER_TRIES = 2


@dataclass
class LeaseKeeper:
    """Owns one lease: its local deadline, renewals and release, serialised by one lock."""

    store: Store
    key: str
    ttl: float
    holder: Holder
    clock: clocks.Clock = clocks.monotonic
    limit: int = 1  # a semaphore's number of slots
    mode: str = EXCLUSIVE  # or SHARED (--shared)
    #: How long after a request was sent the lease is believed in (``RunOptions.
    #: lease_window``); None: the ttl.
    window: float | None = None

    @classmethod
    def of_run(
        cls, store: Store, key: str, options: RunOptions, holder: Holder, clock: clocks.Clock
    ) -> LeaseKeeper:
        """The keeper of ``key``'s lease for a run with ``options``."""
        window = options.lease_window
        return cls(store, key, options.ttl, holder, clock, options.limit, options.mode, window)

    def __post_init__(self) -> None:
        self.owner_token = os.urandom(16).hex()  # not secrets: it imports OpenSSL
        self.lease: Lease | None = None
        self.deadline = 0.0
        self.acquired_at = 0.0
        self.lock = _thread.allocate_lock()

    @property
    def fencing_token(self) -> int | None:
        return self.lease.fencing_token if self.lease else None

    @property
    def span(self) -> float:
        """The local deadline's distance from the request it follows."""
        return self.ttl if self.window is None else min(self.ttl, self.window)

    def remaining(self) -> float:
        return self.deadline - self.clock()

    def try_acquire(
        self,
        queue: bool = False,
        supersede: bool = False,
        front: bool = False,
        priority: int = 0,
        max_waiting: int | None = None,
    ) -> bool:
        """One attempt; with ``queue``, one that fails joins (or keeps our place in) the
        key's queue of waiters (``supersede``, ``front``, ``priority``, ``max_waiting``:
        see ``Store.acquire``). The owner
        token stays the same across attempts, so a retry after a lost reply recognises a
        lease it already holds instead of conflicting with itself, and a waiter keeps its
        place."""
        with self.lock:
            sent = self.clock()
            lease = self.store.acquire(
                self.key,
                self.ttl,
                self.holder,
                self.owner_token,
                limit=self.limit,
                queue=queue,
                mode=self.mode,
                supersede=supersede,
                front=front,
                priority=priority,
                max_waiting=max_waiting,
            )
            if lease is None:
                return False
            # A store may attach a lease whose TTL began before this call (etcd: a waiter's
            # lease kept alive at its last look): then the deadline counts from there.
            age = self.store.lease_age(lease)
            self.lease, self.deadline, self.acquired_at = lease, sent - age + self.span, sent
            return True

    def renew(self) -> Lease:
        """Extend the lease; raises LeaseLost (rejected) or StoreUnavailable."""
        with self.lock:
            if self.lease is None:
                raise LeaseLost(f"no lease on {self.key!r} to renew")
            sent = self.clock()
            self.lease = self.store.renew(self.lease, self.ttl)
            self.deadline = max(self.deadline, sent + self.span)
            return self.lease

    def run_record(
        self, outcome: str, exit_code: int | None, detected_by: str | None = None
    ) -> RunRecord | None:
        """The run ledger's record of the run under the lease held now (None when none)."""
        lease = self.lease
        if lease is None:
            return None
        return RunRecord(
            key=self.key,
            fencing_token=lease.fencing_token,
            holder=self.holder,
            started_at=lease.acquired_at,
            exit_code=exit_code,
            outcome=outcome,
            detected_by=detected_by,
            slot=lease.slot,
            mode=lease.mode,
        )

    def release(
        self, keep_for: float = 0.0, lock_timeout: float = -1, record: RunRecord | None = None
    ) -> bool:
        """Release once, writing ``record`` into the run ledger with it; True when the store
        confirmed the lease was ours and is now freed (or set to run out after
        ``keep_for``). The lease is forgotten only once the store answered."""
        if not self.lock.acquire(timeout=lock_timeout):
            raise StoreUnavailable(f"a renewal of {self.key!r} is still hanging")
        try:
            if self.lease is None:
                return False
            released = self.store.release(self.lease, keep_for=keep_for, record=record)
            self.lease = None
            return released
        finally:
            self.lock.release()

    def ensure_remaining(self, at_least: float, io_timeout: float) -> None:
        """Renew when less than ``at_least`` seconds of the lease are left; when that fails,
        release it (one try: it may still be ours) and raise."""
        if self.remaining() >= at_least:
            return
        try:
            self.renew()
        except TasklockError:
            with suppressed(TasklockError):
                self.release(lock_timeout=io_timeout)
            raise

    def window_done_by(self, period: float | None, io_timeout: float) -> RunRecord | None:
        """--once-per: the run of the key that succeeded in the current window, read under
        the lease (so no one else can run meanwhile) in one store call; None when there is
        none, or without --once-per (no store call at all). When the read fails, the lease
        is released (one try) and the error raised."""
        if period is None:
            return None
        try:
            success, now = self.store.last_success(self.key)
        except TasklockError:
            with suppressed(TasklockError):
                self.release(lock_timeout=io_timeout)
            raise
        from tasklock_cli.run.windows import done_in_window  # --once-per only

        return success if done_in_window(success, now, period) else None

    def release_quietly(
        self, io_timeout: float, record: RunRecord | None = None, on_ledger_failed=None
    ) -> bool:
        """One try at releasing, the store given ``io_timeout`` (and one more without the
        run's record, when it was the record the store refused); True when it confirmed."""
        if self.lease is None:
            return False
        self.store.set_io_timeout(io_timeout)
        try:
            return self.release(lock_timeout=io_timeout, record=record)
        except StoreUnavailable:
            return False
        except TasklockError as exc:
            if record is None:
                return False
            if on_ledger_failed is not None:
                on_ledger_failed(exc)
            return self.release_quietly(io_timeout)

    def release_retrying(
        self,
        keep_for: float,
        io_timeout: float,
        retry_every: float,
        note=lambda _: None,
        record: RunRecord | None = None,
        on_ledger_failed=lambda _: None,
    ) -> bool:
        """Release, retrying a store that does not answer while the lease could still be
        ours (StoreUnavailable once it could not); True when the store confirmed it. A
        release whose run record cannot be written is retried without the record: at once
        when the store refused it, after a second failure when the store's answer does not
        tell a ledger problem from an outage."""
        failures = 0
        while True:
            try:
                return self.release(keep_for, lock_timeout=io_timeout, record=record)
            except StoreUnavailable as exc:
                failures += 1
                if record is not None and failures >= LEDGER_TRIES:
                    on_ledger_failed(exc)
                    record = None
                    continue
                if self.remaining() <= io_timeout:
                    raise
                note(f"release failed, retrying: {exc}")
                time.sleep(retry_every)
            except TasklockError as exc:
                if record is None:
                    raise
                on_ledger_failed(exc)
                record = None
