"""SQLite's fencing tokens in blocks (docs/design/sqlite.md, "Fencing tokens in blocks"):
only an acquire that reserves a new block syncs, and a power cut, played here by putting
back the files as the last sync left them and starting a new boot, never has a token
issued twice, by this tasklock or by one that predates the blocks."""

from __future__ import annotations

import os
import shutil
import sqlite3
from pathlib import Path

import pytest

from tasklock_cli.stores.base import Store
from tasklock_cli.stores.model import MAX_FENCING_TOKEN
from tasklock_cli.stores.model import Holder
from tasklock_cli.stores.sqlite.store import RESERVED_SLOT
from tasklock_cli.stores.sqlite.store import TABLE
from tasklock_cli.stores.sqlite.store import TOKEN_BLOCK
from tasklock_cli.stores.sqlite.store import UNKNOWN_BOOT
from tasklock_cli.stores.sqlite.store import SQLiteStore

pytestmark = pytest.mark.quick

HOLDER = Holder(host="h", pid=1, user="u", command=["true"])
FILES = ("", "-wal")  # the database and its WAL; -shm is rebuilt from them at the next open


def store_in_boot(path: Path, boot: str) -> SQLiteStore:
    store = SQLiteStore(path)
    store._boot = boot
    return store


def disk_now(path: Path) -> Path:
    """The files as they are now, beside them: what the disk holds after a sync."""
    snapshot = path.parent / "disk"
    snapshot.mkdir()
    for suffix in FILES:
        shutil.copyfile(f"{path}{suffix}", snapshot / f"{path.name}{suffix}")
    return snapshot


def power_cut(path: Path, snapshot: Path) -> None:
    """The files as ``disk_now`` left them: every commit since is gone, and the WAL index
    with them."""
    for suffix in (*FILES, "-shm"):
        Path(f"{path}{suffix}").unlink(missing_ok=True)
    for suffix in FILES:
        shutil.copyfile(snapshot / f"{path.name}{suffix}", f"{path}{suffix}")


def unsynced_block(path: Path) -> None:
    """The key's block as its reserver left it when it died before its sync: no boot."""
    with sqlite3.connect(path) as conn:
        conn.execute(f"UPDATE {TABLE} SET boot_id = NULL WHERE slot = {RESERVED_SLOT}")


def runs(store: Store, key: str, count: int) -> list[int]:
    """The tokens of ``count`` acquires and releases of ``key``."""
    tokens = []
    for n in range(count):
        lease = store.acquire(key, 30, HOLDER, f"owner-{n}-{os.urandom(4).hex()}")
        assert lease is not None
        tokens.append(lease.fencing_token)
        assert store.release(lease)
    return tokens


@pytest.fixture
def syncs(monkeypatch) -> list[str]:
    """The WALs os.fdatasync is called on, from now (the directory's, once per connection,
    is not counted)."""
    called: list[str] = []
    real = os.fdatasync

    def counted(fd: int) -> None:
        synced = os.readlink(f"/proc/self/fd/{fd}")
        if synced.endswith("-wal"):
            called.append(synced)
        real(fd)

    monkeypatch.setattr(os, "fdatasync", counted)
    return called


def test_a_power_cut_never_has_a_token_issued_twice(tmp_path):
    path = tmp_path / "locks.db"
    with store_in_boot(path, "boot-1") as store:
        assert runs(store, "k", 1) == [1]  # a new block, synced: on disk as it is now
        snapshot = disk_now(path)
        assert runs(store, "k", 10) == list(range(2, 12))  # within the block: not synced

    power_cut(path, snapshot)  # the disk holds what the last sync left: 2-11 are gone
    with sqlite3.connect(path) as conn:
        rows = conn.execute(f"SELECT slot, fencing_token FROM {TABLE} WHERE key = 'k'")
        assert sorted(rows) == [(RESERVED_SLOT, 1 + TOKEN_BLOCK), (0, 1)]
        # A tasklock from before the blocks counts on from the highest token of the key's
        # rows: past the block too.
        (older,) = conn.execute(f"SELECT max(fencing_token) + 1 FROM {TABLE} WHERE key = 'k'")
        assert older[0] > 11

    with store_in_boot(path, "boot-2") as after:
        assert runs(after, "k", 2) == [2 + TOKEN_BLOCK, 3 + TOKEN_BLOCK]


def test_only_an_acquire_that_reserves_a_block_syncs(tmp_path, syncs):
    path = tmp_path / "locks.db"
    with store_in_boot(path, "boot-1") as store:
        assert runs(store, "k", 1) == [1]
        assert len(syncs) == 1  # the key's first block in this boot
        assert runs(store, "k", 5) == [2, 3, 4, 5, 6]
        assert len(syncs) == 1  # within it

        with sqlite3.connect(path) as conn:  # the block ends at the next token
            conn.execute(f"UPDATE {TABLE} SET fencing_token = 7 WHERE slot = {RESERVED_SLOT}")
        assert runs(store, "k", 3) == [7, 8, 9]  # 7 its last, 8 a new block's first
        assert len(syncs) == 2  # that new block: synced once


def test_another_boots_block_is_left_and_synced(tmp_path, syncs):
    path = tmp_path / "locks.db"
    with store_in_boot(path, "boot-1") as first:
        assert runs(first, "k", 3) == [1, 2, 3]
    syncs.clear()
    with store_in_boot(path, "boot-2") as second:
        assert runs(second, "k", 2) == [2 + TOKEN_BLOCK, 3 + TOKEN_BLOCK]
        assert len(syncs) == 1


def test_where_the_boot_is_unknown_every_token_is_synced(tmp_path, syncs):
    """No boot id (no /proc): a reboot cannot be told, so no token is left unsynced."""
    path = tmp_path / "locks.db"
    with store_in_boot(path, UNKNOWN_BOOT) as store:
        assert runs(store, "k", 3) == [1, 2, 3]
        assert len(syncs) == 3


def test_the_reservation_is_never_a_lease(tmp_path):
    """Its row has no owner: listed nowhere, swept never, and no slot is taken from it."""
    path = tmp_path / "locks.db"
    with store_in_boot(path, "boot-1") as store:
        runs(store, "k", 1)
        assert list(store.list(include_expired=True)) == []
        assert store.peek("k") is None
        assert store.sweep() == 0
        lease = store.acquire("k", 30, HOLDER, "owner", limit=2)
        assert lease is not None and lease.slot == 0


def test_a_block_never_synced_is_never_drawn_from(tmp_path, syncs):
    """An acquire that reserved a block and died before its sync leaves the block without
    a boot: the next acquire, finding it so, reserves past it and syncs."""
    path = tmp_path / "locks.db"
    with store_in_boot(path, "boot-1") as store:
        assert runs(store, "k", 2) == [1, 2]
        unsynced_block(path)
        syncs.clear()
        assert runs(store, "k", 2) == [2 + TOKEN_BLOCK, 3 + TOKEN_BLOCK]
        assert len(syncs) == 1


def test_the_same_owner_retrying_after_a_power_cut_keeps_its_token_not_the_block(tmp_path):
    """A retry with the same owner (a program that keeps its owner across restarts) gets
    its lease back, token and all, and leaves the key's block as it is: the tokens issued
    from it before the power cut stay below the next ones."""
    path = tmp_path / "locks.db"
    with store_in_boot(path, "boot-1") as store:
        lease = store.acquire("k", 30, HOLDER, "kept-owner")
        assert lease is not None and lease.fencing_token == 1  # a new block, synced
        snapshot = disk_now(path)
        store.release(lease)
        assert runs(store, "k", 5) == [2, 3, 4, 5, 6]  # unsynced, then lost

    power_cut(path, snapshot)
    with store_in_boot(path, "boot-2") as after:
        again = after.acquire("k", 30, HOLDER, "kept-owner")
        assert again is not None and again.fencing_token == 1
        assert after.release(again)
        assert runs(after, "k", 2) == [2 + TOKEN_BLOCK, 3 + TOKEN_BLOCK]


def test_a_retry_whose_block_was_never_synced_syncs(tmp_path, syncs):
    """Its first try reserved a block and failed before the sync (the block has no boot):
    the retry keeps its token and syncs it before returning."""
    path = tmp_path / "locks.db"
    with store_in_boot(path, "boot-1") as store:
        first = store.acquire("k", 30, HOLDER, "owner")
        assert first is not None
        unsynced_block(path)
        syncs.clear()
        again = store.acquire("k", 30, HOLDER, "owner")
        assert again is not None and again.fencing_token == first.fencing_token
        assert len(syncs) == 1


def test_the_greatest_token_is_still_issued(tmp_path):
    path = tmp_path / "locks.db"
    with store_in_boot(path, "boot-1") as store:
        runs(store, "k", 1)
        with sqlite3.connect(path) as conn:
            conn.execute(
                f"UPDATE {TABLE} SET fencing_token = ? WHERE slot = 0", (MAX_FENCING_TOKEN - 2,)
            )
        assert runs(store, "k", 2) == [MAX_FENCING_TOKEN - 1, MAX_FENCING_TOKEN]
