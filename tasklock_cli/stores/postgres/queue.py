"""The PostgreSQL store's statements about the queues of waiters.

- The acquire statement: one statement takes a slot, or joins, keeps or leaves the
  caller's place.
- The wake-ups of the waiters a change may admit.
- The waiter's look at the key.
- The listings of the queues.

A key's queue is its live places in ``<table>_waiters``, served in ``seq`` order.
A live place's ``expires_at`` has not passed, and it is not ``superseded``.

A place's ``seq`` is a fresh number of the table's sequence, minus its priority (``run
--priority``) times ``model.PRIORITY_BAND``.
So higher priorities sort first, and arrival decides among equals; a priority-0 place's
``seq`` is the plain number an older tasklock writes.
A place taken with ``front`` gets minus a fresh number, minus ``model.FRONT_BAND``.
So it sorts ahead of every place there and every priority, the latest such place first.
An older tasklock sharing the table orders by ``seq`` alone, and so sees the same order.

``--max-waiting`` (%(max_waiting)s): a caller without a place does not join a queue of that
many places or more ('full').

Each place keeps its mode:

- a shared waiter is admitted when only shared places are ahead of it;
- an exclusive one when none is.
  With ``limit`` N, an exclusive one is admitted when fewer places are ahead of it than
  slots are free."""

from __future__ import annotations

from tasklock_cli.stores.model import FRONT_BAND
from tasklock_cli.stores.model import PRIORITY_BAND
from tasklock_cli.stores.model import WAITER_HORIZON_S
from tasklock_cli.stores.postgres.epochs import EPOCH_CTES
from tasklock_cli.stores.postgres.epochs import FIRST_TOKEN
from tasklock_cli.stores.postgres.waiting import MAX_PAYLOAD_KEY_BYTES

#: The slot of the row that keeps a key's fencing counter (never a lease).
COUNTER_SLOT = -1

#: A notification payload naming the key (md5 of a key too long for a payload).
PAYLOAD = (
    "CASE WHEN octet_length({col}) <= "
    + str(MAX_PAYLOAD_KEY_BYTES)
    + " THEN {col} ELSE md5({col}) END"
)
_NEW_EXPIRY = "n.t + make_interval(secs => %(ttl)s::float8)"
# A place runs out no later than this from now: a waiter's renewal never puts it further
# (see model.WAITER_HORIZON_S); a later one was forged, and is dead.
_HORIZON = f"make_interval(secs => {WAITER_HORIZON_S!r})"
# The places of %(key)s that count (live, not superseded), as table alias {w}.
_COUNTING = (
    "{w}.key = %(key)s AND {w}.expires_at > clock_timestamp()"
    f" AND {{w}}.expires_at <= clock_timestamp() + {_HORIZON} AND NOT {{w}}.superseded {{after}}"
)
# The places a change may admit, among those after %(seq)s (with ``after``; all without):
# the first one, and when it is shared, every shared place after it up to the first
# exclusive one. (The head alone wakes for a semaphore's slot: one release, one look.)
_ADMITTED = f"""SELECT w.seq FROM {{{{waiters}}}} AS w
 WHERE {_COUNTING.format(w="w", after="{after_w}")}
   AND NOT EXISTS (
       SELECT FROM {{{{waiters}}}} AS x
        WHERE {_COUNTING.format(w="x", after="{after_x}")}
          AND x.seq < w.seq AND (w.mode <> 'shared' OR x.mode <> 'shared'))"""
ADMITTED_RUN = _ADMITTED.format(after_w="", after_x="")
_ADMITTED_AFTER = _ADMITTED.format(
    after_w="AND w.seq > %(seq)s::bigint", after_x="AND x.seq > %(seq)s::bigint"
)
_WAITER = "chr(31) || 'waiter:' || {seq}"
# What a release notifies, once it freed a slot: each place of the admitted run by name, or
# the key (every waiter of it looks) when nobody queues. (For ``admitted`` and ``wake``.)
WAKE_CTES = f"""admitted AS ({ADMITTED_RUN}
), wake AS (
    SELECT {_WAITER.format(seq="seq")} AS payload FROM admitted
    UNION ALL
    SELECT {PAYLOAD.format(col="%(key)s")} WHERE NOT EXISTS (SELECT FROM admitted)
)"""
# A waiter that leaves its place wakes those after it whom that may admit.
LEAVE_QUEUE = f"""
WITH gone AS (DELETE FROM {{waiters}} WHERE key = %(key)s AND seq = %(seq)s RETURNING seq),
admitted AS ({_ADMITTED_AFTER})
SELECT pg_notify(%(channel)s, {_WAITER.format(seq="admitted.seq")}) FROM gone, admitted
"""
WAITERS = f"""
SELECT holder, since, mode FROM {{waiters}}
 WHERE key = %(key)s AND expires_at > clock_timestamp()
   AND expires_at <= clock_timestamp() + {_HORIZON} AND NOT superseded ORDER BY seq
"""
# Places in queues that ran out (their waiters crashed) and no acquire of their key cleared.
SWEEP_WAITERS = (
    "DELETE FROM {waiters} WHERE expires_at <= clock_timestamp()"
    f" OR expires_at > clock_timestamp() + {_HORIZON}"
)
WAITING_COUNTS = f"""
SELECT key, count(*) FROM {{waiters}}
 WHERE expires_at > clock_timestamp() AND expires_at <= clock_timestamp() + {_HORIZON}
   AND NOT superseded
   AND key >= %(prefix)s COLLATE "C" AND left(key, char_length(%(prefix)s)) = %(prefix)s
 GROUP BY key
"""

# One statement, one clock reading: the takeover test and the new times agree exactly.
# Acquirers of a key queue on its counter row (slot -1).
# The upsert of ``counter`` locks that row.
# It bumps it only when it still holds what this statement's snapshot saw.
# When it does not, another acquire committed since the snapshot.
# What ``seen`` shows of the slots may then be out of date.
# So nothing is taken and the outcome is 'lost': the caller runs the statement again, on a
# new snapshot.
# A slot row is only ever taken when its latest version is free (ON CONFLICT ... WHERE).
# So a stale snapshot costs a retry, never a second holder.
# Outcomes:
# - 'taken', with the lease;
# - 'mismatch', with the live holders' limit;
# - 'lost';
# - 'superseded';
# - 'quarantine', with the milliseconds left in the token's column;
# - no row, when every slot is held.
#
# Failover epochs (see ``epochs``):
# - The statement first reads this server's identity and the table's epoch row.
# - It starts a new epoch when the identity changed.
# - Nothing is taken while the epoch's quarantine lasts ('quarantine').
# - Nothing is taken when the epoch row changed since the snapshot ('lost').
# - A token is at least the epoch's first token, ``epoch << 30``.
#
# Modes:
# - A shared caller (%(shared)s, limit 1) takes the lowest slot no live lease holds.
#   It does so when no live lease is exclusive and only shared places are ahead of its own.
# - An exclusive caller takes a free slot of 0..limit-1.
#   It does so when fewer places are ahead of it than slots are free.
#   When it has no place, all places count as ahead of it.
#   With limit 1, that means when the key has no live lease at all.
#
# The queue, with %(queue)s:
# - A caller that gets nothing joins the queue, at its end or in front with %(front)s.
#   Or it keeps its place.
#   Either way there is one more row: 'queued', with the place's seq in the token's column.
# - A caller that gets a slot leaves its place.
# - Places that ran out are cleared.
#
# Superseding:
# - A caller that joins with %(supersede)s marks superseded every other live place of the
#   key taken with supersede.
#   Each superseded owner is notified by name ('woken' rows).
# - A caller whose own place was marked superseded takes nothing and leaves the queue.
#   It gets 'superseded'.
#   The admitted run is woken, since its place may have held them up.
# - Two supersede callers joining at the same instant do not see each other's place.
#   Both wait, and the next one to join supersedes both.
# - A superseded place that runs out before its owner comes back is cleared like any other.
#   The marker goes with it.
#   Its owner then joins again as a newcomer.
_ACQUIRE_LOOK = (
    """
WITH n AS (SELECT clock_timestamp() AS t),"""
    + EPOCH_CTES
    + """
seen AS (
    SELECT slot, slot_limit, fencing_token, owner_token, expires_at, mode
      FROM {table} WHERE key = %(key)s
), live AS (
    -- (a lease without an expiry, which someone else wrote, is never judged expired)
    SELECT s.slot, s.slot_limit, s.mode FROM seen AS s, n
     WHERE s.slot >= 0 AND s.owner_token IS NOT NULL
       AND (s.expires_at > n.t OR s.expires_at IS NULL)
), mine AS (
    -- our own lease, live: a retry after a lost reply. One that ran out is never revived
    -- (another mode may hold the key since; a promoted standby's quarantine applies)
    SELECT s.slot FROM seen AS s, n
     WHERE s.slot >= 0 AND s.owner_token = %(owner)s AND s.expires_at > n.t
), queued AS (
    SELECT w.seq, w.owner_token, w.mode FROM {waiters} AS w, n
     WHERE w.key = %(key)s AND w.expires_at > n.t AND w.expires_at <= n.t + {_HORIZON}
       AND NOT w.superseded
), gone AS (
    SELECT seq FROM {waiters} WHERE key = %(key)s AND owner_token = %(owner)s AND superseded
), place AS (
    SELECT seq FROM queued WHERE owner_token = %(owner)s
), ahead AS (
    SELECT count(*) AS waiters, count(*) FILTER (WHERE mode <> 'shared') AS exclusive
      FROM queued WHERE seq < coalesce((SELECT seq FROM place), 9223372036854775807)
), free AS (
    SELECT g AS slot
      FROM generate_series(0, CASE WHEN %(shared)s THEN (SELECT count(*) FROM live)::integer
                                   ELSE %(limit)s::integer - 1 END) AS g
     WHERE g NOT IN (SELECT slot FROM live)
       AND NOT EXISTS (SELECT FROM mine) AND NOT EXISTS (SELECT FROM gone)
       AND NOT EXISTS (SELECT FROM live WHERE slot_limit <> %(limit)s::integer)
       AND EXISTS (SELECT FROM epoch) AND NOT EXISTS (SELECT FROM quarantine)
       AND CASE WHEN %(shared)s
                THEN NOT EXISTS (SELECT FROM live WHERE mode <> 'shared')
                     AND (SELECT exclusive FROM ahead) = 0
                ELSE (SELECT waiters FROM ahead) < %(limit)s::integer - (SELECT count(*) FROM live)
           END
     ORDER BY g LIMIT 1
),"""
)
_ACQUIRE_TAKE = f"""
counter AS (
    INSERT INTO {{table}} AS c (key, slot, slot_limit, fencing_token)
    SELECT %(key)s, {COUNTER_SLOT}, 0,
           greatest(coalesce((SELECT max(fencing_token) FROM seen), 0) + 1, {FIRST_TOKEN})
      FROM free
    ON CONFLICT (key, slot) DO UPDATE SET fencing_token = greatest(c.fencing_token + 1,
                                                                   {FIRST_TOKEN})
        -- (a counter below 0, which someone else wrote, stops the statement: 22012; not a
        -- constant 1 / 0, which the planner would fold, failing every statement)
        + CASE WHEN c.fencing_token < 0 THEN 1 / (c.fencing_token * 0) ELSE 0 END
     WHERE c.fencing_token = (SELECT fencing_token FROM seen WHERE slot = {COUNTER_SLOT})
    RETURNING fencing_token
), claimed AS (
    INSERT INTO {{table}} AS l (key, slot, slot_limit, fencing_token, owner_token, holder,
                                acquired_at, expires_at, mode)
    SELECT %(key)s, free.slot, %(limit)s::integer, counter.fencing_token, %(owner)s,
           %(holder)s, n.t, {_NEW_EXPIRY}, %(mode)s
      FROM free, counter, n
    ON CONFLICT (key, slot) DO UPDATE SET
        slot_limit = excluded.slot_limit,
        fencing_token = excluded.fencing_token,
        owner_token = excluded.owner_token,
        holder = excluded.holder,
        acquired_at = excluded.acquired_at,
        expires_at = excluded.expires_at,
        mode = excluded.mode
     WHERE l.owner_token IS NULL OR l.expires_at <= excluded.acquired_at
    RETURNING slot, slot_limit, fencing_token, acquired_at, expires_at, mode
), retried AS (
    UPDATE {{table}} AS l SET holder = %(holder)s, expires_at = {_NEW_EXPIRY}
      FROM mine, n
     WHERE l.key = %(key)s AND l.slot = mine.slot AND l.owner_token = %(owner)s
       AND l.expires_at > n.t
    RETURNING l.slot, l.slot_limit, l.fencing_token, l.acquired_at, l.expires_at, l.mode
),"""
_ACQUIRE_QUEUE = """
queue_full AS (
    -- --max-waiting: a caller with no place does not join a queue that long
    SELECT FROM n
     WHERE %(queue)s AND %(max_waiting)s::bigint IS NOT NULL AND NOT EXISTS (SELECT FROM place)
       AND NOT EXISTS (SELECT FROM claimed) AND NOT EXISTS (SELECT FROM retried)
       AND NOT EXISTS (SELECT FROM gone)
       AND (SELECT count(*) FROM queued) >= %(max_waiting)s::bigint
), joined AS (
    INSERT INTO {waiters} AS w
           (seq, key, owner_token, holder, mode, supersede, since, expires_at)
    SELECT CASE WHEN %(front)s
                THEN -nextval(pg_get_serial_sequence({waiters_name}, 'seq')) - {_FRONT_BAND}
                ELSE nextval(pg_get_serial_sequence({waiters_name}, 'seq'))
                     - %(priority)s::bigint * {_PRIORITY_BAND} END,
           %(key)s, %(owner)s, %(holder)s, %(mode)s, %(supersede)s, n.t,
           n.t + make_interval(secs => %(wttl)s::float8)
      FROM n
     WHERE %(queue)s AND NOT EXISTS (SELECT FROM claimed) AND NOT EXISTS (SELECT FROM retried)
       AND NOT EXISTS (SELECT FROM gone) AND NOT EXISTS (SELECT FROM queue_full)
    ON CONFLICT (key, owner_token) DO UPDATE SET
        expires_at = excluded.expires_at,
        -- a place that ran out (its waiter stalled) goes to the end of the queue (or the
        -- front, with front), as a newcomer's
        seq = CASE WHEN w.expires_at > excluded.since THEN w.seq ELSE excluded.seq END,
        since = CASE WHEN w.expires_at > excluded.since THEN w.since ELSE excluded.since END,
        mode = excluded.mode,
        supersede = excluded.supersede
    RETURNING seq
), superseding AS (
    UPDATE {waiters} AS w SET superseded = true FROM n
     WHERE %(supersede)s AND NOT EXISTS (SELECT FROM place) AND EXISTS (SELECT FROM joined)
       AND w.key = %(key)s AND w.supersede AND NOT w.superseded AND w.expires_at > n.t
       AND w.expires_at <= n.t + {_HORIZON}
       AND w.owner_token <> %(owner)s
    RETURNING w.seq
), cleared_places AS (
    DELETE FROM {waiters} AS w USING n
     WHERE w.key = %(key)s
       AND CASE WHEN w.owner_token = %(owner)s
                THEN EXISTS (SELECT FROM claimed) OR EXISTS (SELECT FROM retried)
                     OR EXISTS (SELECT FROM gone) OR NOT %(queue)s
                ELSE w.expires_at <= n.t OR w.expires_at > n.t + {_HORIZON} END
    RETURNING 1
), admitted AS (
    SELECT seq FROM ({admitted}) AS a WHERE EXISTS (SELECT FROM gone)
)"""
_ACQUIRE_OUTCOME = f"""
SELECT r.* FROM (
    SELECT 'taken' AS outcome, slot, slot_limit, fencing_token, acquired_at, expires_at, mode
      FROM claimed
    UNION ALL
    SELECT 'taken', slot, slot_limit, fencing_token, acquired_at, expires_at, mode FROM retried
    UNION ALL
    SELECT CASE WHEN h.held IS NULL OR EXISTS (SELECT FROM mine) THEN 'lost' ELSE 'mismatch' END,
           NULL, h.held, NULL, NULL, NULL, NULL
      FROM (SELECT max(slot_limit) AS held FROM live
             WHERE slot_limit <> %(limit)s::integer) AS h
     WHERE NOT EXISTS (SELECT FROM claimed) AND NOT EXISTS (SELECT FROM retried)
       AND (h.held IS NOT NULL OR EXISTS (SELECT FROM free) OR EXISTS (SELECT FROM mine))
    UNION ALL
    SELECT CASE WHEN EXISTS (SELECT FROM epoch) THEN 'quarantine' ELSE 'lost' END, NULL, NULL,
           (SELECT ceil(extract(epoch FROM quarantine_until - n.t) * 1000)::bigint
              FROM quarantine), NULL, NULL, NULL
      FROM n
     WHERE NOT EXISTS (SELECT FROM claimed) AND NOT EXISTS (SELECT FROM retried)
       AND (EXISTS (SELECT FROM quarantine) OR NOT EXISTS (SELECT FROM epoch))
    UNION ALL
    SELECT 'queued', NULL, NULL, seq, NULL, NULL, NULL FROM joined
    UNION ALL
    SELECT 'full', NULL, NULL, NULL, NULL, NULL, NULL FROM queue_full
    UNION ALL
    SELECT 'superseded', NULL, NULL, NULL, NULL, NULL, NULL FROM gone
    UNION ALL
    SELECT 'woken' || pg_notify(%(channel)s, {_WAITER.format(seq="seq")})::text,
           NULL, NULL, NULL, NULL, NULL, NULL
      FROM (SELECT seq FROM superseding UNION ALL SELECT seq FROM admitted) AS s
) AS r
"""
ACQUIRE = (
    _ACQUIRE_LOOK
    + _ACQUIRE_TAKE
    + _ACQUIRE_QUEUE.replace("{admitted}", ADMITTED_RUN)
    + _ACQUIRE_OUTCOME
).replace("{_HORIZON}", _HORIZON)
ACQUIRE = ACQUIRE.replace("{_FRONT_BAND}", str(FRONT_BAND)).replace(
    "{_PRIORITY_BAND}", str(PRIORITY_BAND)
)

#: ACQUIRE on a connection whose set-up has not looked the table's oid up yet: the release
#: channel it notifies is named from the oid as the statement finds it.
ACQUIRE_IN_BAND = ACQUIRE.replace(
    "%(channel)s", "('tasklock_released_' || {table_name}::regclass::oid)"
)

# Whether the key is free for us, or for how long it is not.
# "Us" is our place %(seq)s (NULL when we have none) and its mode.
# The statement answers:
# - the seconds until the first live lease in our way runs out on the server's clock,
#   else NULL.
#   For a shared place, a lease in our way is an exclusive one.
#   For an exclusive place, it is any lease, when the key is full;
# - the key's live leases and their limit;
# - the places ahead of ours, and how many of them are exclusive.
# Its counter row is locked FOR SHARE first: that waits for an acquire still in flight.
# The first column tells whether the counter changed since this statement's snapshot.
# If so, its latest version is another, and the slots as read here are out of date.
# The caller then asks again.
TIME_UNTIL_FREE = f"""
WITH latest AS (
    SELECT xmin::text AS version FROM {{table}}
     WHERE key = %(key)s AND slot = {COUNTER_SLOT} FOR SHARE
), live AS (
    SELECT slot_limit, expires_at, mode FROM {{table}}
     WHERE key = %(key)s AND slot >= 0 AND owner_token IS NOT NULL
       AND expires_at > clock_timestamp()
), me AS (
    SELECT coalesce((SELECT mode FROM {{waiters}} WHERE seq = %(seq)s::bigint), 'exclusive')
           AS mode
), ahead AS (
    SELECT count(*) AS waiters, count(*) FILTER (WHERE mode <> 'shared') AS exclusive
      FROM {{waiters}} AS w
     WHERE {_COUNTING.format(w="w", after="")}
       AND seq < coalesce(%(seq)s::bigint, 9223372036854775807)
)
SELECT (SELECT version FROM latest) IS DISTINCT FROM
       (SELECT xmin::text FROM {{table}} WHERE key = %(key)s AND slot = {COUNTER_SLOT}),
       CASE WHEN (SELECT mode FROM me) = 'shared'
            THEN extract(epoch FROM min(expires_at) FILTER (WHERE mode <> 'shared')
                                    - clock_timestamp())::float8
            WHEN count(*) >= max(slot_limit)
            THEN extract(epoch FROM min(expires_at) - clock_timestamp())::float8 END,
       count(*), max(slot_limit), (SELECT waiters FROM ahead), (SELECT exclusive FROM ahead),
       (SELECT mode FROM me)
  FROM live
"""
