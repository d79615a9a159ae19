"""The SQLite store's wake-ups: FIFOs beside the database, one waiter woken per release."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from tasklock_cli.stores.sqlite.entries import key_dir_name
from tasklock_cli.stores.sqlite.waiting import LocalWakeups
from tests.support.cli import piped
from tests.support.cli import wait_until


def test_a_release_wakes_the_longest_waiting_waiter_only(tmp_path):
    first, second, releaser = (LocalWakeups(tmp_path / "w") for _ in range(3))
    assert first.register("k") and second.register("k")
    releaser.wake_one("k")
    assert first.wait(0.5) is True
    assert second.wait(0.05) is False
    first.leave()
    releaser.wake_one("k")
    assert second.wait(0.5) is True
    second.leave()
    assert os.listdir(tmp_path / "w") == []


def test_a_waiter_that_gives_up_passes_an_unread_wake_up_to_the_next(tmp_path):
    first, second, releaser = (LocalWakeups(tmp_path / "w") for _ in range(3))
    assert first.register("k") and second.register("k")
    releaser.wake_one("k")  # meant for first, which stops waiting without reading it
    first.give_up("k")
    assert second.wait(0.5) is True
    second.give_up("k")  # nothing unread: wakes nobody
    assert os.listdir(tmp_path / "w") == []


def test_giving_up_another_key_keeps_the_place_in_line(tmp_path):
    waiter, releaser = LocalWakeups(tmp_path / "w"), LocalWakeups(tmp_path / "w")
    assert waiter.register("k")
    waiter.give_up("other")
    releaser.wake_one("k")
    assert waiter.wait(0.5) is True


@pytest.mark.parametrize("step", ["mkfifo", "open", "rename"])
def test_registering_cut_short_by_a_signal_leaves_nothing_behind(tmp_path, monkeypatch, step):
    real = getattr(os, step)

    def interrupted_after(*args, **kwargs):
        real(*args, **kwargs)
        raise KeyboardInterrupt  # what a signal handler raising at that moment looks like

    monkeypatch.setattr(os, step, interrupted_after)
    waiter = LocalWakeups(tmp_path / "w")
    with pytest.raises(KeyboardInterrupt):
        waiter.register("k")
    monkeypatch.undo()
    assert os.listdir(tmp_path / "w") == []
    assert waiter.register("k")  # and it can register again


def test_after_a_wake_up_the_next_wait_waits(tmp_path):
    """The waker's FIFO end is closed by then; the waiter must not read that as ready
    (end-of-file) for ever, which would make a waiter that lost the race spin."""
    waiter, releaser = LocalWakeups(tmp_path / "w"), LocalWakeups(tmp_path / "w")
    assert waiter.register("k")
    releaser.wake_one("k")
    assert waiter.wait(0.5) is True
    assert waiter.register("k")  # lost the race: back in line, same place
    assert waiter.wait(0.1) is False
    releaser.wake_one("k")
    assert waiter.wait(0.5) is True


def test_giving_up_wakes_the_next_waiter_even_with_nothing_unread(tmp_path):
    first, second = LocalWakeups(tmp_path / "w"), LocalWakeups(tmp_path / "w")
    assert first.register("k") and second.register("k")
    first.give_up("k")  # its wait may have been cut short just after reading a wake-up
    assert second.wait(0.5) is True


def test_a_wake_up_written_while_giving_up_reaches_the_next_waiter(tmp_path, monkeypatch):
    """A releaser that opened first's FIFO before first unlinked it writes between first's
    last look and its close: that wake-up must not be lost with first's FIFO."""
    first, second = LocalWakeups(tmp_path / "w"), LocalWakeups(tmp_path / "w")
    assert first.register("k") and second.register("k")
    releaser_fd = os.open(
        tmp_path / "w" / key_dir_name("k") / first._name, os.O_WRONLY | os.O_NONBLOCK
    )
    real_close, first_fd = os.close, first._fd
    written: list[int] = []

    def write_just_before_the_close(fd):
        if fd == first_fd and not written:  # (the number may be reused after the close)
            written.append(os.write(releaser_fd, b"!"))  # lands in first's FIFO
        real_close(fd)

    monkeypatch.setattr(os, "close", write_just_before_the_close)
    first.give_up("k")
    monkeypatch.undo()
    os.close(releaser_fd)
    assert written == [1]
    assert second.wait(0.5) is True
    second.leave()


def test_waiters_of_other_keys_are_not_woken(tmp_path):
    waiter, releaser = LocalWakeups(tmp_path / "w"), LocalWakeups(tmp_path / "w")
    assert waiter.register("a")
    releaser.wake_one("b")
    assert waiter.wait(0.05) is False


def test_registering_again_for_the_same_key_keeps_the_place_in_line(tmp_path):
    first, second, releaser = (LocalWakeups(tmp_path / "w") for _ in range(3))
    assert first.register("k") and second.register("k")
    assert first.register("k")
    releaser.wake_one("k")
    assert first.wait(0.5) is True


def test_a_killed_waiters_fifo_is_removed_and_the_next_waiter_woken(tmp_path):
    directory = tmp_path / "w"
    code = (
        "import sys, time\n"
        "from tasklock_cli.stores.sqlite.waiting import LocalWakeups\n"
        f"assert LocalWakeups(__import__('pathlib').Path({str(directory)!r})).register('k')\n"
        "print('ready', flush=True)\n"
        "time.sleep(60)\n"
    )
    dead = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert piped(dead.stdout).readline().strip() == "ready"
    time.sleep(0.01)  # the next waiter's FIFO is younger
    alive = LocalWakeups(directory)
    assert alive.register("k")
    dead.send_signal(signal.SIGKILL)
    dead.wait()
    LocalWakeups(directory).wake_one("k")
    assert alive.wait(0.5) is True
    key_dir = directory / key_dir_name("k")
    wait_until(lambda: len(os.listdir(key_dir)) == 1, timeout=2)  # only alive's is left
    alive.leave()


def test_where_fifos_cannot_be_made_waiting_falls_back_to_sleeping(tmp_path):
    (tmp_path / "w").write_text("not a directory")
    waiter = LocalWakeups(tmp_path / "w")
    assert waiter.register("k") is False
    started = time.monotonic()
    assert waiter.wait(0.05) is False
    assert time.monotonic() - started >= 0.04
    LocalWakeups(tmp_path / "w").wake_one("k")  # never raises
