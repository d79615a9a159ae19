"""The MySQL/MariaDB store's tables and stored procedures: their DDL, the look at them on a
new connection (in its set-up round trip) and their creation on first use, once however
many clients race (under a named lock)."""

from __future__ import annotations

import re

from tasklock_cli.errors import ConfigError
from tasklock_cli.stores.model import BROKEN_OWNER_PREFIX
from tasklock_cli.stores.model import LEDGER_KEEP
from tasklock_cli.stores.mysql.epochs import RECREATED_ROW
from tasklock_cli.stores.mysql.queue import ACQUIRE_BODY
from tasklock_cli.stores.mysql.queue import WAKE_BODY
from tasklock_cli.stores.mysql.queue import WAKE_QUEUE_BODY

#: Table names: the procedures are named after the table (``<table>_acquire``, at most 64
#: characters), so a name is at most 48.
_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_$]{0,47}")
#: Kept in each procedure's COMMENT: a procedure of another version is replaced.
#: Version 6 adds ``admit``, the acquire with ``p_priority`` and ``p_max_waiting`` (``run
#: --priority``, ``--max-waiting``); ``acquire`` keeps version 5's parameters and calls it
#: with priority 0 and no cap. The tables are unchanged.
#: A run's acquire calls ``admit`` without looking at the versions first (the look costs a
#: round trip and ~1 ms of the server's: see ``MySQLConnection.run``); only a call that fails
#: has them looked at and mended. So a version whose ``admit`` must not serve an older
#: tasklock changes its parameters (the older one's call then fails: 1318) or its name.
VERSION = "tasklock 6"
#: An older tasklock sharing the store replaces the procedures it knows with its own:
#: version 5's have the same parameters and read the queue's order as it is, so they serve
#: this version too (and it leaves them be: the two versions do not take turns replacing
#: them). Only ``admit`` must be this version's.
COMPATIBLE_VERSIONS = (VERSION, "tasklock 5")
#: Columns of the three tables and their data types (information_schema.columns).
_COLUMNS = {
    "": {
        "key": "varbinary",
        "slot": "int",
        "slot_limit": "int",
        "fencing_token": "bigint",
        "owner_token": "varbinary",
        "holder": "text",
        "acquired_at": "datetime",
        "expires_at": "datetime",
        "mode": "varchar",
        "broken_by": "text",
    },
    "_runs": {
        "key": "varbinary",
        "fencing_token": "bigint",
        "started_at": "datetime",
        "ended_at": "datetime",
        "data": "text",
        "succeeded": "tinyint",
    },
    "_waiters": {
        "seq": "bigint",
        "ord": "bigint",
        "key": "varbinary",
        "owner_token": "varbinary",
        "holder": "text",
        "mode": "varchar",
        "since": "datetime",
        "expires_at": "datetime",
        "supersede": "tinyint",
        "superseded": "tinyint",
    },
}
PROCEDURES = ("admit", "acquire", "release", "break", "force", "wake", "wake_queue")

_TABLES = """\
CREATE TABLE IF NOT EXISTS `{table}` (
    `key`         VARBINARY(512) NOT NULL,
    slot          INT NOT NULL,
    slot_limit    INT NOT NULL DEFAULT 1,
    fencing_token BIGINT NOT NULL,
    owner_token   VARBINARY(255) NULL,
    holder        TEXT CHARACTER SET utf8mb4 NULL,
    acquired_at   DATETIME(6) NULL,
    expires_at    DATETIME(6) NULL,
    mode          VARCHAR(16) CHARACTER SET ascii NOT NULL DEFAULT 'exclusive',
    broken_by     TEXT CHARACTER SET utf8mb4 NULL,
    PRIMARY KEY (`key`, slot),
    KEY `{table}_expires` (expires_at)
) ENGINE=InnoDB;
CREATE TABLE IF NOT EXISTS `{table}_runs` (
    `key`         VARBINARY(512) NOT NULL,
    fencing_token BIGINT NOT NULL,
    started_at    DATETIME(6) NOT NULL,
    ended_at      DATETIME(6) NOT NULL,
    data          TEXT CHARACTER SET utf8mb4 NOT NULL,
    succeeded     BOOLEAN NOT NULL DEFAULT FALSE,
    PRIMARY KEY (`key`, fencing_token)
) ENGINE=InnoDB;
CREATE TABLE IF NOT EXISTS `{table}_waiters` (
    seq           BIGINT NOT NULL AUTO_INCREMENT PRIMARY KEY,
    ord           BIGINT NOT NULL DEFAULT 0,
    `key`         VARBINARY(512) NOT NULL,
    owner_token   VARBINARY(255) NOT NULL,
    holder        TEXT CHARACTER SET utf8mb4 NOT NULL,
    mode          VARCHAR(16) CHARACTER SET ascii NOT NULL DEFAULT 'exclusive',
    since         DATETIME(6) NOT NULL,
    expires_at    DATETIME(6) NOT NULL,
    supersede     BOOLEAN NOT NULL DEFAULT FALSE,
    superseded    BOOLEAN NOT NULL DEFAULT FALSE,
    UNIQUE KEY `{table}_place` (`key`, owner_token),
    KEY `{table}_queue` (`key`, ord)
) ENGINE=InnoDB"""

#: Every procedure: its caller's privileges (never its creator's), its version in COMMENT.
_HEAD = "MODIFIES SQL DATA SQL SECURITY INVOKER COMMENT '{version}'"
#: A failing statement rolls the procedure's transaction back before the error goes out:
#: the connection is never left inside a transaction holding row locks.
_ROLLBACK_ON_ERROR = "DECLARE EXIT HANDLER FOR SQLEXCEPTION BEGIN ROLLBACK; RESIGNAL; END;"
_MICROS = "INTERVAL ROUND({seconds} * 1000000) MICROSECOND"
_CLEARED = (
    "owner_token = NULL, holder = NULL, acquired_at = NULL, expires_at = NULL, broken_by = NULL"
)
_BROKEN = f"LEFT(owner_token, {len(BROKEN_OWNER_PREFIX)}) = '{BROKEN_OWNER_PREFIX}'"
_MATCHING = (
    "`key` = p_key AND slot >= 0 AND owner_token IS NOT NULL"
    " AND (p_token IS NULL OR fencing_token = p_token)"
)
INFO_COLUMNS = "`key`, slot, slot_limit, fencing_token, acquired_at, expires_at, holder, mode"

# The run's record goes in with the release (kept as first written when a retry writes it
# again), then the key's ledger is trimmed to its last LEDGER_KEEP runs, never its newest
# success (``--once-per`` and ``metrics`` need it).
_RELEASE = f"""\
CREATE PROCEDURE `{{table}}_release`(
    IN p_key VARBINARY(512), IN p_slot INT, IN p_owner VARBINARY(255), IN p_fence BIGINT,
    IN p_keep DOUBLE, IN p_record BOOLEAN, IN p_started DATETIME(6), IN p_data TEXT,
    IN p_succeeded BOOLEAN)
{_HEAD}
BEGIN
    DECLARE v_now DATETIME(6);
    DECLARE v_freed INT DEFAULT 0;
    DECLARE v_cut BIGINT;
    DECLARE v_best BIGINT;
    {_ROLLBACK_ON_ERROR}
    START TRANSACTION;
    SET v_now = SYSDATE(6);
    IF p_keep > 0 THEN
        UPDATE `{{table}}` SET expires_at = v_now + {_MICROS.format(seconds="p_keep")}
         WHERE `key` = p_key AND slot = p_slot AND owner_token = p_owner
           AND fencing_token = p_fence AND expires_at > v_now;
        SET v_freed = ROW_COUNT();
    END IF;
    IF v_freed = 0 THEN  -- ours (a broken one too: never kept for longer) is freed
        UPDATE `{{table}}` SET {_CLEARED}
         WHERE `key` = p_key AND slot = p_slot AND fencing_token = p_fence
           AND owner_token IN (IF(p_keep > 0, NULL, p_owner),
                               CONCAT('{BROKEN_OWNER_PREFIX}', p_owner));
        SET v_freed = ROW_COUNT();
    END IF;
    IF p_record THEN
        INSERT INTO `{{table}}_runs` (`key`, fencing_token, started_at, ended_at, data, succeeded)
        VALUES (p_key, p_fence, p_started, v_now, p_data, p_succeeded)
        ON DUPLICATE KEY UPDATE fencing_token = fencing_token;
        SET v_cut = (SELECT fencing_token FROM `{{table}}_runs` WHERE `key` = p_key
                      ORDER BY fencing_token DESC LIMIT 1 OFFSET {LEDGER_KEEP - 1});
        IF v_cut IS NOT NULL THEN
            SET v_best = (SELECT MAX(fencing_token) FROM `{{table}}_runs`
                           WHERE `key` = p_key AND succeeded);
            DELETE FROM `{{table}}_runs`
             WHERE `key` = p_key AND fencing_token < v_cut
               AND fencing_token <> COALESCE(v_best, -1);
        END IF;
    END IF;
    COMMIT;
    IF v_freed > 0 AND p_keep <= 0 THEN
        CALL `{{table}}_wake_queue`(p_key, FALSE);
    END IF;
    SELECT v_freed;
END"""

#: The head and start of a procedure that changes leases in one transaction at one time
#: (``v_now``, the server's clock at its start).
_BEGIN_AT_NOW = f"""{_HEAD}
BEGIN
    DECLARE v_now DATETIME(6);
    {_ROLLBACK_ON_ERROR}
    START TRANSACTION;
    SET v_now = SYSDATE(6);"""

# (SET sees the row as it was before it: the first break's breaker stays)
_BREAK = f"""\
CREATE PROCEDURE `{{table}}_break`(IN p_key VARBINARY(512), IN p_token BIGINT, IN p_by TEXT)
{_BEGIN_AT_NOW}
    UPDATE `{{table}}`
       SET broken_by = IF({_BROKEN}, broken_by, p_by),
           owner_token = IF({_BROKEN}, owner_token, CONCAT('{BROKEN_OWNER_PREFIX}', owner_token))
     WHERE {_MATCHING} AND expires_at > v_now;
    COMMIT;
    CALL `{{table}}_wake`(p_key, p_token);
    SELECT {INFO_COLUMNS}, TRUE FROM `{{table}}`
     WHERE {_MATCHING} AND {_BROKEN} AND expires_at > v_now ORDER BY slot;
END"""

# The leases as they were freed are the procedure's result (read under their row locks).
_FORCE = f"""\
CREATE PROCEDURE `{{table}}_force`(IN p_key VARBINARY(512), IN p_token BIGINT)
{_BEGIN_AT_NOW}
    SELECT {INFO_COLUMNS}, expires_at > v_now FROM `{{table}}` WHERE {_MATCHING}
     ORDER BY slot FOR UPDATE;
    UPDATE `{{table}}` SET {_CLEARED} WHERE {_MATCHING};
    COMMIT;
    CALL `{{table}}_wake`(p_key, p_token);
    CALL `{{table}}_wake_queue`(p_key, FALSE);
END"""

_ACQUIRE_PARAMETERS = """\
    IN p_key VARBINARY(512), IN p_owner VARBINARY(255), IN p_holder TEXT, IN p_ttl DOUBLE,
    IN p_limit INT, IN p_queue BOOLEAN, IN p_wttl DOUBLE, IN p_mode VARCHAR(16),
    IN p_supersede BOOLEAN, IN p_front BOOLEAN"""
_ADMIT = f"""\
CREATE PROCEDURE `{{table}}_admit`(
{_ACQUIRE_PARAMETERS}, IN p_priority INT, IN p_max_waiting BIGINT)
{_HEAD}
{ACQUIRE_BODY}"""
# Version 5's acquire, for an older tasklock sharing the store: a plain place, no cap.
_ACQUIRE = f"""\
CREATE PROCEDURE `{{table}}_acquire`(
{_ACQUIRE_PARAMETERS})
{_HEAD}
BEGIN
    CALL `{{table}}_admit`(p_key, p_owner, p_holder, p_ttl, p_limit, p_queue, p_wttl, p_mode,
                           p_supersede, p_front, 0, NULL);
END"""

_WAKE = f"""\
CREATE PROCEDURE `{{table}}_wake`(IN p_key VARBINARY(512), IN p_token BIGINT)
{_HEAD}
{WAKE_BODY}"""

_WAKE_QUEUE = f"""\
CREATE PROCEDURE `{{table}}_wake_queue`(IN p_key VARBINARY(512), IN p_superseded BOOLEAN)
{_HEAD}
{WAKE_QUEUE_BODY}"""

_PROCEDURE_SQL = {
    "admit": _ADMIT,
    "acquire": _ACQUIRE,
    "release": _RELEASE,
    "break": _BREAK,
    "force": _FORCE,
    "wake": _WAKE,
    "wake_queue": _WAKE_QUEUE,
}

# One query, in the set-up round trip: the tables' columns and the procedures' versions.
INSPECT = """
SELECT 'column', table_name, column_name, LOWER(data_type)
  FROM information_schema.columns
 WHERE table_schema = DATABASE() AND table_name IN (%(t)s, %(runs)s, %(waiters)s)
UNION ALL
SELECT 'procedure', routine_name, routine_comment, ''
  FROM information_schema.routines
 WHERE routine_schema = DATABASE() AND routine_type = 'PROCEDURE'
   AND routine_name IN %(procedures)s
"""


def parse_table(name: str) -> str:
    if not _IDENTIFIER.fullmatch(name):
        raise ConfigError(
            f"invalid table name {name!r} in the store URL (expected a letter or underscore "
            "followed by up to 47 letters, digits, _ or $)"
        )
    return name


class MySQLSchema:
    """The lease table, the run ledger's and the waiters' beside it, and the procedures, as
    one store URL names them."""

    def __init__(self, table: str, display_url: str) -> None:
        self.table_name = parse_table(table)
        self._display_url = display_url

    def inspection_params(self) -> dict:
        name = self.table_name
        return {
            "t": name,
            "runs": f"{name}_runs",
            "waiters": f"{name}_waiters",
            "procedures": tuple(f"{name}_{proc}" for proc in PROCEDURES),
        }

    def judge(self, rows: list | tuple) -> str:
        """ "ok" when every table and procedure is current; "missing" when some are missing
        or of another version (created or replaced on first use); else ConfigError (a
        table of that name that is not tasklock's)."""
        name = self.table_name
        columns: dict[str, dict[str, str]] = {}
        procedures: dict[str, str] = {}
        for kind, table, column, column_type in rows:
            table = _text(table)
            if kind == "procedure":
                procedures[table] = _text(column)
            else:
                columns.setdefault(table, {})[_text(column)] = _text(column_type)
        for suffix, wanted in _COLUMNS.items():
            found = columns.get(name + suffix)
            if found is not None and found != wanted:
                shown = ", ".join(f"{col} {kind}" for col, kind in sorted(found.items()))
                raise ConfigError(
                    f"{self._display_url}: table {name + suffix} exists but is not a tasklock "
                    f"table (columns: {shown}); choose another name with ?table="
                )
        current = (
            len(columns) == len(_COLUMNS)
            and procedures.get(f"{name}_admit") == VERSION
            and all(procedures.get(f"{name}_{p}") in COMPATIBLE_VERSIONS for p in PROCEDURES)
        )
        return "ok" if current else "missing"

    def describe(self, rows: list | tuple) -> tuple[bool, str]:
        """``doctor``'s line about the schema (it changes nothing)."""
        try:
            state = self.judge(rows)
        except ConfigError as exc:
            return False, str(exc)
        if state == "missing":
            return True, f"table {self.table_name} will be created on first use"
        return True, f"table {self.table_name} and its procedures are tasklock's"

    def lock_name(self) -> str:
        """The named lock racing first users queue on (at most 64 characters)."""
        return f"tasklock:schema:{self.table_name}"

    def statements(self) -> list[str]:
        """The DDL, statement by statement: tables (if missing), the epoch row of a lease
        table made again beside its ledger (``epochs.RECREATED_ROW``), then each procedure
        replaced by the current one."""
        name = self.table_name
        out = [part.strip() for part in _TABLES.format(table=name).split(";")]
        out.append(RECREATED_ROW.format(table=name))
        for proc, text in _PROCEDURE_SQL.items():
            out.append(f"DROP PROCEDURE IF EXISTS `{name}_{proc}`")
            out.append(text.format(table=name, version=VERSION))
        return out

    def schema_sql(self) -> str:
        lines = [
            "-- tasklock tables: rows of the lease table are never deleted (they keep the",
            "-- fencing counter); the run ledger and the queues of waiters beside it, and the",
            "-- stored procedures the store calls (one round trip per acquire and release).",
            "-- For the mysql/mariadb client: it reads the procedures between DELIMITERs.",
            "DELIMITER //",
        ]
        lines += [f"{statement}\n//" for statement in self.statements()]
        lines.append("DELIMITER ;")
        return "\n".join(lines) + "\n"


def _text(value: object) -> str:
    return value.decode() if isinstance(value, (bytes, bytearray)) else str(value)
