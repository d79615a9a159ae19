"""util.threads and util.suppressed: the parts of threading and contextlib that `run` uses,
without importing them (issue 45)."""

from __future__ import annotations

import os
import sys
import time

import pytest

from tasklock_cli.util import suppressed
from tasklock_cli.util.threads import DaemonThread
from tasklock_cli.util.threads import Flag


def test_a_flag_not_set_waits_out_its_timeout():
    flag = Flag()
    started = time.monotonic()
    assert flag.wait(0.05) is False
    assert time.monotonic() - started >= 0.045
    assert not flag.is_set()


def test_a_flag_set_by_another_thread_ends_the_wait_at_once():
    flag = Flag()

    def set_soon() -> None:
        time.sleep(0.05)
        flag.set()

    DaemonThread(set_soon).start()
    started = time.monotonic()
    assert flag.wait(5.0) is True
    # Woken by the set, not by the timeout (5 s): well under a second even when loaded.
    assert time.monotonic() - started < 2.5
    assert flag.is_set() and flag.wait(0) is True  # stays set; set twice is harmless
    flag.set()


def test_a_daemon_thread_is_alive_until_its_target_returns_and_join_waits_for_it():
    flag = Flag()
    thread = DaemonThread(lambda: flag.wait(5.0))
    assert not thread.is_alive()
    thread.start()
    assert thread.is_alive()
    thread.join(0.05)  # times out: still waiting for the flag
    assert thread.is_alive()
    flag.set()
    thread.join(5.0)
    assert not thread.is_alive()


def test_a_daemon_thread_whose_target_raises_ends_and_says_so(monkeypatch):
    seen: list[BaseException] = []
    monkeypatch.setattr(sys, "unraisablehook", lambda report: seen.append(report.exc_value))

    def boom() -> None:
        raise ValueError("boom")

    thread = DaemonThread(boom)
    thread.start()
    thread.join(5.0)
    assert not thread.is_alive()
    assert [str(exc) for exc in seen] == ["boom"]


def test_a_daemon_thread_is_not_alive_in_a_process_forked_after_its_start():
    flag = Flag()
    thread = DaemonThread(lambda: flag.wait(5.0))
    thread.start()
    pid = os.fork()
    if pid == 0:  # the child: the thread was not copied, and join does not wait for it
        started = time.monotonic()
        thread.join(5.0)
        os._exit(0 if not thread.is_alive() and time.monotonic() - started < 1.0 else 1)
    _, status = os.waitpid(pid, 0)
    flag.set()
    thread.join(5.0)
    assert os.waitstatus_to_exitcode(status) == 0


def test_suppressed_ends_the_block_on_the_exceptions_named_and_their_subclasses():
    with suppressed(OSError):
        raise FileNotFoundError("gone")  # a subclass
    with suppressed(KeyError, ValueError):
        raise ValueError("x")
    with pytest.raises(TypeError), suppressed(OSError, ValueError):
        raise TypeError("not named: goes on")
    with suppressed(OSError):
        pass  # nothing raised: nothing to do
