"""Signals that reach the supervisor in the windows around its child's start, in process:
the moment is chosen by the test instead of hoped for from outside."""

from __future__ import annotations

import os
import signal

import pytest

from tasklock_cli import supervisor as supervisor_module
from tasklock_cli.events import EventLog
from tasklock_cli.process import Child
from tasklock_cli.stores.sqlite import SQLiteStore
from tasklock_cli.supervisor import RunOptions, Supervisor


@pytest.fixture
def store(tmp_path):
    with SQLiteStore(tmp_path / "locks.db") as opened:
        yield opened


@pytest.fixture(autouse=True)
def no_subreaper(monkeypatch):
    """The test process must not become a subreaper for the rest of the session."""
    monkeypatch.setattr(supervisor_module, "become_subreaper", lambda: None)


def run(store, command: list[str]) -> int:
    events = EventLog(stream=open(os.devnull, "w"))  # noqa: SIM115 - closed with the process
    return Supervisor(store, RunOptions(key="k", command=command, ttl=60), events).run()


def test_a_sigterm_while_the_child_is_being_started_reaches_the_child(store, monkeypatch):
    class SignalledWhileStarting(Child):
        def __init__(self, *args, **kwargs) -> None:
            super().__init__(*args, **kwargs)
            os.kill(os.getpid(), signal.SIGTERM)  # handled before the supervisor knows it

    monkeypatch.setattr(supervisor_module, "Child", SignalledWhileStarting)
    assert run(store, ["sleep", "5"]) == 128 + signal.SIGTERM
    assert store.peek("k") is None


def test_a_signal_once_the_lease_is_held_releases_it_and_runs_nothing(store, monkeypatch, tmp_path):
    marker = tmp_path / "ran"
    original_run_child = Supervisor._run_child

    def signalled_first(self):
        os.kill(os.getpid(), signal.SIGHUP)  # after the acquire, before the child
        return original_run_child(self)

    monkeypatch.setattr(Supervisor, "_run_child", signalled_first)
    assert run(store, ["touch", str(marker)]) == 128 + signal.SIGHUP
    assert not marker.exists()
    assert store.peek("k") is None
