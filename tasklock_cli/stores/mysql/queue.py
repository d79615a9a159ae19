"""The MySQL/MariaDB store's acquire procedure, and its statements about the queues.

In one call, the acquire procedure takes a slot, or joins, keeps or leaves the caller's
place in the key's queue.

A key's queue is its live places in ``<table>_waiters``, served in ``ord`` order.

- A live place's ``expires_at`` has neither passed nor gone beyond the waiter horizon.
- A live place is not ``superseded``.
- ``ord`` is the place's ``seq``, an AUTO_INCREMENT, minus its priority (``run
  --priority``) times ``model.PRIORITY_BAND``: higher priorities first, then arrival.
  A priority-0 place's ``ord`` is its ``seq``, as an older tasklock writes it.
- For a place taken with ``front``, ``ord`` is minus the ``seq``, minus
  ``model.FRONT_BAND``.
  So those places sort ahead of every other and every priority, the latest first.
- ``--max-waiting`` (``p_max_waiting``): a caller without a place does not join a queue of
  that many places or more (outcome 'full').

Each place keeps its mode:

- a shared waiter is admitted when only shared places are ahead of it;
- an exclusive one when none is.
  With ``limit`` N, an exclusive one is admitted when fewer places are ahead of it than
  slots are free.

Acquirers of a key queue on its counter row (slot -1, never a lease).
The procedure creates or locks that row first.
So everything it reads after that is the key's latest state.
Nothing changes that state before COMMIT: no lost races, no retries.

The server's clock is read then, once, with ``SYSDATE(6)``.
That is the time of the call.
``NOW(6)`` would be the time of the statement's start.
Inside a CALL that waited for the row lock, that would be stale.
Every time the procedure writes derives from that one reading."""

from __future__ import annotations

from tasklock_cli.stores.failover import MAX_EPOCH
from tasklock_cli.stores.model import FRONT_BAND
from tasklock_cli.stores.model import MAX_FENCING_TOKEN
from tasklock_cli.stores.model import PRIORITY_BAND
from tasklock_cli.stores.model import WAITER_HORIZON_S
from tasklock_cli.stores.mysql.epochs import EPOCH_STEPS
from tasklock_cli.stores.mysql.epochs import FIRST_TOKEN

#: A place's ``ord`` when it has none in front: later than every place.
_LAST = "9223372036854775807"
#: A place runs out no later than this from now: a waiter's renewal never puts it further
#: (see model.WAITER_HORIZON_S); a later one was forged, and is dead.
_HORIZON = f"INTERVAL {int(WAITER_HORIZON_S * 1_000_000)} MICROSECOND"
# The places that count (live, within the horizon), as of ``{now}``, table alias ``{w}``.
_COUNTS = "{w}expires_at > {now} AND {w}expires_at <= {now} + " + _HORIZON

# The outcome row's columns:
# - outcome: 'taken', 'none', 'queued', 'full', 'mismatch', 'superseded', 'exhausted' (the key's
#   counter is at 2**63-1) or 'unreadable' (below 0: someone else wrote it);
# - slot;
# - slot_limit: with 'mismatch', the live holders';
# - fencing token, acquired_at, expires_at, mode;
# - the place's seq, with 'queued';
# - the milliseconds left of a failover quarantine, NULL when none.
#   No slot is taken meanwhile (see ``epochs``).
#   A retry keeps the live lease it has.
ACQUIRE_BODY = f"""\
BEGIN
    DECLARE v_now DATETIME(6);
    DECLARE v_outcome VARCHAR(16) DEFAULT 'none';
    DECLARE v_slot INT;
    DECLARE v_limit INT;
    DECLARE v_token BIGINT;
    DECLARE v_acquired DATETIME(6);
    DECLARE v_expires DATETIME(6);
    DECLARE v_mode VARCHAR(16);
    DECLARE v_place BIGINT;
    DECLARE v_seq BIGINT;
    DECLARE v_live INT;
    DECLARE v_live_exclusive INT;
    DECLARE v_other_limit INT;
    DECLARE v_ahead INT;
    DECLARE v_ahead_exclusive INT;
    DECLARE v_bound INT;
    DECLARE v_superseding BOOLEAN DEFAULT FALSE;
    DECLARE v_identity VARCHAR(400);
    DECLARE v_era TEXT;
    DECLARE v_epoch BIGINT;
    DECLARE v_max_ttl DOUBLE;
    DECLARE v_until DATETIME(6);
    DECLARE v_quarantine BIGINT;
    DECLARE CONTINUE HANDLER FOR NOT FOUND BEGIN END;
    DECLARE EXIT HANDLER FOR SQLEXCEPTION BEGIN ROLLBACK; RESIGNAL; END;
    START TRANSACTION;
    INSERT INTO `{{table}}` (`key`, slot, slot_limit, fencing_token) VALUES (p_key, -1, 0, 0)
        ON DUPLICATE KEY UPDATE fencing_token = fencing_token;
    SET v_now = SYSDATE(6);
{EPOCH_STEPS}
    DELETE FROM `{{table}}_waiters`
     WHERE `key` = p_key AND (expires_at <= v_now OR expires_at > v_now + {_HORIZON});
    IF EXISTS (SELECT 1 FROM `{{table}}_waiters`
                WHERE `key` = p_key AND owner_token = p_owner AND superseded) THEN
        DELETE FROM `{{table}}_waiters` WHERE `key` = p_key AND owner_token = p_owner;
        SET v_outcome = 'superseded', v_superseding = TRUE;
    ELSE
        SELECT slot, slot_limit, fencing_token, acquired_at, mode
          INTO v_slot, v_limit, v_token, v_acquired, v_mode
          FROM `{{table}}` WHERE `key` = p_key AND slot >= 0 AND owner_token = p_owner
                            AND expires_at > v_now LIMIT 1 FOR UPDATE;
        -- ours already and live: a retry after a lost reply. One that ran out is never
        -- revived (another mode may hold the key since; a failover's quarantine applies)
        IF v_token IS NOT NULL THEN
            SET v_expires = v_now + INTERVAL ROUND(p_ttl * 1000000) MICROSECOND;
            UPDATE `{{table}}` SET holder = p_holder, expires_at = v_expires
             WHERE `key` = p_key AND slot = v_slot AND owner_token = p_owner;
            SET v_outcome = 'taken';
        ELSE
            SELECT COUNT(*), COALESCE(SUM(mode <> 'shared'), 0),
                   MAX(IF(slot_limit <> p_limit, slot_limit, NULL))
              INTO v_live, v_live_exclusive, v_other_limit
              FROM `{{table}}` WHERE `key` = p_key AND slot >= 0 AND owner_token IS NOT NULL
                                AND expires_at > v_now;
            SET v_place = (SELECT ord FROM `{{table}}_waiters`
                            WHERE `key` = p_key AND owner_token = p_owner);
            SELECT COUNT(*), COALESCE(SUM(mode <> 'shared'), 0) INTO v_ahead, v_ahead_exclusive
              FROM `{{table}}_waiters`
             WHERE `key` = p_key AND NOT superseded AND ord < COALESCE(v_place, {_LAST});
            IF v_other_limit IS NOT NULL THEN
                SET v_outcome = 'mismatch', v_limit = v_other_limit;
            ELSEIF v_quarantine IS NOT NULL THEN
                SET v_outcome = 'none';  -- nothing is taken until the quarantine ends
            ELSEIF (p_mode = 'shared' AND v_live_exclusive = 0 AND v_ahead_exclusive = 0)
                OR (p_mode <> 'shared' AND v_ahead < p_limit - v_live) THEN
                SET v_bound = IF(p_mode = 'shared', v_live, p_limit - 1), v_slot = 0;
                WHILE v_slot < v_bound AND EXISTS (
                        SELECT 1 FROM `{{table}}` WHERE `key` = p_key AND slot = v_slot
                           AND owner_token IS NOT NULL AND expires_at > v_now) DO
                    SET v_slot = v_slot + 1;
                END WHILE;
                SET v_token = (SELECT MAX(fencing_token) FROM `{{table}}` WHERE `key` = p_key);
            END IF;
            IF v_outcome = 'none' AND v_token < 0 THEN  -- someone else wrote it
                SET v_outcome = 'unreadable', v_token = NULL;
            ELSEIF v_outcome = 'none' AND v_token IS NOT NULL
               AND (v_token >= {MAX_FENCING_TOKEN} OR v_epoch > {MAX_EPOCH}) THEN
                SET v_outcome = 'exhausted', v_token = NULL;
            ELSEIF v_outcome = 'none' AND v_token IS NOT NULL THEN
                SET v_token = GREATEST(v_token + 1, {FIRST_TOKEN});
                UPDATE `{{table}}` SET fencing_token = v_token WHERE `key` = p_key AND slot = -1;
                SET v_acquired = v_now, v_limit = p_limit, v_mode = p_mode,
                    v_expires = v_now + INTERVAL ROUND(p_ttl * 1000000) MICROSECOND;
                INSERT INTO `{{table}}` (`key`, slot, slot_limit, fencing_token, owner_token,
                                        holder, acquired_at, expires_at, mode, broken_by)
                VALUES (p_key, v_slot, p_limit, v_token, p_owner, p_holder, v_now, v_expires,
                        p_mode, NULL)
                ON DUPLICATE KEY UPDATE slot_limit = p_limit, fencing_token = v_token,
                    owner_token = p_owner, holder = p_holder, acquired_at = v_now,
                    expires_at = v_expires, mode = p_mode, broken_by = NULL;
                SET v_outcome = 'taken';
            END IF;
        END IF;
        IF v_outcome = 'taken' OR NOT p_queue THEN
            DELETE FROM `{{table}}_waiters` WHERE `key` = p_key AND owner_token = p_owner;
        ELSEIF v_outcome = 'none' AND v_place IS NOT NULL THEN
            UPDATE `{{table}}_waiters`
               SET expires_at = v_now + INTERVAL ROUND(p_wttl * 1000000) MICROSECOND,
                   holder = p_holder, mode = p_mode, supersede = p_supersede
             WHERE `key` = p_key AND owner_token = p_owner;
            SET v_seq = (SELECT seq FROM `{{table}}_waiters`
                          WHERE `key` = p_key AND owner_token = p_owner);
            SET v_outcome = 'queued';
        ELSEIF v_outcome = 'none' AND p_max_waiting IS NOT NULL
           AND (SELECT COUNT(*) FROM `{{table}}_waiters`
                 WHERE `key` = p_key AND NOT superseded) >= p_max_waiting THEN
            SET v_outcome = 'full';
        ELSEIF v_outcome = 'none' THEN
            INSERT INTO `{{table}}_waiters`
                   (`key`, owner_token, holder, mode, supersede, since, expires_at)
            VALUES (p_key, p_owner, p_holder, p_mode, p_supersede, v_now,
                    v_now + INTERVAL ROUND(p_wttl * 1000000) MICROSECOND);
            SET v_seq = LAST_INSERT_ID();
            UPDATE `{{table}}_waiters`
               SET ord = IF(p_front, -v_seq - {FRONT_BAND}, v_seq - p_priority * {PRIORITY_BAND})
             WHERE seq = v_seq;
            IF p_supersede THEN
                UPDATE `{{table}}_waiters` SET superseded = TRUE
                 WHERE `key` = p_key AND supersede AND NOT superseded AND seq <> v_seq;
                SET v_superseding = ROW_COUNT() > 0;
            END IF;
            SET v_outcome = 'queued';
        END IF;
    END IF;
    COMMIT;
    IF v_superseding THEN  -- the superseded leave at once; one that left may admit others
        CALL `{{table}}_wake_queue`(p_key, v_outcome <> 'superseded');
    END IF;
    SELECT v_outcome, v_slot, v_limit, v_token, v_acquired, v_expires, v_mode, v_seq,
           v_quarantine;
END"""


def break_lock_name(database: str, table: str, key: str, token: int) -> str:
    """The named lock a holder's break watch takes for its lease (at most 64 characters);
    ``WAKE_BODY`` computes the same name on the server. (hashlib, OpenSSL's libcrypto, is
    imported here: a run that never watches for a break does without its ~11 M
    instructions.)"""
    import hashlib

    digest = hashlib.sha1(f"{database}.{table}:".encode() + key.encode()).hexdigest()[:32]
    return f"tl:{digest}:{token}"


# Tells the break watches of the key's leases (every slot's, or the one with p_token): each
# watch holds its lease's named lock while it sleeps on the server, and KILL QUERY ends
# that sleep at once. KILL needs the same database user (or CONNECTION ADMIN): where it is
# refused, the watch finds the break at its next look instead.
WAKE_BODY = """\
BEGIN
    DECLARE v_done BOOLEAN DEFAULT FALSE;
    DECLARE v_token BIGINT;
    DECLARE v_id BIGINT;
    DECLARE v_tokens CURSOR FOR
        SELECT fencing_token FROM `{table}`
         WHERE `key` = p_key AND slot >= 0 AND (p_token IS NULL OR fencing_token = p_token);
    DECLARE CONTINUE HANDLER FOR NOT FOUND SET v_done = TRUE;
    DECLARE CONTINUE HANDLER FOR 1094, 1095 BEGIN END;  -- gone already; not ours to KILL
    OPEN v_tokens;
    tokens: LOOP
        FETCH v_tokens INTO v_token;
        IF v_done THEN
            LEAVE tokens;
        END IF;
        SET v_id = IS_USED_LOCK(CONCAT('tl:', LEFT(SHA1(CONCAT(DATABASE(), '.{table}:', p_key)),
                                                    32), ':', v_token));
        IF v_id IS NOT NULL AND v_id <> CONNECTION_ID() THEN
            KILL QUERY v_id;
        END IF;
    END LOOP;
    CLOSE v_tokens;
END"""

# Wakes the places of p_key that may now be admitted (see ``waiting``).
# Those are the head of the queue, and, when it is shared, the shared places after it up to
# the first exclusive one.
# With p_superseded, it wakes the places marked superseded instead.
# Their owners leave at once.
WAKE_QUEUE_BODY = f"""\
BEGIN
    DECLARE v_done BOOLEAN DEFAULT FALSE;
    DECLARE v_first BOOLEAN DEFAULT TRUE;
    DECLARE v_seq BIGINT;
    DECLARE v_mode VARCHAR(16);
    DECLARE v_id BIGINT;
    DECLARE v_places CURSOR FOR
        SELECT seq, mode FROM `{{table}}_waiters`
         WHERE `key` = p_key AND {_COUNTS.format(w="", now="SYSDATE(6)")}
           AND superseded = p_superseded
         ORDER BY ord;
    DECLARE CONTINUE HANDLER FOR NOT FOUND SET v_done = TRUE;
    DECLARE CONTINUE HANDLER FOR 1094, 1095 BEGIN END;  -- gone already; not ours to KILL
    OPEN v_places;
    places: LOOP
        FETCH v_places INTO v_seq, v_mode;
        IF v_done OR (NOT p_superseded AND NOT v_first AND v_mode <> 'shared') THEN
            LEAVE places;
        END IF;
        SET v_id = IS_USED_LOCK(CONCAT('tl:', LEFT(SHA1(CONCAT(DATABASE(), '.{{table}}')), 32),
                                       ':w', v_seq));
        IF v_id IS NOT NULL AND v_id <> CONNECTION_ID() THEN
            KILL QUERY v_id;
        END IF;
        IF NOT p_superseded AND v_first AND v_mode <> 'shared' THEN
            LEAVE places;
        END IF;
        SET v_first = FALSE;
    END LOOP;
    CLOSE v_places;
END"""

_LIVE_PLACE = _COUNTS.format(w="", now="SYSDATE(6)")
WAITERS = f"""
SELECT holder, since, mode FROM `{{table}}_waiters`
 WHERE `key` = %(key)s AND {_LIVE_PLACE} AND NOT superseded ORDER BY ord
"""
WAITING_COUNTS = f"""
SELECT `key`, COUNT(*) FROM `{{table}}_waiters`
 WHERE {_LIVE_PLACE} AND NOT superseded
   AND `key` >= %(prefix)s AND LEFT(`key`, LENGTH(%(prefix)s)) = %(prefix)s
 GROUP BY `key`
"""
LEAVE_QUEUE = "DELETE FROM `{table}_waiters` WHERE `key` = %(key)s AND owner_token = %(owner)s"
# Places in queues that ran out (their waiters crashed) and no acquire of their key cleared,
# and forged ones (beyond the horizon).
SWEEP_WAITERS = f"DELETE FROM `{{table}}_waiters` WHERE NOT ({_LIVE_PLACE})"

# For a waiter, whose place's owner token is %(owner)s (or who has none):
# - the key's live leases and their limit;
# - the seconds until the first of them runs out;
# - the seconds until the first exclusive one runs out;
# - the places ahead of ours, and how many of them are exclusive;
# - our place's mode;
# - the key's counter, which the waiter's sleep compares with (see ``waiting``).
TIME_UNTIL_FREE = f"""
SELECT COUNT(*), MAX(slot_limit),
       TIMESTAMPDIFF(MICROSECOND, SYSDATE(6), MIN(expires_at)) / 1e6,
       TIMESTAMPDIFF(MICROSECOND, SYSDATE(6), MIN(IF(mode <> 'shared', expires_at, NULL))) / 1e6,
       (SELECT COUNT(*) FROM `{{table}}_waiters` AS w
         WHERE w.`key` = %(key)s AND {_COUNTS.format(w="w.", now="SYSDATE(6)")}
           AND NOT w.superseded
           AND w.ord < COALESCE((SELECT ord FROM `{{table}}_waiters`
                                  WHERE `key` = %(key)s AND owner_token = %(owner)s), {_LAST})),
       (SELECT COUNT(*) FROM `{{table}}_waiters` AS w
         WHERE w.`key` = %(key)s AND {_COUNTS.format(w="w.", now="SYSDATE(6)")}
           AND NOT w.superseded
           AND w.mode <> 'shared'
           AND w.ord < COALESCE((SELECT ord FROM `{{table}}_waiters`
                                  WHERE `key` = %(key)s AND owner_token = %(owner)s), {_LAST})),
       (SELECT mode FROM `{{table}}_waiters` WHERE `key` = %(key)s AND owner_token = %(owner)s),
       (SELECT fencing_token FROM `{{table}}` WHERE `key` = %(key)s AND slot = -1)
  FROM `{{table}}`
 WHERE `key` = %(key)s AND slot >= 0 AND owner_token IS NOT NULL AND expires_at > SYSDATE(6)
"""
