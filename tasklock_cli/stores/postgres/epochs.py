"""Failover epochs on PostgreSQL.

The acquire statement checks that the server is still the primary.
It also checks that it is the same run of the server, under whose writes the table's rows
were made.
And it computes the fencing tokens of a new epoch.
The argument is in docs/design/postgres.md.
The design the stores share is in ``stores.failover``.

The table's epoch row is a reserved row of the lease table.
Its key is ``''``, which no lock has, and its slot is ``EPOCH_SLOT``.
It has no owner, so no listing, sweep or older tasklock sees it.
Its fields:

- ``holder->>'identity'``: the server it was written on, ``SYSTEM:TIMELINE`` (see
  ``IDENTITY``).
- ``holder->>'started'``: when that server last started (see ``STARTED``).
- ``fencing_token``: the epoch.
  It is 0 until the first change of primary or restart.
  Then it is ``max(previous + 1, the server's clock in whole seconds)``.
- ``expires_at``: ``quarantine_until``, before which no acquire in the table succeeds.
  Such an acquire answers as a held key does: the caller waits or conflicts.
- ``holder->>'max_ttl'``: the longest lease TTL (s) an acquire in the table has asked for.
- ``acquired_at``: when the epoch began.
- ``holder->>'previous'`` and ``holder->>'previous_started'``: the identity and start
  before it.
  ``previous`` is ``MISSING_ROW`` when the epoch began because a used table had no row.

The row is created with the table, in one transaction.
So a standby that has the table has the row.
A table made where the run ledger already holds runs was lost and made again (dropped while
in use): its row names no server (``RECREATED``) and holds the ledger's epoch, so its first
acquire starts a new epoch, with a quarantine, and tokens above the ledger's.

An acquire that finds no row creates it:

- at epoch 0, in a table that holds no other row;
- else as a new epoch, with a quarantine.
  The table is then from before epochs, or rolled back to before its row was written.
  The two cannot be told apart.

An operator forces a new epoch by setting ``identity`` to ``NEW_EPOCH`` (see README).

The start time is kept apart from the identity, for a tasklock from before it.
Such a tasklock compares the identity alone.
It keeps the row's other fields when it writes.
So it shares the table without starting epochs back and forth.
A row without a start time takes this server's start as its own, without a new epoch.
"""

from __future__ import annotations

import re
from datetime import datetime
from datetime import timezone

from tasklock_cli.stores.failover import DEFAULT_TTL_S
from tasklock_cli.stores.failover import EPOCH_SHIFT
from tasklock_cli.stores.failover import LONGEST_TTL_S
from tasklock_cli.stores.failover import QUARANTINE_MARGIN_S
from tasklock_cli.stores.failover import RECREATED
from tasklock_cli.stores.failover import RECREATED_CHANGE

#: The epoch row's key and slot (no lock key is empty; slot -1 is a key's counter).
EPOCH_KEY = ""
EPOCH_SLOT = -2

#: The server as an epoch knows it: its system identifier (``initdb``'s; a physical
#: standby shares it) and the timeline it writes WAL on now, ``SYSTEM:TIMELINE``. The
#: timeline is read from the name of the current WAL file, which takes the new timeline
#: the moment a promotion ends (``pg_control_checkpoint()``'s lags until the next
#: checkpoint). NULL on a standby (where the WAL functions raise; the write fails anyway).
IDENTITY = """CASE WHEN pg_is_in_recovery() THEN NULL
     ELSE (SELECT system_identifier::text FROM pg_control_system()) || ':'
          || ('x' || left(pg_walfile_name(pg_current_wal_lsn()), 8))::bit(32)::integer
     END"""
#: When the server last started, in microseconds since 1970.
#: It is text, the same on every client, whatever its TimeZone.
#: A backup or disk snapshot started by crash recovery keeps the system identifier and the
#: timeline, but it is a new start.
STARTED = "floor(extract(epoch FROM pg_postmaster_start_time()) * 1000000)::bigint::text"
#: Whether the server's last start followed a clean shutdown, which loses nothing committed.
#: A start by crash recovery (a crash, an immediate shutdown, a backup or disk snapshot started
#: as it is) discards the cumulative statistics, so their reset time is then after the start;
#: a clean shutdown saves them, and the start restores their earlier reset time.
CLEAN_START = "pg_stat_get_bgwriter_stat_reset_time() < pg_postmaster_start_time()"
#: The functions the identity needs (PostgreSQL 10 or later), named when a server refuses one.
IDENTITY_FUNCTIONS = (
    "pg_walfile_name",
    "pg_current_wal_lsn",
    "pg_control_system",
    "pg_postmaster_start_time",
    "pg_stat_get_bgwriter_stat_reset_time",
)
#: ``previous`` of an epoch begun because a used table had no epoch row.
MISSING_ROW = "missing"
#: The ``identity`` an operator writes to have the next acquire start a new epoch.
NEW_EPOCH = "new-epoch"


def _max_ttl(row: str) -> str:
    """The longest TTL (s) the epoch row ``row`` records: 0 when none or no number, at most
    LONGEST_TTL_S (anyone who may write the table may write the row)."""
    field = f"{row}.holder -> 'max_ttl'"
    return (
        f"coalesce(CASE WHEN jsonb_typeof({field}) = 'number' THEN greatest(least(("
        f"{row}.holder ->> 'max_ttl')::numeric, {LONGEST_TTL_S}), 0)::float8 END, 0)"
    )


def _quarantine(max_ttl: str) -> str:
    """The quarantine's length as an interval, given the longest TTL recorded."""
    return f"make_interval(secs => greatest({max_ttl}, {DEFAULT_TTL_S}) + {QUARANTINE_MARGIN_S})"


_MAX_TTL = _max_ttl("e")
# The row was written by this server in this run of it. A row without a start (from a
# tasklock before it) is taken as this run's: its start is recorded, no epoch begins.
_SAME = (
    "(e.holder ->> 'identity' = excluded.holder ->> 'identity'"
    " AND coalesce(e.holder ->> 'started', excluded.holder ->> 'started')"
    " = excluded.holder ->> 'started')"
)
# The same server, started again after a clean shutdown (``CLEAN_START``): it lost nothing,
# so no epoch begins; its new start is recorded.
_KEPT = (
    f"({_SAME} OR (e.holder ->> 'identity' = excluded.holder ->> 'identity'"
    " AND (excluded.holder ->> 'clean_start')::boolean))"
)
_QUARANTINE = _quarantine(_MAX_TTL)
# When a new epoch's quarantine ends. The same server started by crash recovery (it may be a
# backup or snapshot of itself, without the last leases): the leases of its earlier life
# were granted before this start, so the quarantine runs from the start. Another server (a
# promoted standby): from now, its first acquire, as the old primary's last grants may have
# come up to the promotion.
_QUARANTINE_UNTIL = (
    "CASE WHEN e.holder ->> 'identity' = excluded.holder ->> 'identity'"
    " THEN least(excluded.acquired_at, to_timestamp((excluded.holder ->> 'started')::float8"
    f" / 1000000)) ELSE excluded.acquired_at END + {_QUARANTINE}"
)
# When the row is missing: the highest token in the table or its run ledger
# (``{ledger_tokens}``, the schema's ``ledger_tokens``), NULL when neither holds one (never
# used): a table whose rows were deleted while in use starts an epoch too. NULL too when the
# row is there, and then ``used`` is never scanned.
_USED = "(SELECT token FROM used WHERE NOT EXISTS (SELECT FROM era))"
# The acquire statement's look at the epoch.
# It comes after ``n``, its clock reading; %(ttl)s is the TTL asked.
# ``epoch_written`` writes the row only:
# - when the server's identity or start differs from the one recorded
#   (a new epoch: quarantine from now);
# - when the row has no start yet;
# - when the TTL is longer than any before.
# It decides on the row's latest version, so racing acquires start one epoch.
# ``epoch`` is the table's epoch as it stands: as written, else as seen when that was current.
# It is empty when the row changed since this statement's snapshot.
# That happens when another acquire started an epoch first.
# The outcome is then 'lost', and the caller runs the statement again.
EPOCH_CTES = f"""
here AS (SELECT {IDENTITY} AS identity, {STARTED} AS started, {CLEAN_START} AS clean
), era AS (
    SELECT fencing_token AS epoch, holder ->> 'identity' AS identity,
           holder ->> 'started' AS started,
           expires_at AS quarantine_until, {_max_ttl("r")} AS max_ttl
      FROM {{table}} AS r WHERE key = '{EPOCH_KEY}' AND slot = {EPOCH_SLOT}
), used AS (
    SELECT greatest(max(fencing_token), {{ledger_tokens}}) AS token
      FROM {{table}} WHERE slot <> {EPOCH_SLOT}
), epoch_written AS (
    INSERT INTO {{table}} AS e (key, slot, slot_limit, fencing_token, holder, acquired_at,
                                expires_at)
    SELECT '{EPOCH_KEY}', {EPOCH_SLOT}, 0,
           CASE WHEN {_USED} IS NULL THEN 0
                ELSE greatest(({_USED} >> {EPOCH_SHIFT}) + 1,
                              floor(extract(epoch FROM n.t))::bigint) END,
           jsonb_build_object('identity', here.identity, 'started', here.started,
                              'clean_start', here.clean, 'max_ttl', %(ttl)s::float8)
           || CASE WHEN {_USED} IS NULL THEN jsonb_build_object()
                   ELSE jsonb_build_object('previous', '{MISSING_ROW}') END,
           n.t,
           CASE WHEN {_USED} IS NOT NULL
                THEN n.t + make_interval(secs => {DEFAULT_TTL_S} + {QUARANTINE_MARGIN_S}) END
      FROM here, n
     WHERE NOT EXISTS (SELECT FROM era WHERE era.identity = here.identity
                                         AND era.started = here.started
                                         AND era.max_ttl >= %(ttl)s::float8)
    ON CONFLICT (key, slot) DO UPDATE SET
        fencing_token = CASE WHEN {_KEPT} THEN e.fencing_token
                             ELSE greatest(e.fencing_token + 1,
                                           floor(extract(epoch FROM excluded.acquired_at))::bigint)
                        END,
        acquired_at = CASE WHEN {_KEPT} THEN e.acquired_at ELSE excluded.acquired_at END,
        expires_at = CASE WHEN {_KEPT} THEN e.expires_at ELSE {_QUARANTINE_UNTIL} END,
        holder = e.holder || jsonb_build_object(
                     'identity', excluded.holder -> 'identity',
                     'started', excluded.holder -> 'started',
                     'clean_start', excluded.holder -> 'clean_start',
                     'max_ttl', greatest({_MAX_TTL}, %(ttl)s::float8))
                 || CASE WHEN {_KEPT} THEN jsonb_build_object()
                         ELSE jsonb_build_object('previous', e.holder -> 'identity',
                                                 'previous_started', e.holder -> 'started')
                    END
     WHERE e.holder ->> 'identity' IS DISTINCT FROM excluded.holder ->> 'identity'
        OR e.holder ->> 'started' IS DISTINCT FROM excluded.holder ->> 'started'
        OR {_MAX_TTL} < %(ttl)s::float8
    RETURNING fencing_token AS epoch, expires_at AS quarantine_until
), epoch AS (
    SELECT epoch, quarantine_until FROM epoch_written
    UNION ALL
    SELECT era.epoch, era.quarantine_until FROM era, here
     WHERE era.identity = here.identity AND era.started = here.started
       AND NOT EXISTS (SELECT FROM epoch_written)
), quarantine AS (
    SELECT least(quarantine_until, n.t + {_quarantine("coalesce((SELECT max_ttl FROM era), 0)")})
           AS quarantine_until
      FROM epoch, n WHERE quarantine_until > n.t
),"""
#: The least token of the statement's epoch (``epoch`` has at most one row).
FIRST_TOKEN = f"(SELECT epoch << {EPOCH_SHIFT} FROM epoch)"

# The epoch row of a new table, written with it (DDL; ``{table}`` and ``{runs}`` are
# formatted in). A table that holds rows already (from before epochs) gets its row from its
# next acquire, which starts a new epoch (the row may have been lost). A new table beside a
# run ledger that holds runs is one made again (``RECREATED``): its row names no server, so
# its first acquire starts an epoch above the ledger's tokens, with a quarantine.
EPOCH_ROW_DDL = f"""
INSERT INTO {{table}} (key, slot, slot_limit, fencing_token, holder, acquired_at)
SELECT '{EPOCH_KEY}', {EPOCH_SLOT}, 0, coalesce(ran.token >> {EPOCH_SHIFT}, 0),
       CASE WHEN ran.token IS NULL
            THEN jsonb_build_object('identity', {IDENTITY}, 'started', {STARTED})
            ELSE jsonb_build_object('identity', '{RECREATED}') END,
       clock_timestamp()
  FROM (SELECT max(fencing_token) AS token FROM {{runs}}) AS ran
 WHERE NOT pg_is_in_recovery() AND NOT EXISTS (SELECT FROM {{table}})
ON CONFLICT DO NOTHING;
"""

# ``doctor``: this server's identity and start; the replication settings and the standbys
# streaming from this server (name, state, sync state: NULL for roles without
# pg_read_all_stats); the table's epoch row with the seconds of quarantine left.
SERVER_IDENTITY = f"SELECT {IDENTITY}, {STARTED}"
REPLICATION = """
SELECT current_setting('synchronous_commit'), current_setting('synchronous_standby_names'),
       (SELECT coalesce(json_agg(json_build_array(application_name, state, sync_state)
                                 ORDER BY application_name), '[]'::json)
          FROM pg_stat_replication),
       current_setting('fsync')
"""
# (never longer than a new quarantine would be: a forged end, 'infinity' among them, is
# read as that; NULL, none recorded, stays NULL)
_QUARANTINE_LEFT = (
    "CASE WHEN expires_at IS NOT NULL THEN extract(epoch FROM least(expires_at,"
    f" clock_timestamp() + {_quarantine(_max_ttl('r'))}) - clock_timestamp())::float8 END"
)
#: A quarantine end further ahead than a new quarantine would end (someone else wrote it:
#: 1000 years, 'infinity') set to that end, so that it does end: run after an acquire met a
#: quarantine (a real one never matches).
BOUND_FORGED_QUARANTINE = f"""
UPDATE {{table}} AS r SET expires_at = clock_timestamp() + {_quarantine(_max_ttl("r"))}
 WHERE key = '{EPOCH_KEY}' AND slot = {EPOCH_SLOT}
   AND expires_at > clock_timestamp() + {_quarantine(_max_ttl("r"))}
"""
EPOCH_ROW = f"""
SELECT fencing_token, holder ->> 'identity', holder ->> 'started', holder ->> 'previous',
       holder ->> 'previous_started', {_max_ttl("r")}, {_QUARANTINE_LEFT}
  FROM {{table}} AS r WHERE key = '{EPOCH_KEY}' AND slot = {EPOCH_SLOT}
"""
#: ``Store.quarantine``: the seconds of quarantine left on the server's clock, as the
#: acquire compares them (no row, or NULL: none recorded; 0 or less: over). A read only:
#: the epoch starts with an acquire, never here.
QUARANTINE_LEFT = f"""
SELECT {_QUARANTINE_LEFT} FROM {{table}} AS r WHERE key = '{EPOCH_KEY}' AND slot = {EPOCH_SLOT}
"""

_IDENTITY_TEXT = re.compile(r"(\d{1,20}):(\d{1,10})")
_STARTED_TEXT = re.compile(r"\d{1,17}")


def describe_identity(identity: object, started: object = None) -> str:
    """``SYSTEM:TIMELINE`` (and the start) as words (the row is the table's: anything else is
    shown as unrecognised, never as it is)."""
    found = _IDENTITY_TEXT.fullmatch(identity) if isinstance(identity, str) else None
    if found is None:
        return "an unrecognised server"
    start = describe_start(started)
    return f"system {found[1]} timeline {found[2]}" + (f" started {start}" if start else "")


def describe_start(started: object) -> str | None:
    """The recorded start (microseconds since 1970, as text) as RFC 3339 UTC, else None."""
    if not isinstance(started, str) or not _STARTED_TEXT.fullmatch(started):
        return None
    try:
        moment = datetime.fromtimestamp(int(started) // 1_000_000, tz=timezone.utc)
    except (OverflowError, OSError, ValueError):
        return None
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


def describe_change(previous: object, previous_started: object, identity: object) -> str:
    """Why the epoch began, as the end of "epoch N began when ..."."""
    if previous == MISSING_ROW:
        return "the table was found without its epoch row (from before epochs, or restored)"
    if previous == NEW_EPOCH:
        return "an operator asked for a new epoch"
    if previous == RECREATED:
        return RECREATED_CHANGE
    if previous == identity and _IDENTITY_TEXT.fullmatch(str(identity)):
        since = describe_start(previous_started)
        return "the server restarted by crash recovery (a crash, or a backup or snapshot of "
        "it was started)" + (f" (it had started {since})" if since else "")
    before, now = describe_identity(previous), describe_identity(identity)
    return f"the primary changed from {before} to {now}"


#: SQLSTATEs of a server that will not run a function: no privilege, not supported (managed
#: services), no such function (before PostgreSQL 10).
_REFUSALS = ("42501", "0A000", "42883")


def refused_function(exc: BaseException) -> str | None:
    """The identity's function that the server refused to run in ``exc``, else None."""
    if getattr(exc, "sqlstate", None) not in _REFUSALS:
        return None
    text = str(exc)
    return next((name for name in IDENTITY_FUNCTIONS if name in text), None)


def refusal(name: str, text: str) -> str:
    """The one line that says the server refused ``name`` (``text``: the server's words)."""
    return (
        f"the server refuses {name}() ({text}); tasklock reads the server's identity with it "
        "to notice a failover or a restart: it needs PostgreSQL 10 or later, with EXECUTE on "
        f"{name} for this user"
    )
