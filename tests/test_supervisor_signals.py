"""Signals that reach the supervisor in the windows around its child's start, in process:
the moment is chosen by the test instead of hoped for from outside."""

from __future__ import annotations

import os
import signal
import time

import pytest

from tasklock_cli.errors import StoreUnavailable
from tasklock_cli.events import EventLog
from tasklock_cli.proc.process import Child
from tasklock_cli.run import supervisor as supervisor_module
from tasklock_cli.run.options import RunOptions
from tasklock_cli.run.supervisor import Supervisor
from tasklock_cli.stores.model import Holder
from tasklock_cli.stores.sqlite.store import SQLiteStore
from tests.support.engine import FakeClock


@pytest.fixture
def sqlite_store(tmp_path):
    with SQLiteStore(tmp_path / "locks.db") as opened:
        yield opened


@pytest.fixture(autouse=True)
def no_subreaper(monkeypatch):
    """The test process must not become a subreaper for the rest of the session."""
    monkeypatch.setattr(supervisor_module, "become_subreaper", lambda: None)


def run(sqlite_store, command: list[str]) -> int:
    events = EventLog(stream=open(os.devnull, "w"))  # noqa: SIM115 - closed with the process
    return Supervisor(sqlite_store, RunOptions(key="k", command=command, ttl=60), events).run()


def test_a_sigterm_while_the_child_is_being_started_reaches_the_child(sqlite_store, monkeypatch):
    class SignalledWhileStarting(Child):
        def __init__(self, *args, **kwargs) -> None:
            super().__init__(*args, **kwargs)
            os.kill(os.getpid(), signal.SIGTERM)  # handled before the supervisor knows it

    monkeypatch.setattr(supervisor_module, "Child", SignalledWhileStarting)
    assert run(sqlite_store, ["sleep", "5"]) == 128 + signal.SIGTERM
    assert sqlite_store.peek("k") is None


def test_a_signal_once_the_lease_is_held_releases_it_and_runs_nothing(
    sqlite_store, monkeypatch, tmp_path
):
    marker = tmp_path / "ran"
    original_run_child = Supervisor._run_child

    def signalled_first(self):
        os.kill(os.getpid(), signal.SIGHUP)  # after the acquire, before the child
        return original_run_child(self)

    monkeypatch.setattr(Supervisor, "_run_child", signalled_first)
    assert run(sqlite_store, ["touch", str(marker)]) == 128 + signal.SIGHUP
    assert not marker.exists()
    assert sqlite_store.peek("k") is None


def test_a_signal_during_the_last_attempt_wins_over_the_conflict(sqlite_store, tmp_path):
    other = SQLiteStore(tmp_path / "locks.db")
    assert other.acquire("k", 60, Holder("h", 1, "u", []), "someone else") is not None

    class SignalledWhileRefusing(SQLiteStore):
        def acquire(self, *args, **kwargs):
            lease = super().acquire(*args, **kwargs)
            os.kill(os.getpid(), signal.SIGTERM)  # recorded: no wait to cut short
            return lease

    with SignalledWhileRefusing(tmp_path / "locks.db") as refusing:
        assert run(refusing, ["true"]) == 128 + signal.SIGTERM  # not 75
    other.close()


def test_a_failed_renewal_before_the_start_releases_the_lease(tmp_path):
    clock = FakeClock()

    class SlowThenDown(SQLiteStore):
        def acquire(self, *args, **kwargs):
            lease = super().acquire(*args, **kwargs)
            clock.advance(45)  # a slow reply: under half the 60 s ttl left
            return lease

        def renew(self, lease, ttl):
            raise StoreUnavailable("the store went away")

    with SlowThenDown(tmp_path / "locks.db") as store:
        events = EventLog(stream=open(os.devnull, "w"))  # noqa: SIM115
        supervisor = Supervisor(store, RunOptions(key="k", command=["true"], ttl=60), events, clock)
        with pytest.raises(StoreUnavailable):
            supervisor.run()
        assert store.peek("k") is None  # not left held for the rest of its ttl


def test_a_signal_pending_when_the_pre_start_renewal_fails_wins(tmp_path):
    """The renewal right before the start fails while a signal is pending: 128+N, not the
    store's error, and the lease is not left held."""
    clock = FakeClock()

    class SlowThenDownAndSignalled(SQLiteStore):
        def acquire(self, *args, **kwargs):
            lease = super().acquire(*args, **kwargs)
            clock.advance(45)  # under half the 60 s ttl left: a renewal comes first
            return lease

        def renew(self, lease, ttl):
            os.kill(os.getpid(), signal.SIGHUP)  # recorded while the renewal is under way
            raise StoreUnavailable("the store went away")

    with SlowThenDownAndSignalled(tmp_path / "locks.db") as store:
        events = EventLog(stream=open(os.devnull, "w"))  # noqa: SIM115
        supervisor = Supervisor(store, RunOptions(key="k", command=["true"], ttl=60), events, clock)
        assert supervisor.run() == 128 + signal.SIGHUP
        assert store.peek("k") is None


def test_a_signal_that_cuts_a_store_call_short_after_the_acquire_leaves_a_ledger_record(
    tmp_path,
):
    """A store call under the lease (the --once-per look) blocks, a SIGTERM comes and cuts
    it short: the lease goes back with a `signalled` record, as every run that acquired
    the lease leaves one."""

    class StuckAfterAcquiring(SQLiteStore):
        def last_success(self, key):
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(30)  # a store that stopped answering; the signal's alarm ends it
            raise AssertionError("not cut short")

    with StuckAfterAcquiring(tmp_path / "locks.db") as store:
        events = EventLog(stream=open(os.devnull, "w"))  # noqa: SIM115
        options = RunOptions(key="k", command=["true"], ttl=60, once_per=3600)
        started = time.monotonic()
        assert Supervisor(store, options, events).run() == 128 + signal.SIGTERM
        assert time.monotonic() - started < 5
        assert store.peek("k") is None
        (run,) = store.history("k")
        assert (run.outcome, run.exit_code) == ("signalled", None)
