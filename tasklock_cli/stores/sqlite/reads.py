"""The SQLite store's reads: what ``peek``, ``list``, ``history``, ``metrics`` and
``--once-per`` show (the leases, the waiters, the run ledger), each one read of the file,
judged live on the boot clock as it is read. A mixin of ``SQLiteStore``."""

from __future__ import annotations

from tasklock_cli.stores import rows as row_parsing
from tasklock_cli.stores.model import LEDGER_KEEP
from tasklock_cli.stores.model import LIST_PAGE
from tasklock_cli.stores.model import LeaseInfo
from tasklock_cli.stores.model import RunRecord
from tasklock_cli.stores.model import WaiterInfo
from tasklock_cli.stores.model import prefix_upper_bound
from tasklock_cli.stores.sqlite import queue
from tasklock_cli.stores.sqlite.connection import SQLiteConnection
from tasklock_cli.stores.sqlite.schema import RUNS_TABLE
from tasklock_cli.stores.sqlite.schema import TABLE
from tasklock_cli.util.keys import is_utf8
from tasklock_cli.util.keys import key_bytes
from tasklock_cli.util.times import utc_from_timestamp

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from collections.abc import Iterator
    from datetime import datetime

# A lease is live when it has an owner, was granted in this boot, and has not run out.
LIVE = "owner_token IS NOT NULL AND boot_id = :boot AND expires_boot > :now"

# The same in a query of one key: the unary + keeps the planner on the primary key (key,
# slot) rather than on the expiry index, whose range holds the live leases of every key.
LIVE_ON_KEY = "owner_token IS NOT NULL AND +boot_id = :boot AND +expires_boot > :now"

# A lease whose expiry cannot be read:
# - it has no boot;
# - or in this boot it has no expiry;
# - or its expiry is not a number, or lies further ahead than any boot lasts.
# Text and blobs sort after every number, so both are index ranges.
# No tasklock writes such a lease.
# It is never judged expired: it may be a live holder's.
# Sweep and release --force give it a bounded expiry (see model.UNREADABLE_EXPIRY_FLOOR_S).
_FAR_S = 1e10

UNREADABLE_EXPIRY = f"""owner_token IS NOT NULL AND (boot_id IS NULL OR (boot_id = :boot
    AND (expires_boot IS NULL OR expires_boot > :now + {_FAR_S})))"""

_INFO_COLUMNS = f"""key, slot, slot_limit, fencing_token, acquired_at,
    CASE WHEN boot_id IS NOT NULL AND expires_boot <= :now + {_FAR_S} THEN expires_at
         ELSE 'boot ' || quote(boot_id) || ', expires_boot ' || quote(expires_boot) END,
    holder"""

SELECT_LEASES = f"SELECT {_INFO_COLUMNS}, ({LIVE} OR {UNREADABLE_EXPIRY}) AS live FROM {TABLE}"

# The key's newest success (``--once-per``, ``metrics``); the trim never removes it.
NEWEST_SUCCESS = f"""FROM {RUNS_TABLE}
WHERE key = :key
  AND CASE WHEN json_valid(data) THEN json_extract(data, '$.outcome') END = 'succeeded'
ORDER BY fencing_token DESC LIMIT 1"""

_LAST_SUCCESS = f"SELECT key, fencing_token, started_at, ended_at, data {NEWEST_SUCCESS}"

_HISTORY = f"""SELECT key, fencing_token, started_at, ended_at, data FROM {RUNS_TABLE}
WHERE key = :key ORDER BY fencing_token DESC LIMIT :limit"""

_LEDGER_KEYS = f"""SELECT DISTINCT key FROM {RUNS_TABLE}
WHERE key >= :prefix AND substr(key, 1, :n) = :prefix ORDER BY key"""


def lease_info_of(row: tuple) -> LeaseInfo:
    """A lease row (its mode is in its holder), read defensively (see rows)."""
    key, slot, limit, token, acquired_at, expires_at, holder, live = row
    return row_parsing.lease_info(
        key, slot, limit, token, acquired_at, expires_at, holder, None, not live
    )


def by_key(sql: str, params: dict) -> tuple[str, dict]:
    """``sql`` and ``params`` for a key that may not be UTF-8 (forged into the store; a
    key on the command line carries such bytes as lone surrogates, which sqlite3 cannot
    bind as text): then the statement compares with the key's bytes read as text, which
    is what the row holds. A key that is UTF-8 (every run's) leaves both as they are.
    For what reaches a forged key: peek, history, release --force."""
    key = params.get("key")
    if not isinstance(key, str) or is_utf8(key):
        return sql, params
    return sql.replace("key = :key", "key = CAST(:key AS TEXT)"), {**params, "key": key_bytes(key)}


def _waiter_info(holder: str, since: float, mode: str) -> WaiterInfo:
    return row_parsing.waiter_info(holder, since, mode)


def _run_record(key: str, token: int, started: float, ended: float, data: str) -> RunRecord:
    return row_parsing.run_record(key, token, started, ended, data)


class SQLiteReads:
    """The reads of ``SQLiteStore`` (see the module's docstring)."""

    _db: SQLiteConnection
    _wall: Callable[[], float]
    _times: Callable[[], dict]

    def history(self, key: str, limit: int = LEDGER_KEEP) -> list[RunRecord]:
        rows = self._db.read(*by_key(_HISTORY, {"key": key, "limit": limit}))
        return [_run_record(*row) for row in rows]

    def last_success(self, key: str) -> tuple[RunRecord | None, datetime]:
        # This machine's wall clock, which also timed every run's start (acquired_at).
        rows = self._db.read(*by_key(_LAST_SUCCESS, {"key": key}))
        now = utc_from_timestamp(self._wall())
        return (_run_record(*rows[0]) if rows else None), now

    def ledger_keys(self, prefix: str = "") -> list[str]:
        rows = self._db.read(_LEDGER_KEYS, {"prefix": prefix, "n": len(prefix)})
        return [row[0] for row in rows]

    def holders(self, key: str) -> list[LeaseInfo]:
        live = f"({LIVE_ON_KEY} OR {UNREADABLE_EXPIRY})"
        sql = f"{SELECT_LEASES} WHERE key = :key AND {live} ORDER BY slot"
        rows = self._db.read(*by_key(sql, {**self._times(), "key": key}))
        return [lease_info_of(row) for row in rows]

    def waiters(self, key: str) -> list[WaiterInfo]:
        rows = self._db.read(*by_key(queue.WAITERS, {**self._times(), "key": key}))
        return [_waiter_info(*row) for row in rows]

    def waiting_counts(self, prefix: str = "") -> dict[str, int]:
        params = {**self._times(), "prefix": prefix, "n": len(prefix)}
        return {key: int(count) for key, count in self._db.read(queue.WAITING_COUNTS, params)}

    def list(self, prefix: str = "", include_expired: bool = False) -> Iterator[LeaseInfo]:
        live = f"(({LIVE}) OR ({UNREADABLE_EXPIRY}))"
        condition = "owner_token IS NOT NULL" if include_expired else live
        upper = prefix_upper_bound(prefix)
        bounded = " AND key < :upper" if upper is not None else ""
        sql = (
            f"{SELECT_LEASES} WHERE {condition} AND key >= :prefix{bounded}"
            " AND (key, slot) > (:after, :after_slot) AND substr(key, 1, :n) = :prefix"
            f" ORDER BY key, slot LIMIT {LIST_PAGE}"
        )
        after: tuple[str, int] = ("", -1)  # keys are never empty
        while True:  # each page judged live on the clock as it is read
            params = {**self._times(), "prefix": prefix, "n": len(prefix), "upper": upper}
            rows = self._db.read(sql, {**params, "after": after[0], "after_slot": after[1]})
            yield from (lease_info_of(row) for row in rows)
            if len(rows) < LIST_PAGE:
                return
            after = (rows[-1][0], rows[-1][1])
