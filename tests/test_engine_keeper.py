"""The lease keeper (run.keeper) and the heartbeat's edges on an injected clock: the
client-side deadline, release, the loss grace."""

from __future__ import annotations

import os
import time

import pytest

from tasklock_cli.run.keeper import LeaseKeeper
from tasklock_cli.run.options import RunOptions
from tasklock_cli.stores.sqlite.store import SQLiteStore
from tests.support.contract import granted
from tests.support.engine import HOLDER
from tests.support.engine import FakeClock
from tests.support.engine import SlowStore


@pytest.fixture
def clock():
    return FakeClock()


def test_deadline_counts_from_when_the_request_was_sent(tmp_path, clock):
    store = SlowStore(tmp_path / "db", clock, reply_delay=4.0)
    keeper = LeaseKeeper(store, "k", 10.0, HOLDER, clock)
    sent = clock()
    assert keeper.try_acquire()
    assert keeper.deadline == sent + 10.0
    assert keeper.remaining() == pytest.approx(6.0)
    sent = clock()
    keeper.renew()
    assert keeper.deadline == sent + 10.0


def test_a_failover_window_brings_a_long_ttls_deadline_and_renewals_nearer(tmp_path, clock):
    """Where a failover can lose a lease unseen (issue 46), a holder believes in it for the
    store's window (30 s) after each request, whatever its TTL, and renews every 10 s; the
    store still keeps the lease for the whole TTL."""
    store = SlowStore(tmp_path / "db", clock)
    options = RunOptions(key="k", command=["true"], ttl=120, failover_window=30.0)
    assert options.lease_window == 30.0
    assert options.schedule.renew_interval == pytest.approx(10.0)
    keeper = LeaseKeeper(store, "k", 120.0, HOLDER, clock, window=options.lease_window)
    sent = clock()
    assert keeper.try_acquire()
    lease = granted(keeper.lease)
    assert keeper.deadline == sent + 30.0
    assert (lease.expires_at - lease.acquired_at).total_seconds() == pytest.approx(120.0)
    short = RunOptions(key="k", command=["true"], ttl=6, failover_window=30.0)
    assert short.lease_window == 6 and short.schedule.renew_interval == pytest.approx(2.0)


def test_release_forgets_the_lease_only_after_the_store_confirms(tmp_path, clock):
    from tasklock_cli.errors import StoreUnavailable

    class FlakyRelease(SlowStore):
        fail = True

        def release(self, lease, keep_for=0.0, record=None):
            if self.fail:
                raise StoreUnavailable("down")
            return super().release(lease, keep_for, record)

    store = FlakyRelease(tmp_path / "db", clock)
    keeper = LeaseKeeper(store, "k", 60.0, HOLDER, clock)
    keeper.try_acquire()
    with pytest.raises(StoreUnavailable):
        keeper.release()
    assert keeper.lease is not None
    store.fail = False
    assert keeper.release() is True
    assert keeper.lease is None


@pytest.mark.parametrize(
    ("ttl", "renew", "grace", "loss_grace"),
    [
        (30, None, 5, 5),
        (2, None, 5, (2 - 0.1 - 2 / 3) / 2),
        (10, 5, 5, (10 - 0.5 - 5) / 2),
        (10, 9.9, 5, (10 - 0.5 - 9.5 * 0.75) / 2),  # renewals clamped to 3/4 of the ttl
    ],
)
def test_loss_grace_leaves_room_for_retries(ttl, renew, grace, loss_grace):
    options = RunOptions(key="k", command=["true"], ttl=ttl, renew_every=renew, grace=grace)
    assert options.loss_grace == pytest.approx(loss_grace)
    # the SIGKILL lands before the deadline, after at least one renewal attempt
    assert (
        options.schedule.renew_interval < ttl - options.schedule.safety_margin - options.loss_grace
    )
    assert 0 < options.schedule.safety_margin <= 1.0


def test_stopping_the_reports_waits_for_a_renewal_under_way_and_starts_none(tmp_path, monkeypatch):
    """The wrapper stops its heartbeat's reports before it releases (and, where the store
    allows, releases before the thread has ended). A renewal already under way is finished
    and what it finds is reported first (a lease broken meanwhile is still a loss); none
    begins after, so the release cannot be taken for a loss."""
    import threading

    from tasklock_cli.errors import LeaseLost
    from tasklock_cli.events import EventLog
    from tasklock_cli.run.heartbeat import Heartbeat

    store = SQLiteStore(tmp_path / "db")
    keeper = LeaseKeeper(store, "k", 1.0, HOLDER)
    assert keeper.try_acquire()
    renewing, answer = threading.Event(), threading.Event()
    renewals: list[float] = []

    def renew(lease, ttl):
        renewals.append(time.monotonic())
        renewing.set()
        answer.wait(5)
        raise LeaseLost("broken by an operator")

    monkeypatch.setattr(store, "renew", renew)
    reports: list[tuple] = []
    heartbeat = Heartbeat(
        keeper,
        RunOptions(key="k", command=["true"], ttl=1.0),
        EventLog(stream=open(os.devnull, "w")),  # noqa: SIM115 - closed with the process
        on_loss=lambda *found: reports.append(("lost", *found)),
        on_renewed=lambda lease: reports.append(("renewed", lease)),
        on_deadline=lambda: reports.append(("deadline",)),
    )
    heartbeat.start()
    stopper = threading.Thread(target=heartbeat.stop_reports)
    try:
        assert renewing.wait(5)
        stopper.start()
        stopper.join(0.2)
        assert stopper.is_alive()  # it waits for the renewal under way
        answer.set()
        stopper.join(5)
        assert not stopper.is_alive()
        assert [report[0] for report in reports] == ["lost"]  # found before the stop: counts
        heartbeat.join(5)
        assert len(renewals) == 1  # and none after it
    finally:
        answer.set()
        heartbeat.close()
        store.close()


def test_sqlite_expiry_ignores_the_wall_clock(tmp_path):
    """A client whose wall clock is an hour off neither steals nor extends a lease."""
    import time

    path = tmp_path / "db"
    honest = SQLiteStore(path)
    skewed_ahead = SQLiteStore(path, wall_clock=lambda: time.time() + 3600)
    skewed_behind = SQLiteStore(path, wall_clock=lambda: time.time() - 3600)
    lease = honest.acquire("k", 30, HOLDER, "owner-a")
    assert lease is not None
    assert skewed_ahead.acquire("k", 30, HOLDER, "owner-b") is None
    short = granted(skewed_behind.acquire("short", 0.2, HOLDER, "owner-c"))
    time.sleep(0.3)
    later = granted(honest.acquire("short", 30, HOLDER, "owner-d"))
    assert later.fencing_token > short.fencing_token
