"""The PostgreSQL store's reads: what ``peek``, ``list``, ``history``, ``metrics`` and
``--once-per`` show (the leases, the waiters, the run ledger), each one statement judged
on the server's clock. A mixin of ``PostgresStore``."""

from __future__ import annotations

from collections.abc import Callable
from collections.abc import Iterator
from datetime import datetime
from datetime import timezone

from psycopg import sql

from tasklock_cli.stores import rows as rows_of
from tasklock_cli.stores.model import LEDGER_KEEP
from tasklock_cli.stores.model import LIST_PAGE
from tasklock_cli.stores.model import LeaseInfo
from tasklock_cli.stores.model import RunRecord
from tasklock_cli.stores.model import WaiterInfo
from tasklock_cli.stores.model import prefix_upper_bound
from tasklock_cli.stores.postgres.connection import PgConnection
from tasklock_cli.stores.postgres.connection import one_row
from tasklock_cli.stores.postgres.queue import COUNTER_SLOT
from tasklock_cli.stores.postgres.queue import WAITERS
from tasklock_cli.stores.postgres.queue import WAITING_COUNTS

_EPOCH = datetime.fromtimestamp(0, tz=timezone.utc)

INFO_COLUMNS = "key, slot, slot_limit, fencing_token, acquired_at, expires_at, holder, mode"

# The run ledger's part of a release:
# - The run's record. When a retry writes it again, it is kept as first written.
# - The trim to the key's last LEDGER_KEEP runs, counting the new one.
#   (The statement's snapshot does not show its own insert.)
# The key's newest success is never trimmed: ``--once-per`` and ``metrics`` need it.
# With %(succeeded)s, that is the new run.
SUCCEEDED = "data->>'outcome' = 'succeeded'"

_HISTORY = """
SELECT key, fencing_token, started_at, ended_at, data FROM {runs}
 WHERE key = %(key)s ORDER BY fencing_token DESC LIMIT %(limit)s
"""

# The key's newest success and the server's clock, in one statement.
_LAST_SUCCESS = f"""
SELECT n.now, r.key, r.fencing_token, r.started_at, r.ended_at, r.data
  FROM (SELECT clock_timestamp() AS now) AS n
  LEFT JOIN LATERAL (
    SELECT key, fencing_token, started_at, ended_at, data FROM {{runs}}
     WHERE key = %(key)s AND {SUCCEEDED} ORDER BY fencing_token DESC LIMIT 1
  ) AS r ON true
"""

_LEDGER_KEYS = """
SELECT DISTINCT key FROM {runs}
 WHERE key >= %(prefix)s COLLATE "C" AND left(key, char_length(%(prefix)s)) = %(prefix)s
 ORDER BY key
"""

_NOT_RUN_OUT = "(expires_at > clock_timestamp() OR expires_at IS NULL)"

_SELECT = f"SELECT {INFO_COLUMNS}, {_NOT_RUN_OUT} AS live FROM {{table}}"

_HOLDERS = (
    _SELECT + f" WHERE key = %(key)s AND owner_token IS NOT NULL AND {_NOT_RUN_OUT} ORDER BY slot"
)

# Literal prefix match (no LIKE wildcards); the range bound lets the primary key help.
_LIST = (
    _SELECT + " WHERE owner_token IS NOT NULL {live}"
    ' AND key >= %(prefix)s COLLATE "C" {upper}'
    ' AND (key, slot) > (%(after)s COLLATE "C", %(after_slot)s::integer)'
    ' AND left(key, char_length(%(prefix)s)) = %(prefix)s ORDER BY key COLLATE "C", slot'
    f" LIMIT {LIST_PAGE}"
)

_UPPER = ' AND key < %(upper)s COLLATE "C"'


def utc(moment: datetime | None) -> datetime:
    return moment.astimezone(timezone.utc) if moment is not None else _EPOCH


def lease_info_of(row: tuple) -> LeaseInfo:
    """A lease row, read defensively (see rows)."""
    key, slot, slot_limit, token, acquired_at, expires_at, holder, mode, live = row
    return rows_of.lease_info(
        key, slot, slot_limit, token, acquired_at, expires_at, holder, mode, not live
    )


class PgReads:
    """The reads of ``PostgresStore`` (see the module's docstring)."""

    _db: PgConnection
    _sql: Callable[..., sql.Composed]

    def waiters(self, key: str) -> list[WaiterInfo]:
        statement = self._sql(WAITERS)
        rows = self._db.run(lambda conn: conn.execute(statement, {"key": key}).fetchall())
        return [rows_of.waiter_info(holder, since, mode) for holder, since, mode in rows]

    def waiting_counts(self, prefix: str = "") -> dict[str, int]:
        statement = self._sql(WAITING_COUNTS)
        rows = self._db.run(lambda conn: conn.execute(statement, {"prefix": prefix}).fetchall())
        return {key: int(count) for key, count in rows}

    def history(self, key: str, limit: int = LEDGER_KEEP) -> list[RunRecord]:
        statement = self._sql(_HISTORY)
        params = {"key": key, "limit": limit}
        rows = self._db.run(lambda conn: conn.execute(statement, params).fetchall())
        return [rows_of.run_record(*row) for row in rows]

    def last_success(self, key: str) -> tuple[RunRecord | None, datetime]:
        statement = self._sql(_LAST_SUCCESS)
        now, *run = self._db.run(lambda conn: one_row(conn.execute(statement, {"key": key})))
        if run[0] is None:
            return None, utc(now)
        return rows_of.run_record(*run), utc(now)

    def ledger_keys(self, prefix: str = "") -> list[str]:
        statement = self._sql(_LEDGER_KEYS)
        rows = self._db.run(lambda conn: conn.execute(statement, {"prefix": prefix}).fetchall())
        return [row[0] for row in rows]

    def holders(self, key: str) -> list[LeaseInfo]:
        statement = self._sql(_HOLDERS)
        rows = self._db.run(lambda conn: conn.execute(statement, {"key": key}).fetchall())
        return [lease_info_of(row) for row in rows]

    def list(self, prefix: str = "", include_expired: bool = False) -> Iterator[LeaseInfo]:
        live = "" if include_expired else f"AND {_NOT_RUN_OUT}"
        upper = prefix_upper_bound(prefix)
        statement = self._sql(_LIST, live, _UPPER if upper is not None else "")
        # Keys are never empty, and slots are never below the counter's.
        params = {"prefix": prefix, "upper": upper, "after": "", "after_slot": COUNTER_SLOT}
        while True:
            rows = self._db.run(lambda conn: conn.execute(statement, params).fetchall())
            yield from (lease_info_of(row) for row in rows)
            if len(rows) < LIST_PAGE:
                return
            params["after"], params["after_slot"] = rows[-1][0], rows[-1][1]
