"""The SQLite store's connection: opened at first use (making the schema current), shared
by the threads of a process, its errors told as tasklock's, and a busy file retried."""

from __future__ import annotations

import _thread
import os
import time

from tasklock_cli.errors import ConfigError
from tasklock_cli.errors import StoreUnavailable
from tasklock_cli.stores.rows import lenient_text
from tasklock_cli.stores.sqlite import files
from tasklock_cli.stores.sqlite.driver import sqlite3  # (the store's modules take it here)
from tasklock_cli.stores.sqlite.entries import PRIVATE_MODE
from tasklock_cli.stores.sqlite.entries import Owners
from tasklock_cli.stores.sqlite.schema import ensure_schema
from tasklock_cli.stores.sqlite.schema import refuse_foreign
from tasklock_cli.util import suppressed

#: typing costs ~2 ms per start: its names are for the type checker only.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any
    from typing import TypeVar

    _T = TypeVar("_T")
_BUSY_CODES = {getattr(sqlite3, "SQLITE_BUSY", 5), getattr(sqlite3, "SQLITE_LOCKED", 6)}
BUSY_TIMEOUT_S = 5.0
#: SQLite's own busy handler sleeps ever longer (up to 100 ms a time) while the write lock
#: is taken.
#: So a waiter can miss the moments it is free.
#: The handler gets only this long per try.
#: tasklock retries itself every millisecond or so, until BUSY_TIMEOUT_S.
BUSY_SLICE_S = 0.003
#: How ``sync`` opens the WAL: never through a symlink, and never blocking (not a FIFO's open).
_SYNC_OPEN = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
_DIRECTORY_OPEN = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC
#: The WAL's length (pages) at which the commit that passes it checkpoints (SQLite's default:
#: 1000). A run that is the file's only connection first reads back every page the WAL holds
#: since its last checkpoint, to rebuild its index (~2.4 µs a page here): with 1000, a store
#: in use made each run read ~500 pages on average, ~1.2 ms; with 128, ~0.16 ms, plus a
#: checkpoint (~0.45 ms here, two syncs) every ~25 runs of ~5 pages each.
WAL_CHECKPOINT_PAGES = 128


def when_not_busy(operation: Callable[[], _T]) -> _T:
    """Retry ``operation`` while the database is busy, at short intervals, for at most
    BUSY_TIMEOUT_S; then the busy error is the caller's."""
    give_up_at = time.monotonic() + BUSY_TIMEOUT_S
    while True:
        try:
            return operation()
        except sqlite3.OperationalError as exc:
            busy = getattr(exc, "sqlite_errorcode", None) in _BUSY_CODES
            if not (busy or "database is locked" in str(exc)):
                raise
            if time.monotonic() >= give_up_at:
                raise
        import random  # only when busy: ~1 ms of start-up otherwise

        time.sleep(random.uniform(0.0005, 0.0015))


class SQLiteConnection:
    """One connection to ``path``, shared by the threads of a process (the heartbeat and
    the main thread, or many leases held through the API): one transaction at a time."""

    def __init__(
        self,
        path: str,
        create_parent: bool,
        file_mode: int = PRIVATE_MODE,
        owners: Owners | None = None,
    ) -> None:
        """``path`` as ``paths.normal`` gives it; ``create_parent`` for the default store,
        whose directory is made; ``file_mode`` what a file made here gets (see files);
        ``owners`` learns whose directories beside the file to trust when it is opened."""
        self.path = path
        self._create_parent = create_parent
        self._file_mode = file_mode
        self._owners = owners or Owners(file_mode)
        self._conn: sqlite3.Connection | None = None
        self._lock = _thread.RLock()
        self._wal = False  # the connection is in WAL mode (it may not be, where WAL fails)
        self._directory_synced = False  # by this connection (``sync_directory``)
        self._prepared: set[tuple[str, ...]] = set()  # compiled ahead (``prepare``)

    def _connection(self) -> sqlite3.Connection:
        if self._conn is None:
            self._conn = self._connect()
            self._directory_synced = False
            self._prepared = set()
        return self._conn

    def _connect(self) -> sqlite3.Connection:
        files.prepare(self.path, self._file_mode, self._create_parent, self._owners)
        try:
            conn = sqlite3.connect(
                self.path, timeout=BUSY_SLICE_S, isolation_level=None, check_same_thread=False
            )
            # Before WAL mode or a table is set: another application's database is left as is.
            when_not_busy(lambda: refuse_foreign(conn, self.path))
            mode = when_not_busy(lambda: conn.execute("PRAGMA journal_mode=WAL").fetchone())
            self._wal = str(mode[0]).lower() == "wal"
            when_not_busy(lambda: conn.execute("PRAGMA synchronous=NORMAL"))
            conn.execute(f"PRAGMA wal_autocheckpoint={WAL_CHECKPOINT_PAGES}")
            ensure_schema(conn, str(self.path), when_not_busy)
        except sqlite3.Error as exc:
            raise self._translate(exc) from exc
        return conn

    def _translate(self, exc: sqlite3.Error) -> Exception:
        message = str(exc)
        lowered = message.lower()
        if "not a database" in lowered or "malformed" in lowered:
            return ConfigError(f"{self.path} is not a tasklock SQLite database ({message})")
        if "readonly" in lowered or "unable to open" in lowered or "permission" in lowered:
            return ConfigError(f"cannot write {self.path} ({message})")
        return StoreUnavailable(f"{self.path}: {message}")

    def open(self) -> None:
        """Connect now (and make the schema current) rather than at the first statement."""
        with self._lock:
            self._connection()

    def write(self, durable: bool = False) -> WriteTransaction:
        """A write transaction (BEGIN IMMEDIATE), committed when the block ends. Text that
        is not UTF-8 is read leniently (``rows.lenient_text``): the few a write returns.

        Commits are synced at the next checkpoint (``synchronous=NORMAL``): losing one to a
        power cut loses only what the reboot ended anyway (a renewal, a waiter's place, a
        lease, a token within a block reserved for this boot). What must never repeat
        after a reboot, a new block of fencing tokens and a run's success that
        ``--once-per`` reads, the caller makes durable with ``sync`` after the block, once
        it knows it wrote such a thing (and, for a release, once it has woken the next
        waiter). ``durable`` says it may: where the commit cannot be synced after
        it (no WAL mode) it is synced at once (``synchronous=FULL``), and ``sync`` does
        nothing."""
        return WriteTransaction(self, durable)

    def sync(self) -> None:
        """Put every commit made so far on disk (after ``write(durable=True)``), as
        ``synchronous=FULL`` would have at the commit, before anything relies on it: the
        command starts, the process ends. In WAL mode a commit is its frames appended to the
        WAL, so syncing the WAL (fdatasync, as SQLite does) syncs it and every commit
        before it; a checkpoint syncs the WAL before copying from it, and the WAL starts
        over only once all of it is in the database file, synced. A later commit that is
        synced syncs this one too: its frames come later in the same WAL (a release's
        success is so synced by any later sync, a new block's or another success's). The
        first sync of a
        connection also syncs the directory, as SQLite's does, so that the WAL's name is
        on disk too (``sync_directory``). Without WAL mode the commit was synced already."""
        with self._lock:
            if self._conn is None or not self._wal:
                return
            try:
                fd = os.open(self.path + "-wal", _SYNC_OPEN)
            except OSError as exc:  # never while our connection is open: it keeps the WAL
                raise StoreUnavailable(f"{self.path}: cannot sync its WAL ({exc})") from exc
            try:
                os.fdatasync(fd)
            except OSError as exc:
                raise StoreUnavailable(f"{self.path}: cannot sync its WAL ({exc})") from exc
            finally:
                os.close(fd)
            self.sync_directory()

    def sync_directory(self) -> None:
        """Sync the directory of the file once per connection, as SQLite does at its first
        sync of the WAL: the WAL may be new, and its name must reach the disk with it. The
        WAL stays while our connection is open (only the last close removes it), so this
        may come ahead of ``sync``: a waiter does it as it joins the queue, and a later
        sync (a new block of tokens its taking reserves, its success) syncs the WAL alone.
        Where the directory cannot be opened, nothing (SQLite does the same)."""
        with self._lock:
            if self._conn is None or not self._wal or self._directory_synced:
                return
            self._directory_synced = True
            with suppressed(OSError):
                fd = os.open(os.path.dirname(self.path) or ".", _DIRECTORY_OPEN)
                try:
                    os.fdatasync(fd)
                finally:
                    os.close(fd)

    def prepare(self, statements: tuple[str, ...]) -> None:
        """Compile ``statements`` into the connection's statement cache without running
        them, once per connection: Python's sqlite3 compiles a statement and caches it
        before it binds the parameters, and an empty mapping then fails the binding, so
        nothing runs. For statements a hand-off would otherwise compile (0.05-0.35 ms
        each), compiled while there is time. Best effort: an error leaves them to be
        compiled when used."""
        with self._lock:
            if self._conn is None or statements in self._prepared:
                return
            self._prepared.add(statements)
            for sql in statements:
                with suppressed(sqlite3.Error):
                    self._conn.execute(sql, {})

    def read(self, sql: str, params: dict) -> list[tuple[Any, ...]]:
        """The rows of a query, as plain tuples (no row_factory). Text that is not UTF-8
        (someone else wrote it) fails the query, which is read again leniently (rows'
        ``lenient_text``: a Python call per text value, so only then)."""
        try:
            with self._lock:
                conn = self._connection()
                try:
                    return when_not_busy(lambda: conn.execute(sql, params).fetchall())
                except sqlite3.OperationalError as exc:
                    if "decode" not in str(exc):
                        raise
                conn.text_factory = lenient_text
                try:
                    return when_not_busy(lambda: conn.execute(sql, params).fetchall())
                finally:
                    conn.text_factory = str
        except sqlite3.Error as exc:
            raise self._translate(exc) from exc

    def close(self, checkpoint: bool = True) -> None:
        """Close the connection. Without ``checkpoint`` (the process is about to end), skip
        the checkpoint SQLite makes when the last connection to the file closes: ~1 ms, two
        syncs, and the WAL deleted, so that the next run makes it again with two more. With
        ``setconfig`` (Python 3.12) the connection is closed without it, else it is left for
        the process's end (``os._exit``: no close runs). The WAL stays, bounded by the
        auto-checkpoint (``WAL_CHECKPOINT_PAGES``); the next open that is the only one reads
        back what it holds since its last checkpoint."""
        with self._lock:
            conn, self._conn = self._conn, None
            if conn is None:
                return
            if not checkpoint:
                no_checkpoint = getattr(sqlite3, "SQLITE_DBCONFIG_NO_CKPT_ON_CLOSE", None)
                if no_checkpoint is None or not hasattr(conn, "setconfig"):
                    _LEFT_FOR_EXIT.append(conn)
                    return
                conn.setconfig(no_checkpoint, True)
            conn.close()


#: Connections closed before the process's end without their checkpoint (``close``): kept
#: referenced, so that no garbage collection closes them (and checkpoints) meanwhile.
_LEFT_FOR_EXIT: list[sqlite3.Connection] = []


class WriteTransaction:
    """``SQLiteConnection.write``'s block: ``with db.write() as conn: ...``. A class, not a
    ``contextlib.contextmanager`` generator: ``contextlib`` costs ~2.5 M instructions of
    every `run`. The connection's lock is held from the BEGIN to the COMMIT or ROLLBACK; an
    error of SQLite's, the block's own included, leaves as the store's error
    (``_translate``), any other as it is, after the rollback."""

    __slots__ = ("_conn", "_db", "_durable", "_full")

    def __init__(self, db: SQLiteConnection, durable: bool) -> None:
        self._db, self._durable, self._full = db, durable, False

    def __enter__(self) -> sqlite3.Connection:
        db = self._db
        db._lock.acquire()
        conn = None
        try:
            conn = self._conn = db._connection()
            self._full = self._durable and not db._wal
            conn.text_factory = lenient_text
            if self._full:  # (the level may not change inside a transaction)
                conn.execute("PRAGMA synchronous=FULL")
            when_not_busy(lambda: conn.execute("BEGIN IMMEDIATE"))
        except BaseException as exc:
            if conn is not None:
                self._restore(conn)
            db._lock.release()
            if isinstance(exc, sqlite3.Error):
                raise db._translate(exc) from exc
            raise
        return conn

    def __exit__(self, kind: type[BaseException] | None, value: object, traceback: object) -> bool:
        conn, db = self._conn, self._db
        try:
            try:
                if kind is None:
                    when_not_busy(lambda: conn.execute("COMMIT"))
                    return False
                conn.execute("ROLLBACK")
            except sqlite3.Error as exc:
                raise db._translate(exc) from exc
            if isinstance(value, sqlite3.Error):
                raise db._translate(value) from value
            return False
        finally:
            self._restore(conn)
            db._lock.release()

    def _restore(self, conn: sqlite3.Connection) -> None:
        conn.text_factory = str
        if self._full:
            with suppressed(sqlite3.Error):
                conn.execute("PRAGMA synchronous=NORMAL")
