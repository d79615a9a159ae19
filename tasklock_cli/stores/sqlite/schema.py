"""The SQLite store's tables, and bringing a file made by an earlier version up to date.

The versions:

- Version 6 (lock modes, ``--supersede``, ``--replace``) adds three columns to the queues
  of waiters: ``supersede``, ``superseded`` and ``place``.
  Their order is ``(place, seq)``.
  Each column has the default an older tasklock's insert gets.
- In version 6, a lease's mode is kept in its ``holder`` JSON (``$.mode``; none:
  exclusive), not in a column.
  A version-5 tasklock refuses a lease table whose columns are not its own.
  It writes holders without a mode, so it stays exclusive on a version-6 file.
- Version 5 adds the queues of waiters: a table, and nothing else changes.
- Version 4 keys a lease by (key, slot), for semaphores.
  A WITHOUT ROWID table cannot change its primary key in place.
  So a version-3 table is rebuilt.
  Each of its rows becomes slot 0 of limit 1, keeping its fencing token (the key's counter).

Every check and change runs in one write transaction.
So two processes opening an old file at once migrate it once.
"""

from __future__ import annotations

from tasklock_cli.errors import ConfigError

TABLE = "tasklock_leases"
RUNS_TABLE = "tasklock_runs"
WAITERS_TABLE = "tasklock_waiters"
SCHEMA_VERSION = 6
#: typing costs ~2 ms per start: its names are for the type checker only.
TYPE_CHECKING = False
if TYPE_CHECKING:
    import sqlite3
    from collections.abc import Callable
    from typing import Protocol
    from typing import TypeVar

    _T = TypeVar("_T")

    class WhenNotBusy(Protocol):
        """Runs an operation again while the database is busy (connection.when_not_busy)."""

        def __call__(self, operation: Callable[[], _T]) -> _T: ...


_EXPIRY_INDEX = f"""CREATE INDEX IF NOT EXISTS {TABLE}_expiry ON {TABLE} (boot_id, expires_boot)
    WHERE owner_token IS NOT NULL"""
# The run ledger: one row per run, written with the release (``data``: RunRecord.fields).
_RUNS_SCHEMA = f"""CREATE TABLE IF NOT EXISTS {RUNS_TABLE} (
    key           TEXT NOT NULL,
    fencing_token INTEGER NOT NULL,
    started_at    REAL NOT NULL,
    ended_at      REAL NOT NULL,
    data          TEXT NOT NULL,
    PRIMARY KEY (key, fencing_token)
) WITHOUT ROWID"""
# ``slot_limit``: the limit its holder asked for (``limit`` is an SQL keyword). A freed
# row keeps its fencing token: the highest token of a key's rows is its counter.
_LEASES_SCHEMA = """CREATE TABLE IF NOT EXISTS {table} (
    key           TEXT NOT NULL,
    slot          INTEGER NOT NULL,
    slot_limit    INTEGER NOT NULL,
    fencing_token INTEGER NOT NULL,
    owner_token   TEXT,
    boot_id       TEXT,
    expires_boot  REAL,
    acquired_at   REAL,
    expires_at    REAL,
    holder        TEXT,
    PRIMARY KEY (key, slot)
) WITHOUT ROWID"""
# The queues of waiters.
# - A key's waiters are served in ``(place, seq)`` order.
# - ``place`` is 0, but for a ``front`` place (see queue).
# - A place is live while it has not run out: ``expires_boot``, on the boot clock as
#   leases are.
# - ``fifo``: the name of the waiter's FIFO, which a release wakes (see waiting).
# - ``supersede``: it joined with ``supersede``.
# - ``superseded``: a later such place joined, so it no longer counts.
_WAITERS_SCHEMA = f"""CREATE TABLE IF NOT EXISTS {WAITERS_TABLE} (
    seq          INTEGER PRIMARY KEY,
    key          TEXT NOT NULL,
    owner_token  TEXT NOT NULL,
    boot_id      TEXT NOT NULL,
    expires_boot REAL NOT NULL,
    since        REAL NOT NULL,
    holder       TEXT NOT NULL,
    mode         TEXT NOT NULL DEFAULT 'exclusive',
    fifo         TEXT,
    supersede    INTEGER NOT NULL DEFAULT 0,
    superseded   INTEGER NOT NULL DEFAULT 0,
    place        INTEGER NOT NULL DEFAULT 0,
    UNIQUE (key, owner_token)
)"""
_WAITERS_INDEX = f"""CREATE INDEX IF NOT EXISTS {WAITERS_TABLE}_order
    ON {WAITERS_TABLE} (key, place, seq)"""
# Version 5's queues: the new columns (their defaults are what a version-5 insert gets),
# and the index in the new order instead of (key, seq).
_V6_WAITER_COLUMNS = {
    "supersede": "INTEGER NOT NULL DEFAULT 0",
    "superseded": "INTEGER NOT NULL DEFAULT 0",
    "place": "INTEGER NOT NULL DEFAULT 0",
}
_V5_WAITERS_INDEX = f"{WAITERS_TABLE}_queue"
_CREATE = (
    _LEASES_SCHEMA.format(table=TABLE),
    _EXPIRY_INDEX,
    _RUNS_SCHEMA,
    _WAITERS_SCHEMA,
    _WAITERS_INDEX,
)
SCHEMA = ";\n".join(_CREATE) + ";"

_V3_COLUMNS = (
    "key",
    "fencing_token",
    "owner_token",
    "boot_id",
    "expires_boot",
    "acquired_at",
    "expires_at",
    "holder",
)
COLUMNS = frozenset((*_V3_COLUMNS, "slot", "slot_limit"))
_REBUILT = f"{TABLE}_v4"
_V3_LIST = ", ".join(_V3_COLUMNS)
# Versions 1 to 3 (one row per key): version 1 indexed expires_boot alone (its index goes
# with the old table), version 2 had no run ledger.
_REBUILD = (
    _LEASES_SCHEMA.format(table=_REBUILT),
    f"INSERT INTO {_REBUILT} (slot, slot_limit, {_V3_LIST}) SELECT 0, 1, {_V3_LIST} FROM {TABLE}",
    f"DROP TABLE {TABLE}",
    f"ALTER TABLE {_REBUILT} RENAME TO {TABLE}",
    _EXPIRY_INDEX,
    _RUNS_SCHEMA,
    _WAITERS_SCHEMA,
    _WAITERS_INDEX,
)


def schema_state(conn: sqlite3.Connection) -> tuple[frozenset[str], int]:
    """The lease table's columns (empty when there is none) and the file's version."""
    columns = frozenset(row[1] for row in conn.execute(f"PRAGMA table_info({TABLE})"))
    (version,) = conn.execute("PRAGMA user_version").fetchone()
    return columns, int(version)


def _waiter_steps(conn: sqlite3.Connection) -> tuple[str, ...]:
    """What brings a version-5 queue table up to date (nothing when there is none: it is
    made whole)."""
    columns = {row[1] for row in conn.execute(f"PRAGMA table_info({WAITERS_TABLE})")}
    if not columns:
        return ()
    added = tuple(
        f"ALTER TABLE {WAITERS_TABLE} ADD COLUMN {name} {kind}"
        for name, kind in _V6_WAITER_COLUMNS.items()
        if name not in columns
    )
    return (*added, f"DROP INDEX IF EXISTS {_V5_WAITERS_INDEX}")


def is_current(conn: sqlite3.Connection) -> bool:
    columns, version = schema_state(conn)
    return columns == COLUMNS and version >= SCHEMA_VERSION


def upgrade_steps(conn: sqlite3.Connection, where: str) -> tuple[str, ...]:
    """The statements that make the file current, read inside the write transaction that
    will run them (another process may have just done it); ConfigError when the table
    there is not tasklock's, or when it is gone and its run ledger is there: made again, it
    would issue fencing tokens from 1 again."""
    columns, version = schema_state(conn)
    if not columns:
        # One statement, so one snapshot (the first look is outside any transaction):
        # another process making the tables commits both at once.
        (lost,) = conn.execute(
            "SELECT EXISTS (SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?)"
            " AND NOT EXISTS (SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?)",
            (RUNS_TABLE, TABLE),
        ).fetchone()
        if lost:
            raise ConfigError(
                f"{where} holds tasklock's run ledger but not its lease table {TABLE}"
                " (dropped?): refusing to make it again, which would issue fencing tokens"
                " already issued; move the file away to start a new store"
            )
        steps: tuple[str, ...] = _CREATE
    elif columns == COLUMNS:
        # all idempotent; the queue's new columns before the index that uses them
        steps = () if version >= SCHEMA_VERSION else (*_waiter_steps(conn), *_CREATE)
    elif columns == frozenset(_V3_COLUMNS):
        steps = _REBUILD
    else:
        raise ConfigError(
            f"{where}: table {TABLE} exists but is not a tasklock table "
            f"(columns: {', '.join(sorted(columns))})"
        )
    return (*steps, f"PRAGMA user_version={SCHEMA_VERSION}") if steps else ()


def refuse_foreign(conn: sqlite3.Connection, where: str) -> None:
    """ConfigError when the file is another application's database: it holds tables other
    than tasklock's, or none of tasklock's and a ``user_version`` someone set. (A file with
    tasklock's ledger but not its lease table is tasklock's: ``upgrade_steps`` refuses to make
    that table again. One statement, so one snapshot: another process may be creating the
    tables right now.)"""
    tables, version = conn.execute(
        "SELECT (SELECT json_group_array(name) FROM sqlite_master"
        "        WHERE type IN ('table', 'view') AND name NOT LIKE 'sqlite!_%' ESCAPE '!'),"
        "       (SELECT user_version FROM pragma_user_version)"
    ).fetchone()
    from tasklock_cli.util import jsontext as json

    names = set(json.loads(tables))
    others = sorted(names - {TABLE, RUNS_TABLE, WAITERS_TABLE, _REBUILT})
    if others:
        shown = ", ".join(others[:5]) + (", ..." if len(others) > 5 else "")
        raise ConfigError(
            f"{where} holds tables that are not tasklock's ({shown}): refusing to use "
            "another application's database as a store"
        )
    if TABLE not in names and RUNS_TABLE not in names and version != 0:
        raise ConfigError(
            f"{where} has user_version {version} but no tasklock table: refusing to use "
            "another application's database as a store"
        )


def ensure_schema(conn: sqlite3.Connection, where: str, when_not_busy: WhenNotBusy) -> None:
    """Create or upgrade the tables of a connection in autocommit mode."""
    # Reads before the file is in WAL mode may find it busy while another process sets it.
    if when_not_busy(lambda: is_current(conn) or not upgrade_steps(conn, where)):
        return  # (a foreign table: refused by upgrade_steps)
    when_not_busy(lambda: conn.execute("BEGIN IMMEDIATE"))
    try:
        for statement in upgrade_steps(conn, where):
            conn.execute(statement)
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    when_not_busy(lambda: conn.execute("COMMIT"))
