"""Failover epochs on MySQL/MariaDB.

The acquire procedure checks that the server is still the primary under whose writes the
table's rows were made, and computes the fencing tokens of a new epoch (the argument:
docs/design/mysql.md; what the stores share: ``stores.failover``). The epoch row is the
lease table's reserved row of key ``''`` (no lock's) and slot ``EPOCH_SLOT``; without an
owner, no listing, sweep or older tasklock sees it. Its fields:

- ``holder``: a JSON object with these fields:

  - ``identity``: the server it was written on (see ``IDENTITY``);
  - ``max_ttl``: the longest lease TTL (s) an acquire in the table has asked for;
  - ``previous``: the identity before the epoch began.

- ``fencing_token``: the epoch.
  It is 0 until the first change of primary.
  Then it is ``max(previous + 1, the server's clock in whole seconds)``.
- ``expires_at``: ``quarantine_until``, before which no acquire in the table takes a slot.
  Such an acquire answers as a held key does: the caller waits or conflicts.
- ``acquired_at``: when the epoch began.

DDL commits by itself, so the row cannot be written together with the tables.
The first acquire writes it (epoch 0), in the transaction that grants its lease.
So a replica that has any lease of the table has the row.

Tables made where the run ledger already holds runs were lost and made again (dropped while
in use): the making writes the row at once (``RECREATED_ROW``), naming no server and holding
the ledger's epoch, so the first acquire starts a new epoch, with a quarantine, and tokens
above the ledger's.
"""

from __future__ import annotations

import re

from tasklock_cli.stores.failover import DEFAULT_TTL_S
from tasklock_cli.stores.failover import EPOCH_SHIFT
from tasklock_cli.stores.failover import LONGEST_TTL_S
from tasklock_cli.stores.failover import QUARANTINE_MARGIN_S
from tasklock_cli.stores.failover import RECREATED

#: The epoch row's key and slot (no lock key is empty; slot -1 is a key's counter).
EPOCH_KEY = ""
EPOCH_SLOT = -2

#: The server as an epoch knows it, ``SERVER_ID:HOSTNAME:PORT`` (and ``:SERVER_UUID`` on
#: MySQL).
#: A replica's ``server_id`` differs from its primary's.
#: Both MySQL and MariaDB stop replication when they are equal.
#: So a promoted replica is another identity.
#: The host name and port tell apart servers left at the default ``server_id`` 1.
#: Such a server may be a restored copy behind the old name.
#: MySQL's ``server_uuid`` is read through PREPARE.
#: MariaDB has none, and refuses a procedure that names it.
#: A restart keeps the identity.
IDENTITY = """\
    SET v_identity = CONCAT_WS(':', @@server_id, @@hostname, @@port);
    IF VERSION() NOT LIKE '%MariaDB%' THEN
        PREPARE tasklock_server_uuid FROM 'SET @tasklock_server_uuid = @@server_uuid';
        EXECUTE tasklock_server_uuid;
        DEALLOCATE PREPARE tasklock_server_uuid;
        SET v_identity = CONCAT_WS(':', v_identity, @tasklock_server_uuid);
    END IF;"""

_ROW = f"`key` = '{EPOCH_KEY}' AND slot = {EPOCH_SLOT}"
# (MariaDB writes a procedure's variables into JSON as strings: numbers go in as
# expressions, ``v + 0``.)
# A field of the row's holder; NULL when the holder is not JSON (someone else wrote it:
# a new epoch then starts, the safe way).
_FIELD = "IF(JSON_VALID(holder), JSON_UNQUOTE(JSON_EXTRACT(holder, '$.{name}')), NULL)"
# The longest TTL recorded: a number, at most LONGEST_TTL_S (else NULL, as none).
_MAX_TTL = (
    "IF(JSON_VALID(holder) AND JSON_TYPE(JSON_EXTRACT(holder, '$.max_ttl'))"
    " IN ('INTEGER', 'UNSIGNED INTEGER', 'DOUBLE', 'DECIMAL'),"
    " LEAST(JSON_EXTRACT(holder, '$.max_ttl'), {longest}), NULL)"
)
#: The longest TTL the epoch row records (s; NULL as none), for statements of other modules.
MAX_TTL_FIELD = _MAX_TTL.format(longest=LONGEST_TTL_S)
#: Where the epoch row is, for statements of other modules.
EPOCH_ROW_WHERE = _ROW
#: Run after the tables are made: an empty lease table beside a ledger that holds runs gets
#: the row of a table made again (``RECREATED``), in the ledger's epoch.
RECREATED_ROW = f"""\
INSERT IGNORE INTO `{{table}}` (`key`, slot, slot_limit, fencing_token, holder, acquired_at)
SELECT '{EPOCH_KEY}', {EPOCH_SLOT}, 0, MAX(fencing_token) >> {EPOCH_SHIFT},
       JSON_OBJECT('identity', '{RECREATED}', 'max_ttl', 0), SYSDATE(6)
  FROM `{{table}}_runs`
 WHERE NOT EXISTS (SELECT 1 FROM `{{table}}`)
HAVING COUNT(*) > 0"""
_READ = f"""SELECT fencing_token, {_FIELD.format(name="identity")},
               {_MAX_TTL.format(longest=LONGEST_TTL_S)}, expires_at
          INTO v_epoch, v_era, v_max_ttl, v_until
          FROM `{{table}}` WHERE {_ROW}"""
_MICROS = "INTERVAL ROUND({seconds} * 1000000) MICROSECOND"

# The acquire procedure's look at the epoch.
# It comes after ``v_now``, its clock reading; p_ttl is the TTL asked.
# Most acquires only read the row, without a lock: with one, every key's acquires would
# queue on it.
# The row is read again, locked, in three cases:
# - the identity differs from the one recorded (a new epoch: quarantine from now);
# - the TTL is longer than any before;
# - the row is missing.
# That second read sees its latest version, after any acquire racing to start the same
# epoch committed.
# The row is written when that version still says so.
# ``v_quarantine``: the milliseconds of quarantine left, NULL when none.
# A read-only server grants nothing: 1290, as the server's own refusal.
# Such a server is a replica, which root may write to in MariaDB.
EPOCH_STEPS = f"""\
    IF @@read_only THEN
        SIGNAL SQLSTATE 'HY000' SET MYSQL_ERRNO = 1290,
            MESSAGE_TEXT = 'the server is read-only (a replica?): tasklock takes no lease here';
    END IF;
{IDENTITY}
    {_READ};
    IF v_era IS NULL OR v_era <> v_identity OR v_max_ttl IS NULL OR v_max_ttl < p_ttl THEN
        IF v_era IS NULL THEN  -- a new table's first acquire (an unreadable row is kept)
            INSERT IGNORE INTO `{{table}}` (`key`, slot, slot_limit, fencing_token, holder,
                                             acquired_at)
            VALUES ('{EPOCH_KEY}', {EPOCH_SLOT}, 0, 0,
                    JSON_OBJECT('identity', v_identity, 'max_ttl', 0), v_now);
        END IF;
        {_READ} FOR UPDATE;
        IF v_era IS NULL OR v_era <> v_identity THEN
            SET v_epoch = GREATEST(COALESCE(v_epoch, 0) + 1, FLOOR(UNIX_TIMESTAMP(v_now))),
                v_until = v_now + {
    _MICROS.format(
        seconds=f"(GREATEST(COALESCE(v_max_ttl, 0), {DEFAULT_TTL_S}) + {QUARANTINE_MARGIN_S})"
    )
},
                v_max_ttl = GREATEST(COALESCE(v_max_ttl, 0), p_ttl);
            UPDATE `{{table}}`
               SET fencing_token = v_epoch, acquired_at = v_now, expires_at = v_until,
                   holder = JSON_OBJECT('identity', v_identity, 'max_ttl', v_max_ttl + 0,
                                        'previous', v_era)
             WHERE {_ROW};
        ELSEIF v_max_ttl IS NULL OR v_max_ttl < p_ttl THEN
            SET v_max_ttl = p_ttl;
            UPDATE `{{table}}` SET holder = JSON_SET(holder, '$.max_ttl', p_ttl + 0)
             WHERE {_ROW};
        END IF;
    END IF;
    -- (never longer than a new quarantine: a forged end, 9999-12-31 among them, is read as
    -- that)
    SET v_until = LEAST(v_until, v_now + {
    _MICROS.format(
        seconds=f"(GREATEST(COALESCE(v_max_ttl, 0), {DEFAULT_TTL_S}) + {QUARANTINE_MARGIN_S})"
    )
});
    IF v_until > v_now THEN
        SET v_quarantine = CEILING(TIMESTAMPDIFF(MICROSECOND, v_now, v_until) / 1000);
    END IF;"""

#: The first token of the procedure's epoch (0 for epoch 0: the counter decides).
FIRST_TOKEN = f"COALESCE(v_epoch, 0) << {EPOCH_SHIFT}"

# (bounded as the acquire bounds it)
_QUARANTINE_LEFT = (
    "TIMESTAMPDIFF(MICROSECOND, SYSDATE(6), LEAST(expires_at, SYSDATE(6) + "
    + _MICROS.format(
        seconds=f"(GREATEST(COALESCE({_MAX_TTL.format(longest=LONGEST_TTL_S)}, 0), "
        f"{DEFAULT_TTL_S}) + {QUARANTINE_MARGIN_S})"
    )
    + ")) / 1e6"
)
# ``doctor``: the epoch row (no row when none), and the seconds of quarantine left.
EPOCH_ROW = f"""
SELECT fencing_token, {_FIELD.format(name="identity")}, {_FIELD.format(name="previous")},
       {_MAX_TTL.format(longest=LONGEST_TTL_S)}, {_QUARANTINE_LEFT}
  FROM `{{table}}` WHERE {_ROW}
"""
#: ``Store.quarantine``: the seconds of quarantine left on the server's clock, as the
#: acquire procedure compares them (no row, or NULL: none recorded; 0 or less: over). A
#: read only: the epoch starts with an acquire, never here.
QUARANTINE_LEFT = f"SELECT {_QUARANTINE_LEFT} FROM `{{table}}` WHERE {_ROW}"
_QUARANTINE_BOUND = "SYSDATE(6) + " + _MICROS.format(
    seconds=f"(GREATEST(COALESCE({_MAX_TTL.format(longest=LONGEST_TTL_S)}, 0), "
    f"{DEFAULT_TTL_S}) + {QUARANTINE_MARGIN_S})"
)
#: A quarantine end further ahead than a new quarantine would end (someone else wrote it:
#: 9999-12-31) set to that end, so that it does end: run after an acquire met a quarantine
#: (a real one never matches).
BOUND_FORGED_QUARANTINE = f"""UPDATE `{{table}}` SET expires_at = {_QUARANTINE_BOUND}
 WHERE {_ROW} AND expires_at > {_QUARANTINE_BOUND}"""
# ``doctor``: this server's identity (without MySQL's uuid: see IDENTITY) and what decides
# whether its leases survive it.
SERVER = """
SELECT CONCAT_WS(':', @@server_id, @@hostname, @@port), @@read_only,
       @@innodb_flush_log_at_trx_commit, @@log_bin
"""

_IDENTITY_TEXT = re.compile(r"(\d{1,20}):([A-Za-z0-9._-]{1,255}):(\d{1,5})(?::([0-9a-f-]{36}))?")


def describe_identity(identity: object) -> str:
    """``SERVER_ID:HOSTNAME:PORT[:UUID]`` as words (the row is the table's: anything else
    is shown as unrecognised, never as it is)."""
    found = _IDENTITY_TEXT.fullmatch(identity) if isinstance(identity, str) else None
    if found is None:
        return "an unrecognised server"
    return f"server_id {found[1]} on {found[2]}:{found[3]}"
