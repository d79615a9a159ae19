"""The MySQL/MariaDB store class and its statements (the overview is the package's
docstring)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import datetime
from datetime import timezone

from tasklock_cli.errors import CounterUnreadable
from tasklock_cli.errors import FencingExhausted
from tasklock_cli.errors import LimitMismatch
from tasklock_cli.errors import QueueFull
from tasklock_cli.errors import Superseded
from tasklock_cli.errors import TasklockError
from tasklock_cli.stores import rows as row_parsing
from tasklock_cli.stores.failover import Quarantines
from tasklock_cli.stores.failover import quarantine_text
from tasklock_cli.stores.model import BROKEN_OWNER_PREFIX
from tasklock_cli.stores.model import LEDGER_KEEP
from tasklock_cli.stores.model import LIST_PAGE
from tasklock_cli.stores.model import SHARED
from tasklock_cli.stores.model import UNREADABLE_EXPIRY_FLOOR_S
from tasklock_cli.stores.model import UNREADABLE_EXPIRY_MARGIN_S
from tasklock_cli.stores.model import Ask
from tasklock_cli.stores.model import Holder
from tasklock_cli.stores.model import Lease
from tasklock_cli.stores.model import LeaseInfo
from tasklock_cli.stores.model import RunRecord
from tasklock_cli.stores.model import WaiterInfo
from tasklock_cli.stores.model import breaker
from tasklock_cli.stores.model import breaker_of
from tasklock_cli.stores.model import place_record
from tasklock_cli.stores.model import prefix_upper_bound
from tasklock_cli.stores.mysql import CAPABILITIES
from tasklock_cli.stores.mysql.breaks import MySQLBreakWatches
from tasklock_cli.stores.mysql.connection import NO_SUCH_TABLE
from tasklock_cli.stores.mysql.connection import MySQLConnection
from tasklock_cli.stores.mysql.connection import error_code
from tasklock_cli.stores.mysql.connection import parse_url
from tasklock_cli.stores.mysql.driver import pymysql
from tasklock_cli.stores.mysql.epochs import BOUND_FORGED_QUARANTINE
from tasklock_cli.stores.mysql.epochs import EPOCH_ROW_WHERE
from tasklock_cli.stores.mysql.epochs import MAX_TTL_FIELD
from tasklock_cli.stores.mysql.epochs import QUARANTINE_LEFT
from tasklock_cli.stores.mysql.queue import LEAVE_QUEUE
from tasklock_cli.stores.mysql.queue import SWEEP_WAITERS
from tasklock_cli.stores.mysql.queue import TIME_UNTIL_FREE
from tasklock_cli.stores.mysql.queue import WAITERS
from tasklock_cli.stores.mysql.queue import WAITING_COUNTS
from tasklock_cli.stores.mysql.schema import INFO_COLUMNS
from tasklock_cli.stores.mysql.schema import MySQLSchema
from tasklock_cli.stores.mysql.waiting import PLACELESS_LOOK_S
from tasklock_cli.stores.mysql.waiting import WAITER_SLEEP_S
from tasklock_cli.stores.mysql.waiting import WakeLine
from tasklock_cli.stores.queueing import QUEUED
from tasklock_cli.stores.queueing import Queued
from tasklock_cli.stores.sql import SqlStore
from tasklock_cli.stores.sql import taken_lease
from tasklock_cli.stores.urls import redact_url
from tasklock_cli.stores.watches import BreakWatches
from tasklock_cli.util import jsontext as json
from tasklock_cli.util.fds import fd_readable
from tasklock_cli.util.fds import wait_readable
from tasklock_cli.util.keys import stored_key

#: ``list`` in the store class's body is its method: annotations there say builtins.list.
TYPE_CHECKING = False
if TYPE_CHECKING:
    import builtins

#: typing costs ~2 ms per start: its names are for the type checker only.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

SWEEP_BATCH = 1000
_EPOCH = datetime.fromtimestamp(0, tz=timezone.utc)
_LIVE = "expires_at > SYSDATE(6)"
_OURS = (
    "`key` = %(key)s AND slot = %(slot)s AND owner_token = %(owner)s AND fencing_token = %(fence)s"
)
# No UPDATE ... RETURNING: the new expiry is computed first, and returned when the UPDATE
# changed the row (one multi-statement query, one round trip).
_RENEW = f"""SET @tasklock_expiry = SYSDATE(6) + INTERVAL %(micros)s MICROSECOND;
UPDATE `{{table}}` SET expires_at = @tasklock_expiry WHERE {_OURS} AND {_LIVE};
SELECT IF(ROW_COUNT() > 0, CAST(@tasklock_expiry AS DATETIME(6)), NULL)"""
_NOT_BROKEN = f"LEFT(owner_token, {len(BROKEN_OWNER_PREFIX)}) <> '{BROKEN_OWNER_PREFIX}'"
_TIME_LEFT = f"""
SELECT TIMESTAMPDIFF(MICROSECOND, SYSDATE(6), expires_at) / 1e6 FROM `{{table}}`
 WHERE `key` = %(key)s AND slot >= 0 AND fencing_token = %(token)s AND owner_token IS NOT NULL
   AND {_NOT_BROKEN} AND {_LIVE}
"""
_HISTORY = """
SELECT `key`, fencing_token, started_at, ended_at, data FROM `{table}_runs`
 WHERE `key` = %(key)s ORDER BY fencing_token DESC LIMIT %(limit)s
"""
_LAST_SUCCESS = """
SELECT SYSDATE(6), r.`key`, r.fencing_token, r.started_at, r.ended_at, r.data
  FROM (SELECT 1 AS one) AS n LEFT JOIN (
    SELECT `key`, fencing_token, started_at, ended_at, data FROM `{table}_runs`
     WHERE `key` = %(key)s AND succeeded ORDER BY fencing_token DESC LIMIT 1
  ) AS r ON TRUE
"""
_LEDGER_KEYS = """
SELECT DISTINCT `key` FROM `{table}_runs`
 WHERE `key` >= %(prefix)s AND LEFT(`key`, LENGTH(%(prefix)s)) = %(prefix)s ORDER BY `key`
"""
_SELECT = f"SELECT {INFO_COLUMNS}, {_LIVE} FROM `{{table}}`"
_HOLDERS = (
    _SELECT + " WHERE `key` = %(key)s AND slot >= 0 AND owner_token IS NOT NULL"
    f" AND {_LIVE} ORDER BY slot"
)
# Literal prefix match (no LIKE wildcards); the range bounds let the primary key help.
_LIST = (
    _SELECT + " WHERE owner_token IS NOT NULL AND slot >= 0 {live}"
    " AND `key` >= %(prefix)s {upper} AND (`key`, slot) > (%(after)s, %(after_slot)s)"
    " AND LEFT(`key`, LENGTH(%(prefix)s)) = %(prefix)s ORDER BY `key`, slot"
    f" LIMIT {LIST_PAGE}"
)
# A lease kept after its command ended (--hold-at-least) is marked done in its holder:
# nothing runs under it, and its holder has exited (see free_if_holder_gone).
_MARK_DONE = f"""UPDATE `{{table}}`
   SET holder = JSON_SET(holder, '$.done', JSON_EXTRACT('true', '$'))
 WHERE `key` = %(key)s AND slot = %(slot)s AND owner_token = %(owner)s
   AND fencing_token = %(fence)s AND {_LIVE}"""
_DONE = f"""SELECT 1 FROM `{{table}}`
 WHERE `key` = %(key)s AND slot >= 0 AND fencing_token = %(token)s AND owner_token IS NOT NULL
   AND {_LIVE} AND JSON_UNQUOTE(JSON_EXTRACT(holder, '$.done')) = 'true'"""
# A live lease of the key whose expiry lies further ahead than any lease the table granted
# could have (someone else wrote 9999-12-31), and not one kept after its command ended (a
# hold may be longer, and release --force frees that at once): the break first bounds it
# as the longest a holder's lease could still be valid (the epoch row's longest TTL, or the
# floor, plus the margin). A statement of its own, committed at once, so that it holds the
# key's row locks only for itself: inside the break's transaction it raced the holders'
# renewals. (The derived table: MySQL refuses a subquery on the table being updated.)
_BOUND_S = (
    f"GREATEST(COALESCE((SELECT e.ttl FROM (SELECT {MAX_TTL_FIELD} AS ttl FROM `{{table}}`"
    f" WHERE {EPOCH_ROW_WHERE}) AS e), 0), {UNREADABLE_EXPIRY_FLOOR_S})"
    f" + {UNREADABLE_EXPIRY_MARGIN_S}"
)
_PAST_BOUND = f"SYSDATE(6) + INTERVAL ROUND(({_BOUND_S}) * 1000000) MICROSECOND"
_BOUND_FORGED_EXPIRY = f"""UPDATE `{{table}}` SET expires_at = {_PAST_BOUND}
 WHERE `key` = %(key)s AND slot >= 0 AND owner_token IS NOT NULL
   AND (%(token)s IS NULL OR fencing_token = %(token)s) AND expires_at > {_PAST_BOUND}
   AND NOT (IF(JSON_VALID(holder), JSON_UNQUOTE(JSON_EXTRACT(holder, '$.done')), NULL)
            <=> 'true')"""
_BROKEN_BY = """SELECT broken_by FROM `{table}`
 WHERE `key` = %(key)s AND slot = %(slot)s AND owner_token = %(broken)s
   AND fencing_token = %(fence)s"""
_SWEEP_COUNT = f"SELECT COUNT(*) FROM `{{table}}` WHERE owner_token IS NOT NULL AND NOT {_LIVE}"
_SWEEP = f"""UPDATE `{{table}}`
   SET owner_token = NULL, holder = NULL, acquired_at = NULL, expires_at = NULL, broken_by = NULL
 WHERE owner_token IS NOT NULL AND expires_at <= SYSDATE(6) ORDER BY `key`, slot
 LIMIT {SWEEP_BATCH}"""


class MySQLStore(SqlStore, capabilities=CAPABILITIES):
    # A release wakes the waiters it may admit (see ``waiting``); the others look again
    # every ``WAITER_SLEEP_S`` (reads only).
    release_look_s = WAITER_SLEEP_S
    _db: MySQLConnection
    _schema: MySQLSchema

    def __init__(self, url: str, display_url: str | None = None) -> None:
        self.display_url = display_url or redact_url(url)
        kwargs, table = parse_url(url, self.display_url)
        self._schema = MySQLSchema(table, self.display_url)
        self._db = MySQLConnection(url, self.display_url, self._schema, kwargs)
        self.table_name = table
        self._statements: dict[str, str] = {}
        self._place_seqs: dict[str, int] = {}  # key -> our place's seq in its queue
        self._seen: dict[str, tuple[int, int]] = {}  # key -> (live leases, counter) at a look
        self._quarantines = Quarantines()  # the failover quarantines our acquires met
        self._wake_line = WakeLine(self._db, table, lambda: self.release_look_s)
        self._break_watches = BreakWatches(
            MySQLBreakWatches(self._db, table).open,
            (pymysql.err.MySQLError, OSError, TasklockError),
        )

    @classmethod
    def from_url(cls, url: str) -> MySQLStore:
        return cls(url)

    def _sql(self, template: str) -> str:
        statement = self._statements.get(template)
        if statement is None:
            statement = self._statements[template] = template.replace("{table}", self.table_name)
        return statement

    def _rows(
        self,
        template: str,
        params: dict | None = None,
        *,
        ensure_schema: bool = True,
        if_no_table: builtins.list[tuple] | None = None,
    ) -> builtins.list[tuple]:
        """The last result set's rows of ``template``. ``if_no_table``: the answer when a
        table it names does not exist (else that is an error, and the tables are made)."""
        statement = self._sql(template)

        def run(conn: pymysql.connections.Connection) -> builtins.list[tuple]:
            with conn.cursor() as cursor:
                try:
                    cursor.execute(statement, params)
                    rows = list(cursor.fetchall())
                    while cursor.nextset():
                        if cursor.description is not None:
                            rows = list(cursor.fetchall())  # the last result set's rows
                except pymysql.err.MySQLError as exc:
                    if if_no_table is None or error_code(exc) != NO_SUCH_TABLE:
                        raise
                    return if_no_table
                return rows

        return self._db.run(run, ensure_schema=ensure_schema)

    def _call(
        self, procedure: str, args: tuple, *, idempotent: bool = True
    ) -> builtins.list[tuple]:
        """CALL ``<table>_<procedure>`` (one round trip): the first result set's rows. An
        idempotent call on a new connection takes its session settings along (a run's
        acquire: no round trip of set-up, see ``MySQLConnection.run``)."""
        statement = f"CALL `{self.table_name}_{procedure}`({', '.join(['%s'] * len(args))})"

        def run(conn: pymysql.connections.Connection) -> builtins.list[tuple]:
            with conn.cursor() as cursor:
                set_up = self._db.take_set_up()
                cursor.execute(set_up + statement, args)
                for _ in range(set_up.count(";")):  # past the settings' results
                    cursor.nextset()
                rows = list(cursor.fetchall())
                while cursor.nextset():  # to the end (an error after the rows is raised)
                    pass
                return rows

        return self._db.run(run, idempotent=idempotent, set_up_in_band=idempotent)

    # -- the interface --------------------------------------------------------------

    def _acquire(
        self, key: str, ttl: float, holder: Holder, owner: str, limit: int, queue: bool, ask: Ask
    ) -> Lease | Queued | None:
        args = (
            key,
            owner,
            json.dumps(place_record(holder, ask)),
            float(ttl),
            int(limit),
            queue,
            float(self.waiter_ttl),
            ask.mode,
            ask.supersede,
            ask.front,
            int(ask.priority),
            ask.max_waiting,
        )
        (row,) = self._call("admit", args)
        outcome, *lease_columns, seq, quarantine = row
        outcome, slot_limit = _text(outcome), lease_columns[1]
        self._quarantines.met(key, None if quarantine is None else int(quarantine))
        if quarantine:
            self._rows(BOUND_FORGED_QUARANTINE)
        if outcome == "queued":
            self._place_seqs[key] = int(seq)
            return QUEUED
        self._place_seqs.pop(key, None)
        if outcome == "superseded":
            raise Superseded(key)
        if outcome == "mismatch":
            raise LimitMismatch(key, int(slot_limit), int(limit))
        if outcome == "full":
            raise QueueFull(key, ask.max_waiting or 0)
        if outcome == "exhausted":
            raise FencingExhausted(key)
        if outcome == "unreadable":
            raise CounterUnreadable(key)
        if outcome != "taken":
            return None
        return taken_lease(key, owner, tuple(lease_columns), _utc, _text)

    def holdup(self, key: str) -> str | None:
        return _quarantine_text(self._quarantines.left(key))

    def quarantine(self) -> str | None:
        rows = self._rows(QUARANTINE_LEFT)
        left = rows[0][0] if rows else None
        return _quarantine_text(None if left is None else float(left))

    def renew(self, lease: Lease, ttl: float) -> Lease:
        params = {**_ours(lease), "micros": round(float(ttl) * 1e6)}
        # A plain UPDATE of the lease's row: it needs none of the procedures, so a renewal
        # after a reconnection does not look at them, nor wait for another client making
        # them (a holder's heartbeat has the least time of anyone). A lease table that is
        # gone took the lease with it: lost at once, as a row that is gone.
        rows = self._rows(_RENEW, params, ensure_schema=False, if_no_table=[])
        expiry = rows[0][0] if rows else None
        return lease.renewed_until(None if expiry is None else _utc(expiry))

    def release(self, lease: Lease, keep_for: float = 0.0, record: RunRecord | None = None) -> bool:
        self._break_watches.drop(lease)
        args = (
            lease.key,
            lease.slot,
            lease.owner_token,
            lease.fencing_token,
            float(max(0.0, keep_for)),
            record is not None,
            _naive(record.started_at) if record else None,
            json.dumps(record.fields()) if record else None,
            record is not None and record.outcome == "succeeded",
        )
        # Not retried on an ambiguous failure: if the row was cleared and the reply lost,
        # a retry would report False although the release worked.
        (row,) = self._call("release", args, idempotent=False)
        if keep_for > 0 and int(row[0]) == 1:  # (one more round trip, for these runs only)
            self._rows(_MARK_DONE, _ours(lease))
        return int(row[0]) == 1

    def time_left(self, key: str, fencing_token: int) -> float | None:
        rows = self._rows(_TIME_LEFT, {"key": stored_key(key), "token": fencing_token})
        return max(0.0, float(rows[0][0])) if rows else None

    def history(self, key: str, limit: int = LEDGER_KEEP) -> builtins.list[RunRecord]:
        rows = self._rows(_HISTORY, {"key": stored_key(key), "limit": int(limit)})
        return [_run(row) for row in rows]

    def last_success(self, key: str) -> tuple[RunRecord | None, datetime]:
        (row,) = self._rows(_LAST_SUCCESS, {"key": stored_key(key)})
        now = _utc(row[0])
        return (None if row[1] is None else _run(row[1:])), now

    def ledger_keys(self, prefix: str = "") -> builtins.list[str]:
        return [_text(row[0]) for row in self._rows(_LEDGER_KEYS, {"prefix": prefix})]

    def holders(self, key: str) -> builtins.list[LeaseInfo]:
        return [_info(row) for row in self._rows(_HOLDERS, {"key": stored_key(key)})]

    def waiters(self, key: str) -> builtins.list[WaiterInfo]:
        rows = self._rows(WAITERS, {"key": stored_key(key)})
        return [
            row_parsing.waiter_info(_json_text(holder), _utc_or_none(since), _text(mode))
            for holder, since, mode in rows
        ]

    def waiting_counts(self, prefix: str = "") -> dict[str, int]:
        rows = self._rows(WAITING_COUNTS, {"prefix": prefix})
        return {_text(key): int(count) for key, count in rows}

    def list(self, prefix: str = "", include_expired: bool = False) -> Iterator[LeaseInfo]:
        upper = prefix_upper_bound(prefix)
        template = _LIST.replace("{live}", "" if include_expired else f"AND {_LIVE}").replace(
            "{upper}", "AND `key` < %(upper)s" if upper is not None else ""
        )
        params: dict[str, Any] = {"prefix": prefix, "upper": upper, "after": "", "after_slot": -1}
        while True:
            rows = self._rows(template, params)
            yield from (_info(row) for row in rows)
            if len(rows) < LIST_PAGE:
                return
            params["after"], params["after_slot"] = rows[-1][0], rows[-1][1]

    def sweep(self, dry_run: bool = False) -> int:
        if dry_run:
            return int(self._rows(_SWEEP_COUNT)[0][0])
        self._rows(SWEEP_WAITERS)  # (not counted: no leases)
        statement = self._sql(_SWEEP)

        def batch(conn: pymysql.connections.Connection) -> int:
            with conn.cursor() as cursor:
                return cursor.execute(statement)

        removed = 0
        while True:  # bounded batches: no statement holds many row locks for long
            started = time.monotonic()
            cleared = self._db.run(batch)
            removed += cleared
            if cleared < SWEEP_BATCH:
                return removed
            time.sleep(2 * (time.monotonic() - started))

    def break_lease(
        self, key: str, token: int | None = None, by: Holder | None = None
    ) -> builtins.list[LeaseInfo]:
        self._rows(_BOUND_FORGED_EXPIRY, {"key": stored_key(key), "token": token})
        rows = self._call("break", (stored_key(key), token, json.dumps(breaker(by))))
        return [_info(row) for row in rows]

    def broken_by(self, lease: Lease) -> dict | None:
        params = {**_ours(lease), "broken": BROKEN_OWNER_PREFIX + lease.owner_token}
        rows = self._rows(_BROKEN_BY, params)
        return breaker_of(rows[0][0]) if rows else None

    def free_if_holder_gone(self, key: str, token: int) -> bool:
        """Only a lease kept after its command ended (``_MARK_DONE``) has nobody under it."""
        done = self._rows(_DONE, {"key": stored_key(key), "token": token})
        return bool(done) and bool(self.force_release(key, token))

    def force_release(self, key: str, token: int | None = None) -> builtins.list[LeaseInfo]:
        rows = self._call("force", (stored_key(key), token), idempotent=False)
        return [_info(row) for row in rows]

    def wait_for_break(self, lease: Lease, timeout: float, wake_fd: int | None = None) -> bool:
        """On a connection of its own, sleep on the server holding the lease's named lock,
        which a break or forced release KILLs (see ``breaks``)."""
        return self._break_watches.wait(lease, timeout, wake_fd)

    # -- waiting (the skeleton is Store.wait_for_release) -------------------------------

    waiting_trouble = (TasklockError, OSError)

    def _prepare_wait(self, key: str, deadline: float, wake_fd: int | None) -> bool:
        seq = self._place_seqs.get(key)
        if seq is not None:
            self._wake_line.hold(seq)  # before the look: a release after it wakes us
        return True

    def _time_until_free(self, key: str) -> float | None:
        quarantine_left = self._quarantines.left(key)
        if quarantine_left > 0:
            return quarantine_left
        owner = self._queue_place(key) or ""
        (row,) = self._rows(TIME_UNTIL_FREE, {"key": key, "owner": owner})
        live, limit, first_left, exclusive_left, ahead, exclusive_ahead, mode, counter = row
        self._seen[key] = (int(live), int(counter or 0))
        if _text(mode or "") == SHARED:  # shared places ahead of ours are admitted with us
            if exclusive_left is not None:
                return max(0.0, float(exclusive_left))
            return None if int(exclusive_ahead) == 0 else self.waiter_ttl
        if live and int(live) >= int(limit):
            return max(0.0, float(first_left))
        free = int(limit) - int(live) if live else 1  # (a free key's limit is the next taker's)
        return None if int(ahead) < free else self.waiter_ttl

    def _await_wakeup(self, key: str, until: float, wake_fd: int | None) -> None:
        """Sleep on the wake line (a place's waiter) or here, a slice at a time, until the
        key may be free for us, or ``until``. A wake-up is a hint: the look after it
        confirms it (a key that changed for a waiter further back wakes nobody)."""
        while True:
            seen = self._seen.get(key, (0, 0))
            woke = (
                self._wake_line.sleep(key, seen, until, wake_fd)
                if key in self._place_seqs
                else None
            )
            if woke is None:
                left = min(until - time.monotonic(), PLACELESS_LOOK_S)
                if wait_readable([wake_fd], left):
                    return
            if until - time.monotonic() <= 0 or fd_readable(wake_fd):
                return
            if self._time_until_free(key) is None:
                return

    def _leave_queue(self, key: str, owner: str | None) -> None:
        self._place_seqs.pop(key, None)
        if owner is not None:
            self._rows(LEAVE_QUEUE, {"key": key, "owner": owner})

    def _close(self) -> None:
        self._break_watches.close()
        self._wake_line.close()
        self._db.close()


def _quarantine_text(left: float | None) -> str | None:
    """What a failover quarantine with ``left`` seconds to run means; None when over."""
    return quarantine_text(
        "the MySQL primary changed (a failover, or another server behind the URL), or the "
        "table was lost and made again",
        "table",
        left,
    )


def _ours(lease: Lease) -> dict[str, Any]:
    return {
        "key": lease.key,
        "slot": lease.slot,
        "owner": lease.owner_token,
        "fence": lease.fencing_token,
    }


def _text(value: object) -> str:
    """A text column (a key: VARBINARY) as text; bytes that are not UTF-8 (a key someone
    wrote) as ``rows.NotUtf8``, which reads as malformed, never a UnicodeDecodeError."""
    if isinstance(value, (bytes, bytearray)):
        return row_parsing.lenient_text(bytes(value))
    return str(value)


def _utc(moment: datetime | None) -> datetime:
    """A DATETIME the server wrote in UTC (the session's time zone), as an aware datetime."""
    return moment.replace(tzinfo=timezone.utc) if moment is not None else _EPOCH


def _naive(moment: datetime) -> datetime:
    return moment.astimezone(timezone.utc).replace(tzinfo=None)


def _utc_or_none(moment: object) -> object:
    """As ``_utc`` for a DATETIME; anything else as it came, for rows to find malformed
    (NULL, or the zero date, which the driver gives as text)."""
    return _utc(moment) if isinstance(moment, datetime) else moment


def _json_text(value: object) -> object:
    """A JSON column as text (the driver may give bytes), for rows to read."""
    return value.decode("utf-8", "surrogateescape") if isinstance(value, bytes) else value


def _run(row: tuple) -> RunRecord:
    """A run of the ledger, read defensively (see rows)."""
    key, token, started, ended, data = row
    return row_parsing.run_record(
        _text(key), token, _utc_or_none(started), _utc_or_none(ended), _json_text(data)
    )


def _info(row: tuple) -> LeaseInfo:
    """A lease row, read defensively (see rows)."""
    key, slot, slot_limit, token, acquired_at, expires_at, holder, mode, live = row[:9]
    return row_parsing.lease_info(
        _text(key),
        slot,
        slot_limit,
        token,
        _utc_or_none(acquired_at),
        _utc_or_none(expires_at),
        _json_text(holder),
        _text(mode),
        not live,
    )
