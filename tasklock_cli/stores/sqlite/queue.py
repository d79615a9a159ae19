"""The SQLite store's queues of waiters: their statements.

They are run:

- by the store's acquire, in its write transaction: one transaction holds the queue and
  the taking;
- by releases, to find whom to wake;
- by the listings.

A key's waiters are served in ``(place, seq)`` order.

- ``seq`` grows with every place taken.
- ``place`` is minus the waiter's priority (``run --priority``; 0 by default, as an older
  tasklock writes it), but for a ``front`` place (``run --replace``).
  So higher priorities go first, and arrival (``seq``) decides among equals.
- A ``front`` place takes one less than the lowest place in the key's queue, and at most
  ``-MAX_PRIORITY - 2``.
  So it stands ahead of everyone there and every priority to come, and stays there while
  it is kept.
- ``--max-waiting``: a caller with no place does not join a queue that long already.
- A place is live while it has not run out on this boot's clock.
  The acquire clears the key's dead places first.

Supersede:

- A place that joined with ``supersede`` is marked ``superseded`` when a later such place
  joins.
- A superseded place counts for nobody.
  It is ahead of no one, not listed, and not woken as the head.
- Its owner's next acquire removes it and raises ``Superseded``.
- The mark lives as long as the place.
  Its owner may not look again within ``waiter_ttl``, because it died or stalled.
  Then the place runs out, and is cleared with its mark.
  An acquire after that is a newcomer's: it joins the queue again, at its end.

Modes:

- A SHARED waiter's turn comes when no EXCLUSIVE waiter counts ahead of it.
  The shared run at the head goes together.
- An EXCLUSIVE waiter's turn comes when fewer waiters are ahead of it than slots are free,
  as for ``--limit``.
  With one slot, that means none ahead.
"""

from __future__ import annotations

from tasklock_cli.stores.model import MAX_PRIORITY
from tasklock_cli.stores.model import WAITER_HORIZON_S
from tasklock_cli.stores.sqlite.schema import WAITERS_TABLE

_W = WAITERS_TABLE
# A place is live until it runs out.
# It is live only while it runs out within the horizon that a waiter's renewal could have
# put it.
# A later expiry, or one that is not a number, was not written by a waiter.
# Such a place is dead, and cleared as the dead are.
_HORIZON = f"{WAITER_HORIZON_S!r}"
LIVE = f"boot_id = :boot AND expires_boot > :now AND expires_boot <= :now + {_HORIZON}"
# A place that counts: live and not superseded.
_COUNTED = f"{LIVE} AND NOT superseded"
CLEAR_DEAD = f"DELETE FROM {_W} WHERE key = :key AND NOT ({LIVE})"
# Our place, superseded: removed (the caller raises Superseded).
TAKE_SUPERSEDED = f"""DELETE FROM {_W}
WHERE key = :key AND owner_token = :owner AND superseded RETURNING 1"""
_OUR_PLACE = f"SELECT place, seq FROM {_W} WHERE key = :key AND owner_token = :owner"
# The counted places ahead of ours (every one when we have none: the row value is NULL).
_AHEAD = f"""FROM {_W} WHERE key = :key AND {_COUNTED} AND owner_token <> :owner
  AND coalesce((place, seq) < ({_OUR_PLACE}), 1)"""
AHEAD_COUNT = f"SELECT count(*) {_AHEAD}"
EXCLUSIVE_AHEAD = f"EXISTS (SELECT 1 {_AHEAD} AND mode <> 'shared')"
# Our mode in the queue (exclusive without a place), how many are ahead of us, and whether
# an exclusive one is among them.
STATE = f"""SELECT coalesce((SELECT mode FROM {_W} WHERE key = :key AND owner_token = :owner),
                   'exclusive'),
       ({AHEAD_COUNT}), {EXCLUSIVE_AHEAD}"""
# Joining (at the end, or ahead of everyone with :front), or keeping our place.
JOIN = f"""INSERT INTO {_W}
    (key, owner_token, boot_id, expires_boot, since, holder, fifo, mode, supersede, place)
VALUES (:key, :owner, :boot, :now + :waiter_ttl, :wall, :holder, :fifo, :mode, :supersede,
        CASE WHEN :front THEN (SELECT min(coalesce(min(place), 0), {-MAX_PRIORITY - 1}) - 1
                               FROM {_W} WHERE key = :key)
             ELSE -:priority END)
ON CONFLICT (key, owner_token) DO UPDATE SET
    boot_id = excluded.boot_id, expires_boot = excluded.expires_boot,
    fifo = coalesce(excluded.fifo, fifo)"""
# A ``supersede`` caller about to join (no place yet) supersedes the older such places;
# their FIFOs, so that their owners hear of it.
SUPERSEDE = f"""UPDATE {_W} SET superseded = 1
WHERE key = :key AND supersede AND NOT superseded AND {LIVE} AND owner_token <> :owner
  AND NOT EXISTS ({_OUR_PLACE})
RETURNING fifo"""
# With ``--max-waiting``: 1 when we have no place and the key's counted places are that
# many or more (we do not join).
QUEUE_FULL = f"""SELECT NOT EXISTS ({_OUR_PLACE})
   AND (SELECT count(*) FROM {_W} WHERE key = :key AND {_COUNTED}) >= :max_waiting"""
LEAVE = f"DELETE FROM {_W} WHERE key = :key AND owner_token = :owner"
# The FIFOs of the waiters a release may admit, head first: the head, and when it is
# shared, every shared place before the first exclusive one.
WAKE_SET = f"""SELECT fifo FROM {_W} AS w WHERE key = :key AND {_COUNTED}
  AND NOT EXISTS (
    SELECT 1 FROM {_W} AS e
    WHERE e.key = :key AND e.boot_id = :boot AND e.expires_boot > :now
      AND e.expires_boot <= :now + {_HORIZON} AND NOT e.superseded
      AND (e.place, e.seq) < (w.place, w.seq) AND (w.mode <> 'shared' OR e.mode <> 'shared'))
ORDER BY place, seq"""
WAITERS = f"""SELECT holder, since, mode FROM {_W}
WHERE key = :key AND {_COUNTED} ORDER BY place, seq"""
WAITING_COUNTS = f"""SELECT key, count(*) FROM {_W}
WHERE {_COUNTED} AND key >= :prefix AND substr(key, 1, :n) = :prefix GROUP BY key"""
SWEEP = f"DELETE FROM {_W} WHERE NOT ({LIVE})"
