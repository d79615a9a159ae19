"""The leases one `run` holds: KEY's, and with ``--also`` each further key's.

Every key has its own LeaseKeeper and Heartbeat (and, beyond KEY, a store client of its
own: a client serves one thread). They are taken in one global order, sorted by key, so
two runs naming the same keys in any order never wait for each other in a circle. The run
is as safe as its weakest lease: the local deadline is the earliest of them, and losing
any one is losing the lock.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable

from tasklock_cli.run.heartbeat import Heartbeat
from tasklock_cli.run.keeper import LeaseKeeper
from tasklock_cli.run.waiter import Waiter
from tasklock_cli.stores.base import Store
from tasklock_cli.stores.model import RunRecord


class Holding:
    def __init__(
        self,
        keepers: list[LeaseKeeper],
        make_heartbeat: Callable[[LeaseKeeper], Heartbeat],
        own_stores: list[Store],
    ) -> None:
        self.primary = keepers[0]  # KEY's: the lease the run's events and variables name
        self.in_order = sorted(keepers, key=lambda keeper: keeper.key)
        self.heartbeats = [make_heartbeat(keeper) for keeper in keepers]
        self._own_stores = own_stores  # opened for the --also keys: closed with us

    @property
    def several(self) -> bool:
        return len(self.in_order) > 1

    def take_all(self, wait: float, waiter_for: Callable[[LeaseKeeper, float], Waiter]) -> None:
        """Take every lease in key order, each through its ``waiter_for(keeper, wait)``,
        holding those taken while waiting for the next, all within ``wait`` seconds. On
        failure the leases taken are still held: ``give_back`` returns them."""
        clock = self.primary.clock
        give_up_at = clock() + wait
        for index, keeper in enumerate(self.in_order):
            left = wait if index == 0 else max(0.0, give_up_at - clock())
            waiter_for(keeper, left).acquire()

    def ensure_remaining(self, at_least: float, io_timeout: float) -> None:
        for keeper in self.in_order:
            keeper.ensure_remaining(at_least, io_timeout)

    def deadline(self) -> float:
        """The earliest local deadline of the leases held: the run's."""
        return min(keeper.deadline for keeper in self.held())

    def acquired_at(self) -> float:
        """When the last lease was taken: the run holds its keys from then on."""
        return max(keeper.acquired_at for keeper in self.in_order)

    def held(self) -> list[LeaseKeeper]:
        return [keeper for keeper in self.in_order if keeper.lease is not None]

    def tokens(self) -> dict[str, int]:
        """Key -> fencing token of every lease held (TASKLOCK_FENCING_TOKENS)."""
        return {
            keeper.key: keeper.lease.fencing_token
            for keeper in self.in_order
            if keeper.lease is not None  # the held ones (held())
        }

    def records(self, outcome: str, exit_code: int | None) -> dict[str, RunRecord | None]:
        """Each key's run record of the run (None for a key not held)."""
        return {keeper.key: keeper.run_record(outcome, exit_code) for keeper in self.in_order}

    def set_io_timeout(self, seconds: float) -> None:
        for keeper in self.in_order:
            keeper.store.set_io_timeout(seconds)

    def note_processes(self, guard_pid: int) -> None:
        """Record with every lease this process and the command's guard, before the
        command starts, where the store can later tell they are gone: a holder killed at
        any instant after its command started is seen as gone by `release --force`."""
        for heartbeat in self.heartbeats:
            heartbeat.guard_pid = guard_pid
            heartbeat.note_processes()

    def start(self, guard_pid: int) -> None:
        for heartbeat in self.heartbeats:
            heartbeat.guard_pid = guard_pid
            heartbeat.start()

    def stop(self, join_within: float) -> None:
        """Stop every heartbeat's reports, and end those whose store cannot release beside
        a heartbeat. The others are woken and joined after the release (``join``): waking
        one now would have it wind down on our CPU and our lock while we release."""
        for heartbeat in self.heartbeats:
            heartbeat.stop_reports()
        for heartbeat in self.heartbeats:
            if not heartbeat.store.concurrent_release:
                heartbeat.join(join_within)

    def join(self, within: float) -> None:
        for heartbeat in self.heartbeats:
            heartbeat.join(within)

    def release_quietly(
        self, io_timeout: float, records: dict[str, RunRecord | None], on_ledger_failed
    ) -> list[LeaseKeeper]:
        """One try at releasing each lease held, with its run record; the keepers whose
        release the store confirmed."""
        return [
            keeper
            for keeper in self.held()
            if keeper.release_quietly(io_timeout, records.get(keeper.key), on_ledger_failed)
        ]

    def give_back(self, io_timeout: float) -> None:
        """Release what an acquisition that failed half-way took (no run to record)."""
        self.release_quietly(io_timeout, {}, None)

    def close(self) -> None:
        for heartbeat in self.heartbeats:
            heartbeat.close()
        for store in self._own_stores:
            with contextlib.suppress(Exception):
                store.close()
