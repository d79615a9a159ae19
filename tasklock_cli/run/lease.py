"""The lease engine: acquiring (with waiting), the client-side deadline, renewal and release.

The store's clock decides expiry. The client keeps its own, stricter deadline: ``ttl``
after the moment the acquire or renew request was *sent*, on a monotonic clock, so that
however long the reply took, the client never believes in a lease the store has freed.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from datetime import datetime
from datetime import timedelta
from datetime import timezone

from tasklock_cli.errors import ExitCode
from tasklock_cli.errors import Interrupted
from tasklock_cli.errors import LeaseLost
from tasklock_cli.errors import StoreUnavailable
from tasklock_cli.errors import TasklockError
from tasklock_cli.stores.base import EXCLUSIVE
from tasklock_cli.stores.base import Holder
from tasklock_cli.stores.base import Lease
from tasklock_cli.stores.base import LeaseInfo
from tasklock_cli.stores.base import Replacer
from tasklock_cli.stores.base import RunRecord
from tasklock_cli.stores.base import Store
from tasklock_cli.util import clock as clocks
from tasklock_cli.util.durations import format_duration
from tasklock_cli.util.records import dataclass

#: Releases tried with the run's record before the record is given up (release_retrying).
LEDGER_TRIES = 2
# Waiting: first retry soon, then back off; stores that signal releases wake us earlier.
FIRST_RETRY_S = 0.005
POLL_CEILING_S = 0.05
SIGNALLED_POLL_CEILING_S = 1.0
#: Where the wait itself keeps a waiter's place and its wake-ups cannot be lost
#: (``Store.waits_keep_places``), a plain waiter looks again this seldom: the look only
#: backs the wake-up up. (--supersede and --replace waiters still look every second: a
#: superseded place is found by a look.)
QUIET_LOOK_CEILING_S = 5.0
#: While waiting, the ``waiting`` event (naming the current holder) repeats this often, so
#: a CI log shows why a step is stuck.
WAITING_EVENT_EVERY_S = 30.0


class Conflict(TasklockError):
    """The lock is held by someone else and the wait (if any) ran out."""

    exit_code = ExitCode.CONFLICT

    def __init__(
        self,
        key: str,
        holder: LeaseInfo | None,
        waited: float = 0.0,
        first_holder: LeaseInfo | None = None,
    ) -> None:
        self.key = key
        self.holder = holder
        self.waited = waited
        self.first_holder = first_holder
        super().__init__(describe_conflict(key, holder, waited, first_holder))


def describe_holder(info: LeaseInfo) -> str:
    holder = info.holder
    return f"{holder.host} pid {holder.pid} (user {holder.user}, token {info.fencing_token})"


def describe_conflict(
    key: str,
    info: LeaseInfo | None,
    waited: float = 0.0,
    first_holder: LeaseInfo | None = None,
) -> str:
    held = (
        f"{key!r} is held"
        if info is None or info.limit == 1
        else (f"all {info.limit} slots of {key!r} are held, the longest")
    )
    if waited <= 0:
        if info is None:
            return f"{held} by someone else"
        until = f"{info.expires_at:%Y-%m-%dT%H:%M:%SZ}"
        return f"{held} by {describe_holder(info)} until {until}"
    gave_up = f"gave up waiting {format_duration(waited)}: {held} by"
    if info is None:
        return f"{gave_up} someone else"
    if first_holder is not None and first_holder.fencing_token == info.fencing_token:
        # a fencing token names one acquisition: the same one at both ends held throughout
        return f"{gave_up} {describe_holder(info)}, who held it throughout"
    began = f" (by {describe_holder(first_holder)} when the wait began)" if first_holder else ""
    return f"{gave_up} {describe_holder(info)} now{began}"


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

    def __post_init__(self) -> None:
        self.owner_token = os.urandom(16).hex()  # not secrets: it imports OpenSSL
        self.lease: Lease | None = None
        self.deadline = 0.0
        self.acquired_at = 0.0
        self.lock = threading.Lock()

    @property
    def fencing_token(self) -> int | None:
        return self.lease.fencing_token if self.lease else None

    def remaining(self) -> float:
        return self.deadline - self.clock()

    def try_acquire(
        self, queue: bool = False, supersede: bool = False, front: bool = False
    ) -> bool:
        """One attempt; with ``queue``, one that fails joins (or keeps our place in) the
        key's queue of waiters (``supersede``, ``front``: see ``Store.acquire``). The owner
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
            )
            if lease is None:
                return False
            # A store may attach a lease whose TTL began before this call (etcd: a waiter's
            # lease kept alive at its last look): then the deadline counts from there.
            age = self.store.lease_age(lease)
            self.lease, self.deadline, self.acquired_at = lease, sent - age + self.ttl, sent
            return True

    def renew(self) -> Lease:
        """Extend the lease; raises LeaseLost (rejected) or StoreUnavailable."""
        with self.lock:
            if self.lease is None:
                raise LeaseLost(f"no lease on {self.key!r} to renew")
            sent = self.clock()
            self.lease = self.store.renew(self.lease, self.ttl)
            self.deadline = max(self.deadline, sent + self.ttl)
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
            with contextlib.suppress(TasklockError):
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
            with contextlib.suppress(TasklockError):
                self.release(lock_timeout=io_timeout)
            raise
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


def _random_fraction() -> float:
    import random  # only when waiting: ~1 ms of start-up otherwise

    return random.random()


class Waiter:
    """Retries an acquisition until it succeeds or ``wait`` seconds have passed.

    ``supersede`` (``run --supersede``): a newer such waiter of the key makes this one give
    up (``Superseded``). ``replace`` (``run --replace``): the holders are broken, as
    ``release --force`` does, and this waiter waits ahead of every other one; it waits
    beyond ``wait`` for as long as a lease it broke (or a newcomer's) is still live, so
    it takes the key as soon as they let go or their leases run out."""

    def __init__(
        self,
        keeper: LeaseKeeper,
        wait: float,
        on_waiting=None,
        rng=None,
        wake_fd: int | None = None,
        supersede: bool = False,
        replace: bool = False,
        on_broken=None,
    ):
        self.keeper = keeper
        self.wait = wait
        self.on_waiting = on_waiting
        self.rng = rng or _random_fraction
        self.wake_fd = wake_fd  # readable when a signal came (signal.set_wakeup_fd)
        self.supersede = supersede
        self.replace = replace
        self.on_broken = on_broken  # called with the leases a --replace broke, each once
        self._broken: set[int] = set()
        store = keeper.store
        if store.waits_keep_places and not (supersede or replace):
            self.ceiling = QUIET_LOOK_CEILING_S
        else:
            ceiling = SIGNALLED_POLL_CEILING_S if store.signals_release else POLL_CEILING_S
            # each attempt renews our place in the queue: several per waiter_ttl
            self.ceiling = min(ceiling, store.waiter_ttl / 3)
        self._stop_signal: int | None = None
        self._in_wait = False

    def interrupt(self, signum: int) -> None:
        """Stop waiting (from a signal handler). With a ``wake_fd`` the store's wait
        returns by itself, and the wait stops right after; without one, at once when
        blocked in the store's wait, else before the next one. A store call under way is
        not cut short here (the caller decides), so a lease it grants is not lost track
        of: the caller finds it held and releases it. After an interrupted wait the caller
        must close the store."""
        self._stop_signal = signum
        if self._in_wait and self.wake_fd is None:
            self._in_wait = False  # once: a second signal must not cut the unwinding short
            raise Interrupted(signum)

    def acquire(self) -> None:
        try:
            self._acquire()
        except TasklockError:
            # The wait ran out or the store failed: a store kept open must not go on
            # holding this waiter's place. (A wait cut short by a signal may have left a
            # store call half done: the caller closes that store, which gives all up.)
            with contextlib.suppress(TasklockError):
                self.keeper.store.stop_waiting(self.keeper.key)
            raise

    def _acquire(self) -> None:
        keeper, clock = self.keeper, self.keeper.clock
        give_up_at = clock() + self.wait
        delay = FIRST_RETRY_S
        announced_at: float | None = None
        first_holder: LeaseInfo | None = None
        broken_live = broken_live_before = False
        while True:
            try:
                queue = self.wait > 0 or self.replace
                if keeper.try_acquire(queue, supersede=self.supersede, front=self.replace):
                    return
                broken_live = self._break_holders()
            except StoreUnavailable:
                if clock() + delay >= give_up_at:
                    raise
                # a blip while waiting is retried like a conflict
            left = give_up_at - clock()
            # --replace waits while a lease it broke is live, and tries once more after
            replacing, broken_live_before = broken_live or broken_live_before, broken_live
            if left <= 0 and not replacing:
                waited = self.wait if announced_at is not None else 0.0
                raise Conflict(keeper.key, self._current_holder(), waited, first_holder)
            if announced_at is None or clock() - announced_at >= WAITING_EVENT_EVERY_S:
                holder = self._current_holder()
                if announced_at is None:
                    first_holder = holder
                announced_at = clock()
                if self.on_waiting is not None:
                    self.on_waiting(holder)
            # (past the wait only while --replace waits for a lease it broke; never past the
            # next `waiting` event)
            announce_in = announced_at + WAITING_EVENT_EVERY_S - clock()
            wait = min(delay * (0.5 + self.rng()), left if left > 0 else delay, announce_in)
            self._wait_for_release(wait)
            delay = min(delay * 2, self.ceiling)

    def _break_holders(self) -> bool:
        """--replace: break the key's live leases in our name; True when there were any
        (they are broken now, and we wait for them to let go or run out)."""
        if not self.replace:
            return False
        keeper = self.keeper
        live = keeper.store.break_lease(keeper.key, None, Replacer.of(keeper.holder))
        fresh = [info for info in live if info.fencing_token not in self._broken]
        self._broken.update(info.fencing_token for info in fresh)
        if fresh and self.on_broken is not None:
            self.on_broken(fresh)
        return bool(live)

    def _wait_for_release(self, timeout: float) -> None:
        self._in_wait = True
        try:
            if self._stop_signal is not None:  # it came during the last store call
                raise Interrupted(self._stop_signal)
            self.keeper.store.wait_for_release(self.keeper.key, timeout, self.wake_fd)
        finally:
            self._in_wait = False
        if self._stop_signal is not None:
            raise Interrupted(self._stop_signal)
        _drain(self.wake_fd)  # another signal (SIGCHLD, SIGCONT): wait on

    def _current_holder(self) -> LeaseInfo | None:
        try:
            return self.keeper.store.peek(self.keeper.key)
        except TasklockError:
            return None


def _drain(fd: int | None) -> None:
    if fd is None:
        return
    with contextlib.suppress(BlockingIOError, OSError):
        while os.read(fd, 512):
            pass


EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)


def window_start(now: datetime, period: float) -> datetime:
    """The start of the window of ``period`` seconds that holds ``now``; windows are
    aligned to the Unix epoch (``1h``: each UTC hour). Exact to the microsecond."""
    length = timedelta(seconds=period)
    return EPOCH + ((now - EPOCH) // length) * length


def done_in_window(success: RunRecord | None, now: datetime, period: float) -> bool:
    """Whether ``success`` started in the window of ``period`` holding ``now`` (both times
    on the store's clock). A start after ``now`` (a clock stepped back) counts as in it."""
    return success is not None and success.started_at >= window_start(now, period)
