"""The SQLite store's write transaction (``SQLiteConnection.write``), a class since issue 45
took contextlib off `run`'s path: what the generator it replaced did, case by case."""

from __future__ import annotations

import _thread

import pytest

from tasklock_cli.errors import StoreUnavailable
from tasklock_cli.stores.sqlite.connection import SQLiteConnection
from tasklock_cli.stores.sqlite.connection import sqlite3


@pytest.fixture
def db(tmp_path) -> SQLiteConnection:
    connection = SQLiteConnection(str(tmp_path / "w.db"), create_parent=False)
    with connection.write() as conn:
        conn.execute("CREATE TABLE t (x)")
    return connection


def rows(db: SQLiteConnection) -> list:
    return db.read("SELECT x FROM t ORDER BY x", {})


def lock_is_free(db: SQLiteConnection) -> bool:
    """The connection's lock, tried from another thread (it is re-entrant in this one)."""
    free: list[bool] = []
    done = _thread.allocate_lock()
    done.acquire()

    def attempt() -> None:
        got = db._lock.acquire(timeout=1)
        if got:
            db._lock.release()
        free.append(got)
        done.release()

    _thread.start_new_thread(attempt, ())
    done.acquire(timeout=5)
    return free == [True]


def test_a_block_that_ends_commits(db):
    with db.write() as conn:
        conn.execute("INSERT INTO t VALUES (1)")
    assert rows(db) == [(1,)] and lock_is_free(db)


def test_a_block_that_raises_rolls_back_and_its_error_goes_on(db):
    with pytest.raises(KeyError), db.write() as conn:
        conn.execute("INSERT INTO t VALUES (2)")
        raise KeyError("ours")
    assert rows(db) == [] and lock_is_free(db)


def test_an_error_of_sqlite_in_the_block_leaves_as_the_stores_error(db):
    with pytest.raises(StoreUnavailable) as raised, db.write() as conn:
        conn.execute("INSERT INTO t VALUES (3)")
        conn.execute("SELECT * FROM no_such_table")
    assert isinstance(raised.value.__cause__, sqlite3.OperationalError)
    assert rows(db) == [] and lock_is_free(db)


def test_the_text_factory_is_lenient_inside_and_back_after(db):
    with db.write() as conn:
        assert conn.text_factory is not str
        conn.execute("INSERT INTO t VALUES (CAST(x'ff' AS TEXT))")
        (value,) = conn.execute("SELECT x FROM t").fetchone()
        assert isinstance(value, str)  # not a UnicodeDecodeError
    assert db._conn is not None and db._conn.text_factory is str
