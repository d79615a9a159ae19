"""Failover epochs: the acquire statement's check that the server is still the primary
whose writes the table's rows were made under, and the fencing tokens of a new epoch
(the argument is in the package's docstring).

The table's epoch row is a reserved row of the lease table (key ``''``, which no lock
has, slot ``EPOCH_SLOT``; no owner, so no listing, sweep or older tasklock sees it):

- ``holder->>'identity'``: the server it was written on, ``SYSTEM:TIMELINE`` (see
  ``IDENTITY``);
- ``fencing_token``: the epoch, 0 until the first change of primary, then
  ``max(previous + 1, the server's clock in whole seconds)``;
- ``expires_at``: ``quarantine_until``, before which no acquire in the table succeeds
  (it answers as a held key does: the caller waits or conflicts);
- ``holder->>'max_ttl'``: the longest lease TTL (s) an acquire in the table has asked for;
- ``acquired_at``: when the epoch began; ``holder->>'previous'``: the identity before it.

The row is created with the table (one transaction, so a standby that has the table has
the row); an acquire creates it, at epoch 0, on a table from before epochs.
"""

from __future__ import annotations

import re

#: The epoch row's key and slot (no lock key is empty; slot -1 is a key's counter).
EPOCH_KEY = ""
EPOCH_SLOT = -2
#: Tokens of epoch ``e`` start at ``e << EPOCH_SHIFT``.
EPOCH_SHIFT = 30
#: The quarantine is never shorter than this (s) plus the margin: the default ``--ttl``,
#: for leases whose TTL the new primary's row does not know of.
DEFAULT_TTL_S = 30.0
#: Added to the quarantine (s): a holder's send time before the server's clock, the
#: clocks of two servers.
QUARANTINE_MARGIN_S = 2.0

#: The server as an epoch knows it: its system identifier (``initdb``'s; a physical
#: standby shares it) and the timeline it writes WAL on now, ``SYSTEM:TIMELINE``. The
#: timeline is read from the name of the current WAL file, which takes the new timeline
#: the moment a promotion ends (``pg_control_checkpoint()``'s lags until the next
#: checkpoint). NULL on a standby (where the WAL functions raise; the write fails anyway).
IDENTITY = """CASE WHEN pg_is_in_recovery() THEN NULL
     ELSE (SELECT system_identifier::text FROM pg_control_system()) || ':'
          || ('x' || left(pg_walfile_name(pg_current_wal_lsn()), 8))::bit(32)::integer
     END"""

_MAX_TTL = "coalesce((e.holder ->> 'max_ttl')::float8, 0)"
_SAME = "e.holder ->> 'identity' = excluded.holder ->> 'identity'"
# The acquire statement's look at the epoch (after ``n``, its clock reading; %(ttl)s is the
# TTL asked). ``epoch_written`` writes the row only when the identity differs from the one
# recorded (a new epoch: quarantine from now) or the TTL is longer than any before; it
# decides on the row's latest version, so racing acquires start one epoch. ``epoch`` is
# the table's epoch as it stands: as written, else as seen when that was current. It is
# empty when the row changed since this statement's snapshot (another acquire started an
# epoch first): the outcome is then 'lost', and the caller runs the statement again.
EPOCH_CTES = f"""
here AS (SELECT {IDENTITY} AS identity
), era AS (
    SELECT fencing_token AS epoch, holder ->> 'identity' AS identity,
           expires_at AS quarantine_until, (holder ->> 'max_ttl')::float8 AS max_ttl
      FROM {{table}} WHERE key = '{EPOCH_KEY}' AND slot = {EPOCH_SLOT}
), epoch_written AS (
    INSERT INTO {{table}} AS e (key, slot, slot_limit, fencing_token, holder, acquired_at)
    SELECT '{EPOCH_KEY}', {EPOCH_SLOT}, 0, 0,
           jsonb_build_object('identity', here.identity, 'max_ttl', %(ttl)s::float8), n.t
      FROM here, n
     WHERE NOT EXISTS (SELECT FROM era WHERE era.identity = here.identity
                                         AND era.max_ttl >= %(ttl)s::float8)
    ON CONFLICT (key, slot) DO UPDATE SET
        fencing_token = CASE WHEN {_SAME} THEN e.fencing_token
                             ELSE greatest(e.fencing_token + 1,
                                           floor(extract(epoch FROM excluded.acquired_at))::bigint)
                        END,
        acquired_at = CASE WHEN {_SAME} THEN e.acquired_at ELSE excluded.acquired_at END,
        expires_at = CASE WHEN {_SAME} THEN e.expires_at
                          ELSE excluded.acquired_at + make_interval(
                              secs => greatest({_MAX_TTL}, {DEFAULT_TTL_S}) + {QUARANTINE_MARGIN_S})
                     END,
        holder = e.holder || jsonb_build_object(
                     'identity', excluded.holder -> 'identity',
                     'max_ttl', greatest({_MAX_TTL}, %(ttl)s::float8))
                 || CASE WHEN {_SAME} THEN jsonb_build_object()
                         ELSE jsonb_build_object('previous', e.holder -> 'identity') END
     WHERE e.holder ->> 'identity' IS DISTINCT FROM excluded.holder ->> 'identity'
        OR {_MAX_TTL} < %(ttl)s::float8
    RETURNING fencing_token AS epoch, expires_at AS quarantine_until
), epoch AS (
    SELECT epoch, quarantine_until FROM epoch_written
    UNION ALL
    SELECT era.epoch, era.quarantine_until FROM era, here
     WHERE era.identity = here.identity AND NOT EXISTS (SELECT FROM epoch_written)
), quarantine AS (
    SELECT quarantine_until FROM epoch, n WHERE quarantine_until > n.t
),"""
#: The least token of the statement's epoch (``epoch`` has at most one row).
FIRST_TOKEN = f"(SELECT epoch << {EPOCH_SHIFT} FROM epoch)"

# The epoch row of a new table, written with it (DDL; ``{table}`` is formatted in).
EPOCH_ROW_DDL = f"""
INSERT INTO {{table}} (key, slot, slot_limit, fencing_token, holder, acquired_at)
SELECT '{EPOCH_KEY}', {EPOCH_SLOT}, 0, 0, jsonb_build_object('identity', {IDENTITY}),
       clock_timestamp()
 WHERE NOT pg_is_in_recovery()
ON CONFLICT DO NOTHING;
"""

# ``doctor``: this server's identity, the epoch row (NULLs when none; %s: the table, as
# to_regclass reads it), the seconds of quarantine left, the replication settings and the
# standbys streaming from this server (name, state, sync state: NULL for roles without
# pg_read_all_stats).
DOCTOR = f"""
SELECT {IDENTITY}, current_setting('synchronous_commit'),
       current_setting('synchronous_standby_names'),
       (SELECT coalesce(json_agg(json_build_array(application_name, state, sync_state)
                                 ORDER BY application_name), '[]'::json)
          FROM pg_stat_replication)
"""
EPOCH_ROW = f"""
SELECT fencing_token, holder ->> 'identity', holder ->> 'previous',
       (holder ->> 'max_ttl')::float8,
       extract(epoch FROM expires_at - clock_timestamp())::float8
  FROM {{table}} WHERE key = '{EPOCH_KEY}' AND slot = {EPOCH_SLOT}
"""

_IDENTITY_TEXT = re.compile(r"(\d{1,20}):(\d{1,10})")


def describe_identity(identity: object) -> str:
    """``SYSTEM:TIMELINE`` as words (the row is the table's: anything else is shown as
    unrecognised, never as it is)."""
    found = _IDENTITY_TEXT.fullmatch(identity) if isinstance(identity, str) else None
    if found is None:
        return "an unrecognised server"
    return f"system {found[1]} timeline {found[2]}"


def timeline_of(identity: object) -> str | None:
    found = _IDENTITY_TEXT.fullmatch(identity) if isinstance(identity, str) else None
    return found[2] if found else None


def quarantine_length(max_ttl: float | None) -> float:
    """How long a new epoch's quarantine lasts, given the longest TTL recorded."""
    return max(max_ttl or 0.0, DEFAULT_TTL_S) + QUARANTINE_MARGIN_S
