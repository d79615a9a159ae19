"""SQLite-only behaviour: the sweep's index use, leases from another boot, schema upgrades."""

from __future__ import annotations

import os
import sqlite3
import threading
import time

import pytest

import tasklock_cli.stores.sqlite.store as sqlite_module
from tasklock_cli.stores.model import Holder
from tasklock_cli.stores.model import Lease
from tasklock_cli.stores.sqlite.store import _EXPIRED
from tasklock_cli.stores.sqlite.store import _EXPIRED_RANGES
from tasklock_cli.stores.sqlite.store import SCHEMA_VERSION
from tasklock_cli.stores.sqlite.store import TABLE
from tasklock_cli.stores.sqlite.store import TOKEN_BLOCK
from tasklock_cli.stores.sqlite.store import WAITERS_TABLE
from tasklock_cli.stores.sqlite.store import SQLiteStore
from tasklock_cli.stores.sqlite.store import boot_clock
from tasklock_cli.stores.sqlite.store import current_boot_id
from tasklock_cli.testing.contract.breaks import BREAKER
from tasklock_cli.testing.helpers import OTHER
from tasklock_cli.testing.helpers import token
from tests.support.contract import granted
from tests.support.contract import in_threads

HOLDER = Holder(host="h", pid=1, user="u", command=["true"])

# The leases table as versions 1 to 3 made it: one row per key, its fencing counter in that row.
LEASES_BEFORE_SLOTS = f"""
CREATE TABLE {TABLE} (
    key           TEXT PRIMARY KEY,
    fencing_token INTEGER NOT NULL,
    owner_token   TEXT,
    boot_id       TEXT,
    expires_boot  REAL,
    acquired_at   REAL,
    expires_at    REAL,
    holder        TEXT
) WITHOUT ROWID;
"""

VERSION_1_SCHEMA = f"""{LEASES_BEFORE_SLOTS}
CREATE INDEX {TABLE}_held ON {TABLE} (expires_boot) WHERE owner_token IS NOT NULL;
PRAGMA user_version = 1;
"""


VERSION_3_SCHEMA = f"""{LEASES_BEFORE_SLOTS}
CREATE INDEX {TABLE}_expiry ON {TABLE} (boot_id, expires_boot)
    WHERE owner_token IS NOT NULL;
CREATE TABLE tasklock_runs (
    key           TEXT NOT NULL,
    fencing_token INTEGER NOT NULL,
    started_at    REAL NOT NULL,
    ended_at      REAL NOT NULL,
    data          TEXT NOT NULL,
    PRIMARY KEY (key, fencing_token)
) WITHOUT ROWID;
PRAGMA user_version = 3;
"""


def make_version_3_file(path) -> None:
    """A live lease on "live" (token 7) and a freed key "freed" (counter at 5), as
    version 3 wrote them."""
    with sqlite3.connect(path) as conn:
        conn.executescript(VERSION_3_SCHEMA)
        holder = '{"host": "h", "pid": 1, "user": "u", "command": ["true"], "note": null}'
        now, wall = boot_clock(), time.time()
        conn.execute(
            f"INSERT INTO {TABLE} VALUES ('live', 7, 'owner-live', ?, ?, ?, ?, ?)",
            (current_boot_id(), now + 3600, wall, wall + 3600, holder),
        )
        conn.execute(
            f"INSERT INTO {TABLE} VALUES ('freed', 5, NULL, NULL, NULL, ?, NULL, NULL)", (wall,)
        )


def query_plan(path, sql: str) -> list[str]:
    with sqlite3.connect(path) as conn:
        params = {"boot": "b", "now": 0.0}
        return [row[3] for row in conn.execute(f"EXPLAIN QUERY PLAN {sql}", params)]


def test_sweep_searches_the_index_instead_of_scanning_held_leases(tmp_path):
    path = tmp_path / "locks.db"
    SQLiteStore(path).init_schema()
    for expired in _EXPIRED_RANGES:
        plan = query_plan(path, f"SELECT key FROM {TABLE} WHERE {expired} LIMIT 10")
        assert len(plan) == 1 and plan[0].startswith(f"SEARCH {TABLE} USING INDEX"), plan
    counted = query_plan(path, f"SELECT count(*) FROM {TABLE} WHERE {_EXPIRED}")
    assert not [step for step in counted if step.startswith("SCAN")], counted


@pytest.mark.parametrize(
    "statement",
    ["_ACQUIRE", "_OTHER_LIMIT", "_FULLNESS", "_BREAK", "_PROCESSES", "_BROKEN_BY", "_TOKENS"],
)
def test_a_keys_statements_search_its_rows_not_every_live_lease(tmp_path, statement):
    """The expiry index's live range spans every key: a statement about one key must
    search the primary key (key, slot) instead."""
    path = tmp_path / "locks.db"
    SQLiteStore(path).init_schema()
    names = ["key", "owner", "limit", "ttl", "wall", "holder", "token", "by", "slot", "broken"]
    names += ["mode", "span"]
    params = dict.fromkeys(names, 1)
    with sqlite3.connect(path) as conn:
        plan = [
            row[3]
            for row in conn.execute(
                f"EXPLAIN QUERY PLAN {getattr(sqlite_module, statement)}",
                {**params, "boot": "b", "now": 0.0, "prefix": "broken:"},
            )
        ]
    searches = [step for step in plan if TABLE in step]
    assert searches and all("USING PRIMARY KEY (key=?" in step for step in searches), plan


def test_sweep_frees_leases_of_another_boot_and_run_out_ones_only(tmp_path):
    path = tmp_path / "locks.db"
    before_reboot = SQLiteStore(path)
    before_reboot._boot = "a-boot-before-this-one"
    assert before_reboot.acquire("old-boot", 3600, HOLDER, "owner-old")
    store = SQLiteStore(path)
    short = store.acquire("ran-out", 0.05, HOLDER, "owner-short")
    live = store.acquire("live", 3600, HOLDER, "owner-live")
    assert short and live
    time.sleep(0.1)

    assert store.sweep(dry_run=True) == 2
    assert store.sweep() == 2
    assert [info.key for info in store.list()] == ["live"]
    assert store.sweep() == 0
    taken = store.acquire("old-boot", 30, HOLDER, "owner-new")
    # past the block the other boot reserved (1 + TOKEN_BLOCK): its tokens may be lost
    assert taken is not None and taken.fencing_token == 2 + TOKEN_BLOCK


def test_a_version_1_file_is_upgraded_in_place_keeping_its_leases(tmp_path):
    path = tmp_path / "locks.db"
    with sqlite3.connect(path) as conn:
        conn.executescript(VERSION_1_SCHEMA)
    first = SQLiteStore(path).acquire("k", 3600, HOLDER, "owner-a")
    assert first is not None

    with sqlite3.connect(path) as conn:
        indexes = {
            row[0] for row in conn.execute("SELECT name FROM sqlite_master WHERE type='index'")
        }
        (version,) = conn.execute("PRAGMA user_version").fetchone()
    assert version == SCHEMA_VERSION
    assert f"{TABLE}_expiry" in indexes and f"{TABLE}_held" not in indexes
    info = SQLiteStore(path).peek("k")
    assert info is not None and info.fencing_token == first.fencing_token


def test_a_version_3_file_is_rebuilt_keeping_live_leases_and_fencing_counters(tmp_path):
    path = tmp_path / "locks.db"
    make_version_3_file(path)
    store = SQLiteStore(path)

    (live,) = store.holders("live")
    assert (live.slot, live.limit, live.fencing_token, live.expired) == (0, 1, 7, False)
    assert live.holder == HOLDER
    assert store.acquire("live", 30, HOLDER, "owner-other") is None
    old_lease = Lease("live", "owner-live", 7, live.acquired_at, live.expires_at)
    assert store.renew(old_lease, 30).fencing_token == 7  # its holder keeps renewing it
    assert store.release(old_lease) is True
    after_live = granted(store.acquire("live", 30, HOLDER, "owner-next", limit=2))
    assert (after_live.slot, after_live.fencing_token) == (0, 8)
    after_freed = granted(store.acquire("freed", 30, HOLDER, "owner-freed"))
    assert (after_freed.slot, after_freed.fencing_token) == (0, 6)

    with sqlite3.connect(path) as conn:
        (version,) = conn.execute("PRAGMA user_version").fetchone()
        # name -> place in the primary key (0: not in it)
        columns = {row[1]: row[5] for row in conn.execute(f"PRAGMA table_info({TABLE})")}
        tables = {row[0] for row in conn.execute("SELECT name FROM sqlite_master")}
    assert version == SCHEMA_VERSION == 6
    assert (columns["key"], columns["slot"], columns["slot_limit"]) == (1, 2, 0)
    assert f"{TABLE}_expiry" in tables and f"{TABLE}_v4" not in tables


def test_two_processes_opening_a_version_3_file_at_once_both_use_it(tmp_path):
    path = tmp_path / "locks.db"
    make_version_3_file(path)
    opened = threading.Barrier(6)
    errors: list[BaseException] = []

    def open_at_once() -> None:
        store = SQLiteStore(path)  # its own connection, as another process would have
        try:
            opened.wait()
            store.init_schema()
            assert [info.fencing_token for info in store.holders("live")] == [7]
        except BaseException as exc:  # collected: a thread's failure must fail the test
            errors.append(exc)
        finally:
            store.close()

    in_threads(open_at_once, [()] * 6)
    assert errors == []
    with sqlite3.connect(path) as conn:
        rows = conn.execute(f"SELECT key, slot, slot_limit, fencing_token FROM {TABLE}").fetchall()
    assert sorted(rows) == [("freed", 0, 1, 5), ("live", 0, 1, 7)]


def test_one_store_is_safe_to_share_between_threads(tmp_path):
    store = SQLiteStore(tmp_path / "locks.db")
    errors: list[BaseException] = []

    def hold_and_renew(n: int) -> None:
        try:
            for round_ in range(20):
                lease = store.acquire(f"k{n}", 30, HOLDER, f"owner-{n}-{round_}")
                assert lease is not None
                store.renew(lease, 30)
                assert store.release(lease) is True
        except BaseException as exc:  # collected: a thread's failure must fail the test
            errors.append(exc)

    in_threads(hold_and_renew, [(n,) for n in range(16)])
    assert errors == []
    assert list(store.list()) == []


def test_a_write_lock_held_elsewhere_is_waited_out_then_reported(tmp_path, monkeypatch):
    import tasklock_cli.stores.sqlite.connection as sqlite_connection
    from tasklock_cli.errors import StoreUnavailable

    path = tmp_path / "locks.db"
    store = SQLiteStore(path)
    store.init_schema()
    blocker = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    blocker.execute("BEGIN IMMEDIATE")  # e.g. a sweep batch in another process
    release_later = threading.Timer(0.3, lambda: blocker.execute("COMMIT"))
    release_later.start()
    started = time.monotonic()
    assert store.acquire("k", 30, HOLDER, "owner-a") is not None  # many busy slices later
    assert time.monotonic() - started >= 0.25
    release_later.join()

    monkeypatch.setattr(sqlite_connection, "BUSY_TIMEOUT_S", 0.2)
    blocker.execute("BEGIN IMMEDIATE")
    with pytest.raises(StoreUnavailable, match="locked"):
        store.acquire("j", 30, HOLDER, "owner-b")
    blocker.execute("ROLLBACK")
    blocker.close()


def test_where_fifos_cannot_be_made_a_waiter_polls(tmp_path, monkeypatch):
    path = tmp_path / "locks.db"
    path.with_name("locks.db.waiters").write_text("not a directory: no FIFOs here")
    holder, waiter = SQLiteStore(path), SQLiteStore(path)
    assert holder.acquire("k", 30, HOLDER, "owner-a") is not None
    started = time.monotonic()
    waiter.wait_for_release("k", 5)  # looks again after one poll interval
    waited = time.monotonic() - started
    assert sqlite_module.UNSIGNALLED_POLL_S * 0.8 <= waited < 1.0, waited
    polls: list[float] = []
    real_wait = sqlite_module.wait_readable

    def counted_wait(fds, timeout):
        polls.append(timeout)
        return real_wait(fds, timeout)

    monkeypatch.setattr(sqlite_module, "wait_readable", counted_wait)
    waiter.wait_for_release("free", 5)
    assert polls == []  # a free key is not waited for, not even one poll (counted, not timed)


def test_sweep_removes_the_places_of_crashed_waiters(tmp_path):
    """A place that ran out is cleared by the next acquire of its key, or else by sweep."""
    path = tmp_path / "locks.db"
    store = SQLiteStore(path)
    assert store.acquire("k", 3600, HOLDER, "owner-holder")
    crashed = SQLiteStore(path)
    crashed.waiter_ttl = 0.05
    assert crashed.acquire("k", 3600, HOLDER, "owner-crashed", queue=True) is None
    assert SQLiteStore(path).acquire("k", 3600, HOLDER, "owner-live", queue=True) is None

    def places() -> list[str]:
        with sqlite3.connect(path) as conn:
            return [row[0] for row in conn.execute(f"SELECT owner_token FROM {WAITERS_TABLE}")]

    assert sorted(places()) == ["owner-crashed", "owner-live"]
    time.sleep(0.1)  # the crashed waiter's place runs out (the boot clock)
    assert store.sweep() == 0  # (it counts leases)
    assert places() == ["owner-live"] and len(store.waiters("k")) == 1


# What version 5 made: the queues of waiters without supersede, superseded and place.
VERSION_5_WAITERS = f"""
CREATE TABLE {WAITERS_TABLE} (
    seq          INTEGER PRIMARY KEY,
    key          TEXT NOT NULL,
    owner_token  TEXT NOT NULL,
    boot_id      TEXT NOT NULL,
    expires_boot REAL NOT NULL,
    since        REAL NOT NULL,
    holder       TEXT NOT NULL,
    mode         TEXT NOT NULL DEFAULT 'exclusive',
    fifo         TEXT,
    UNIQUE (key, owner_token)
);
CREATE INDEX {WAITERS_TABLE}_queue ON {WAITERS_TABLE} (key, seq);
PRAGMA user_version = 5;
"""


def make_version_5_file(path) -> None:
    """A live lease on "k" as version 5 wrote it (no mode in its holder) and a waiter of
    "k" in a version-5 queue."""
    make_version_3_file(path)
    SQLiteStore(path).init_schema()  # version 6 ...
    with sqlite3.connect(path) as conn:  # ... its queue table back to version 5's
        conn.execute(f"DROP TABLE {WAITERS_TABLE}")
        conn.executescript(VERSION_5_WAITERS)
        holder = '{"host": "h", "pid": 2, "user": "u", "command": ["true"], "note": null}'
        conn.execute(
            f"INSERT INTO {TABLE} VALUES ('k', 0, 1, 3, 'owner-old', ?, ?, 0, 0, ?)",
            (current_boot_id(), boot_clock() + 3600, holder),
        )
        conn.execute(
            f"INSERT INTO {WAITERS_TABLE} (key, owner_token, boot_id, expires_boot, since, holder)"
            " VALUES ('k', 'owner-waiting', ?, ?, 0, ?)",
            (current_boot_id(), boot_clock() + 30, holder),  # (within WAITER_HORIZON_S)
        )


def test_a_version_5_file_gets_the_new_queue_columns_keeping_leases_and_waiters(tmp_path):
    path = tmp_path / "locks.db"
    make_version_5_file(path)
    store = SQLiteStore(path)
    ((old,),) = [store.holders("k")]
    assert (old.fencing_token, old.mode) == (3, "exclusive")  # no mode: exclusive
    assert [(w.holder.pid, w.mode) for w in store.waiters("k")] == [(2, "exclusive")]
    assert store.acquire("k", 30, HOLDER, "owner-reader", queue=True, mode="shared") is None
    assert store.acquire("k", 30, HOLDER, "owner-front", queue=True, front=True) is None
    assert [w.holder.pid for w in store.waiters("k")] == [1, 2, 1]

    with sqlite3.connect(path) as conn:
        (version,) = conn.execute("PRAGMA user_version").fetchone()
        columns = {row[1] for row in conn.execute(f"PRAGMA table_info({WAITERS_TABLE})")}
        indexes = {row[0] for row in conn.execute("SELECT name FROM sqlite_master")}
        # an older tasklock's insert: the defaults (no supersede, at the end of the queue)
        conn.execute(
            f"INSERT INTO {WAITERS_TABLE} (key, owner_token, boot_id, expires_boot, since, holder)"
            " VALUES ('k', 'owner-v5', ?, ?, 0, ?)",
            (current_boot_id(), boot_clock() + 30, '{"host": "h", "pid": 5, "user": "u"}'),
        )
    assert version == SCHEMA_VERSION == 6
    assert {"supersede", "superseded", "place"} <= columns
    assert f"{WAITERS_TABLE}_order" in indexes and f"{WAITERS_TABLE}_queue" not in indexes
    assert [w.holder.pid for w in store.waiters("k")] == [1, 2, 1, 5]


def _waiting_with_a_fifo(path, owner: str, **queueing) -> SQLiteStore:
    """A waiter of "k" with its FIFO named in its place, as a run's second attempt is."""
    waiter = SQLiteStore(path)
    assert waiter._wakeups.register("k")
    assert waiter.acquire("k", 30, HOLDER, owner, queue=True, **queueing) is None
    return waiter


def _woken(waiter: SQLiteStore) -> bool:
    from tasklock_cli.util.fds import fd_readable

    return fd_readable(waiter._wakeups._fd)


def test_a_release_wakes_the_shared_run_at_the_head_and_no_more(tmp_path):
    path = tmp_path / "locks.db"
    store = SQLiteStore(path)
    lease = granted(store.acquire("k", 30, HOLDER, "owner-writer"))
    modes = ("shared", "shared", "exclusive", "shared")
    waiters = [_waiting_with_a_fifo(path, f"owner-{n}", mode=m) for n, m in enumerate(modes)]
    assert store.release(lease) is True
    assert [_woken(waiter) for waiter in waiters] == [True, True, False, False]
    for waiter in waiters:
        waiter.close()


def test_a_release_wakes_only_an_exclusive_head(tmp_path):
    path = tmp_path / "locks.db"
    store = SQLiteStore(path)
    lease = granted(store.acquire("k", 30, HOLDER, "owner-writer"))
    waiters = [_waiting_with_a_fifo(path, f"owner-{n}") for n in range(2)]
    front = _waiting_with_a_fifo(path, "owner-front", front=True)
    assert store.release(lease) is True
    assert [_woken(waiter) for waiter in (front, *waiters)] == [True, False, False]
    for waiter in (front, *waiters):
        waiter.close()


def test_a_superseded_waiter_is_woken_to_hear_of_it(tmp_path):
    from tasklock_cli.errors import Superseded

    path = tmp_path / "locks.db"
    store = SQLiteStore(path)
    assert store.acquire("k", 30, HOLDER, "owner-writer") is not None
    first = _waiting_with_a_fifo(path, "owner-first")
    older = _waiting_with_a_fifo(path, "owner-older", supersede=True)
    plain = _waiting_with_a_fifo(path, "owner-plain")
    newer = _waiting_with_a_fifo(path, "owner-newer", supersede=True)
    waiters = (first, older, plain, newer)
    assert [_woken(waiter) for waiter in waiters] == [False, True, False, False]
    with pytest.raises(Superseded):
        older.acquire("k", 30, HOLDER, "owner-older", queue=True, supersede=True)
    assert older._wakeups.key is None and older._queue_place("k") is None
    for waiter in waiters:
        waiter.close()


def test_superseding_the_head_wakes_the_waiter_now_first(tmp_path):
    """The superseded head may have been woken by a release it will not use."""
    path = tmp_path / "locks.db"
    store = SQLiteStore(path)
    assert store.acquire("k", 30, HOLDER, "owner-writer") is not None
    older = _waiting_with_a_fifo(path, "owner-older", supersede=True)
    plain = _waiting_with_a_fifo(path, "owner-plain")
    newer = _waiting_with_a_fifo(path, "owner-newer", supersede=True)
    assert [_woken(waiter) for waiter in (older, plain, newer)] == [True, True, False]
    for waiter in (older, plain, newer):
        waiter.close()


# -- a local holder whose processes are gone ---------------------------------------------


def _gone_pid() -> int:
    """A pid that ran and has ended (reaped)."""
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    os.waitpid(pid, 0)
    return pid


def test_a_local_holder_whose_processes_are_gone_is_freed_at_once(sqlite_url):
    from tasklock_cli.stores import open_store

    with open_store(sqlite_url) as holder_store, open_store(sqlite_url) as ops:
        lease = granted(holder_store.acquire("k", 30, HOLDER, token()))
        holder_store.note_processes(lease, os.getpid())  # this process: alive
        ops.break_lease("k", None, BREAKER)
        assert ops.free_if_holder_gone("k", lease.fencing_token) is False

        dead = granted(holder_store.acquire("d", 30, HOLDER, token()))
        pid = os.fork()
        if pid == 0:  # a holder that records itself and a guard, then ends
            with open_store(sqlite_url) as store:
                store.note_processes(dead, os.getpid())
            os._exit(0)
        os.waitpid(pid, 0)
        ops.break_lease("d", None, BREAKER)
        assert ops.free_if_holder_gone("d", dead.fencing_token) is True
        assert ops.holders("d") == []
        assert [info.fencing_token for info in ops.holders("k")] == [lease.fencing_token]
        nxt = ops.acquire("d", 30, OTHER, token())
        assert nxt is not None and nxt.fencing_token > dead.fencing_token


def test_processes_of_another_boot_are_never_taken_for_gone():
    from tasklock_cli.stores.sqlite.processes import all_gone
    from tasklock_cli.stores.sqlite.processes import pid_namespace

    gone = [[_gone_pid(), 1], [_gone_pid(), 1]]
    here = {"boot": "this-boot", "pidns": pid_namespace(), "pids": gone}
    assert all_gone(here, "this-boot") is True
    assert all_gone({**here, "boot": "another-boot"}, "this-boot") is False
    assert all_gone({**here, "pidns": pid_namespace() + 1}, "this-boot") is False
    # The holder alone, recorded with its acquire: its command cannot start before its guard
    # is recorded too, so none of them running means nothing runs.
    assert all_gone({**here, "pids": gone[:1]}, "this-boot") is True
    assert all_gone({**here, "pids": []}, "this-boot") is False  # nothing to tell by
    assert all_gone({**here, "pids": "junk"}, "this-boot") is False
