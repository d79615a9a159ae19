"""The SQLite store's break FIFOs (``stores/sqlite/breaks.py``) live as long as their lease
is held or waited on, not as long as the store is open: a program holding lease after
lease on one open store keeps no FIFO, and no descriptor, of a released one; a wait under
way as the release comes (the holder's heartbeat: ``concurrent_release``) keeps its FIFO
until it is over, and still hears a break until then."""

from __future__ import annotations

import os
import threading
import time

import pytest

from tasklock_cli.stores.model import Holder
from tasklock_cli.stores.sqlite.store import SQLiteStore

pytestmark = pytest.mark.quick

HOLDER = Holder(host="h", pid=1, user="u", command=["true"])


def fifos(path) -> list[str]:
    holders = f"{path}.holders"
    return sorted(
        name for _, _, names in os.walk(holders) for name in names if not name.startswith(".")
    )


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_leases_held_one_after_another_leave_no_fifo_behind(tmp_path):
    path = tmp_path / "locks.db"
    with SQLiteStore(path) as store:
        lease = store.acquire("k", 30, HOLDER, "owner-0")
        assert lease is not None
        assert store.wait_for_break(lease, 0.01) is False  # its FIFO made
        assert len(fifos(path)) == 1
        store.release(lease)
        baseline = open_fds()
        for n in range(1, 50):
            lease = store.acquire("k", 30, HOLDER, f"owner-{n}")
            assert lease is not None
            assert store.wait_for_break(lease, 0.001) is False
            store.release(lease)
        assert fifos(path) == []
        assert open_fds() <= baseline


def test_a_wait_under_way_at_the_release_keeps_its_fifo_until_it_is_over(tmp_path):
    path = tmp_path / "locks.db"
    with SQLiteStore(path) as store:
        lease = store.acquire("k", 30, HOLDER, "owner")
        assert lease is not None
        assert store.wait_for_break(lease, 0.001) is False  # made, and looked at once
        stop_r, stop_w = os.pipe()
        heard: list[bool] = []
        waiting = threading.Thread(
            target=lambda: heard.append(store.wait_for_break(lease, 30, stop_r))
        )
        waiting.start()
        time.sleep(0.1)  # the heartbeat waits on the FIFO
        store.release(lease)
        assert len(fifos(path)) == 1  # still waited on
        os.write(stop_w, b"!")  # the heartbeat is woken, as the run's join wakes it
        waiting.join(10)
        assert heard == [False]
        assert fifos(path) == []
        os.close(stop_r)
        os.close(stop_w)


def test_a_break_still_reaches_a_lease_that_is_held(tmp_path):
    """Another lease's release takes only its own FIFO."""
    path = tmp_path / "locks.db"
    with SQLiteStore(path) as store:
        held = store.acquire("a", 30, HOLDER, "owner-a")
        other = store.acquire("b", 30, HOLDER, "owner-b")
        assert held is not None and other is not None
        assert store.wait_for_break(held, 0.001) is False
        assert store.wait_for_break(other, 0.001) is False
        store.release(other)
        assert store.force_release("a", held.fencing_token)
        assert store.wait_for_break(held, 5) is True


def test_a_wait_begun_after_the_release_leaves_no_fifo(tmp_path):
    """The heartbeat's last wait may begin just after the release (it checked for a stop
    before): the FIFO it makes finds the lease gone, and goes with that wait."""
    path = tmp_path / "locks.db"
    with SQLiteStore(path) as store:
        lease = store.acquire("k", 30, HOLDER, "owner")
        assert lease is not None
        assert store.release(lease)
        assert store.wait_for_break(lease, 1) is True  # gone: told at once
        assert fifos(path) == []
