"""Failover epochs on Redis, for the acquire script.

The acquire script checks that Redis's primary is still the one under whose writes the
namespace's records were made.
It also computes the fencing tokens of a new epoch.
The design the stores share is in ``stores.failover``.

The namespace's epoch record is the hash ``P{}:epoch``.
No lock key is empty, so no lock key's parts can have this name.
The record is never given a TTL.
Its fields:

- ``replid``: the ``master_replid`` (``INFO replication``) of the primary it was written on.
- ``run_id``: that server's ``run_id`` (``INFO server``), new at each start.
- ``epoch``: 0 until the first change of primary, then ``max(previous + 1, TIME seconds)``.
- ``quarantine_until``: Redis ``TIME`` in ms before which no acquire in the namespace
  succeeds.
  Such an acquire answers as a held key does: the caller waits or conflicts.
- ``max_ttl``: the longest lease TTL (ms) an acquire in the namespace has asked for.
- ``lossless``: '1' when, at the last acquire, a crash and restart of the server could lose
  no acknowledged write: AOF on, ``appendfsync always`` (the client reads it on connecting,
  with its client name, and passes it tied to the server's run_id), no replica connected
  (whose copy could be started as a primary).
- ``cause``: why the last epoch began, 'failover' or 'fresh' (for the message).

When the primary changed, leases and tokens the old one granted may be missing here:

- A primary whose ``master_replid`` differs from the recorded one took over from another,
  or restarted.
  A promoted replica gets a new replid and keeps the old one as ``master_replid2``.
- A primary whose ``run_id`` differs restarted.
  A server may keep its replid across a restart, from its RDB file.
- A record without ``run_id`` (an older tasklock's) gains it without a change.

Except a restart that lost nothing: the record says ``lossless``, the server loaded its AOF
(``aof_enabled``) and took over from no other primary (no ``master_replid2``). A replica
restarted by hand as a primary from its own AOF would look the same; no replica was
connected when the record said ``lossless``, and promotions (Sentinel, ``REPLICAOF NO ONE``)
set ``master_replid2``.

A missing record is a fresh namespace, with two exceptions:

- ``master_replid2`` is set.
  This server took over from another primary since it started.
  The namespace's first acquire may have been on the old primary, and its record was lost
  with it.
- The server started less than the quarantine floor
  (``DEFAULT_TTL_MS + QUARANTINE_MARGIN_MS``) ago.
  A restart without persistence loses the record.
  A holder of the server's previous life may still run.
  That quarantine ends at the floor after the server's start.
  Leases granted before the start end within the default TTL of it.

A server without persistence may have restarted longer ago than the floor before the
namespace's next acquire.
It cannot be told from a fresh one, and tokens start again at 1 (README says so).
Its holders ended their trees by then (``Store.failover_window``).

``tasklock init`` marks a namespace new (``mark_new``): a record of this server at epoch 0,
written where there is none, or where only a fresh server's quarantine is (no lease was
granted under it). The operator says that nothing was held before.
"""

from __future__ import annotations

from tasklock_cli.stores.failover import DEFAULT_TTL_S
from tasklock_cli.stores.failover import EPOCH_SHIFT
from tasklock_cli.stores.failover import LONGEST_TTL_S
from tasklock_cli.stores.failover import MAX_EPOCH
from tasklock_cli.stores.failover import QUARANTINE_MARGIN_S

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from tasklock_cli.stores.failover import Quarantines
    from tasklock_cli.stores.redis.connection import RedisConnection

#: ``stores.failover``'s quarantine floor and margin in ms, Redis ``TIME``'s unit here.
DEFAULT_TTL_MS = round(DEFAULT_TTL_S * 1000)
QUARANTINE_MARGIN_MS = round(QUARANTINE_MARGIN_S * 1000)
MAX_TTL_MS = round(LONGEST_TTL_S * 1000)
#: The role of the epoch record in ``RedisKeys.name``-like terms: ``P{}:epoch``.
EPOCH_RECORD = b"{}:epoch"

#: Lua for the acquire script, after the prelude (``now_ms``, ``decimal_less``).
EPOCH_LUA = (
    """
local NO_REPLID = string.rep('0', 40)
local QUARANTINE_FLOOR = DEFAULT_TTL_MS + QUARANTINE_MARGIN_MS
-- This server's replication ids {current, the one before it (nil when none)} and how
-- many replicas it has.
local function replication_state()
  local info = redis.call('INFO', 'replication')
  local replid = string.match(info, 'master_replid:(%x+)')
  local replid2 = string.match(info, 'master_replid2:(%x+)')
  if replid2 == NO_REPLID then replid2 = nil end
  return replid, replid2, tonumber(string.match(info, 'connected_slaves:(%d+)')) or 0
end
-- This server's run id (new at each start; nil when INFO hides it) and the latest moment
-- (ms) it can have started: uptime_in_seconds counts whole seconds of its clock.
local function server_start(now)
  local info = redis.call('INFO', 'server')
  local uptime = tonumber(string.match(info, 'uptime_in_seconds:(%d+)')) or 0
  return string.match(info, 'run_id:(%x+)'), now - math.max(uptime - 1, 0) * 1000
end
local function aof_enabled()
  return string.match(redis.call('INFO', 'persistence'), 'aof_enabled:(%d)') == '1'
end
-- A number the record holds, 0 when it holds none or no number.
local function recorded(value)
  local n = tonumber(value)
  if not n or n ~= n or n < 0 then return 0 end
  return n
end
-- The longest TTL recorded (ms), within what a client can ask (a forged one is no longer).
local function longest_ttl(rec)
  return math.min(recorded(rec[4]), MAX_TTL_MS)
end
-- A quarantine's end as recorded, never later than a new one would end: a forged end
-- cannot keep the namespace's keys from every holder for longer.
local function bounded_quarantine(rec, now)
  return math.min(recorded(rec[3]),
                  now + math.max(longest_ttl(rec), DEFAULT_TTL_MS) + QUARANTINE_MARGIN_MS)
end
-- Whether a crash and restart of this server keeps every write acknowledged now: its AOF is
-- fsynced before each reply (appendfsync always, which the client read from this very
-- server: `fsync_run_id`), and no replica holds a copy that could be started as a primary.
local function lossless_now(run_id, replicas, fsync_run_id)
  return run_id ~= nil and fsync_run_id == run_id and replicas == 0 and aof_enabled()
end
-- Whether the primary changed since the record was written in a way that may have lost
-- leases, why ('failover' or 'fresh'), and until when that keeps new leases out.
-- A restart that loaded an AOF of every acknowledged write lost nothing: no change.
local function primary_changed(rec, now, replid, replid2, run_id)
  local ends = now + math.max(longest_ttl(rec), DEFAULT_TTL_MS) + QUARANTINE_MARGIN_MS
  if rec[1] then  -- another replid: a promoted replica or a restart; another run_id: a restart
    local changed = rec[1] ~= replid or (rec[5] ~= false and run_id ~= nil and rec[5] ~= run_id)
    if changed and replid2 == nil and rec[6] == '1' and aof_enabled() then
      changed = false
    end
    return changed, ends, 'failover'
  end
  if replid2 ~= nil then  -- no record on a server that took over from another primary
    return true, ends, 'failover'
  end
  -- no record on a server that started a moment ago: a restart may have lost it
  local _, started = server_start(now)
  return started + QUARANTINE_FLOOR > now, started + QUARANTINE_FLOOR, 'fresh'
end
local EPOCH_FIELDS = {'replid', 'epoch', 'quarantine_until', 'max_ttl', 'run_id', 'lossless',
                      'cause'}
-- The namespace's epoch, quarantine end (ms) and its cause for an acquire of `ttl` ms,
-- starting a new epoch when the primary changed; raises the recorded max_ttl to `ttl` and
-- records whether the namespace's writes are lossless now (`fsync_run_id`: see above).
local function current_epoch(record, now, ttl, fsync_run_id)
  local rec = redis.call('HMGET', record, unpack(EPOCH_FIELDS))
  local epoch = recorded(rec[2])
  local quarantine_until = bounded_quarantine(rec, now)
  if recorded(rec[3]) > quarantine_until then  -- forged: the bound, kept, so that it ends
    redis.call('HSET', record, 'quarantine_until', ms(quarantine_until))
  end
  local cause = rec[7] or 'failover'
  local replid, replid2, replicas = replication_state()
  local run_id = server_start(now)
  local changed, ends, why = primary_changed(rec, now, replid, replid2, run_id)
  if changed then
    epoch = math.max(epoch + 1, math.floor(now / 1000))
    quarantine_until, cause = ends, why
    redis.call('HSET', record, 'replid', replid, 'epoch', ms(epoch),
               'quarantine_until', ms(quarantine_until), 'cause', cause)
  elseif rec[1] ~= replid then
    redis.call('HSET', record, 'replid', replid)
    if not rec[1] then redis.call('HSET', record, 'epoch', '0', 'quarantine_until', '0') end
  end
  if run_id and rec[5] ~= run_id then redis.call('HSET', record, 'run_id', run_id) end
  if ttl > recorded(rec[4]) then redis.call('HSET', record, 'max_ttl', ms(ttl)) end
  local lossless = lossless_now(run_id, replicas, fsync_run_id) and '1' or '0'
  if rec[6] ~= lossless then redis.call('HSET', record, 'lossless', lossless) end
  return epoch, quarantine_until, cause
end
-- What keeps the namespace's keys from new holders now, without writing: {ms left, cause}
-- of a quarantine under way, or of the one the next acquire would meet on a fresh server
-- (nil when none).
local function quarantine_state(record, now)
  local rec = redis.call('HMGET', record, unpack(EPOCH_FIELDS))
  if not rec[1] then
    local replid, replid2 = replication_state()
    local changed, ends, why = primary_changed(rec, now, replid, replid2, server_start(now))
    if changed then return {ends - now, why} end
    return nil
  end
  local left = bounded_quarantine(rec, now) - now
  if left > 0 then return {left, rec[7] or 'failover'} end
  return nil
end
-- Marks the namespace new (`tasklock init`): a record of this server at epoch 0 where there
-- is none, or where only a fresh server's quarantine is (no lease was granted since it was
-- written), so the next acquire meets no quarantine. Returns the epoch of a record in use.
local function mark_new(record, now, fsync_run_id)
  local rec = redis.call('HMGET', record, unpack(EPOCH_FIELDS))
  if rec[1] and not (rec[7] == 'fresh' and recorded(rec[3]) > now) then
    return {'used', ms(recorded(rec[2]))}
  end
  redis.call('HDEL', record, 'cause')
  local replid, _, replicas = replication_state()
  local run_id = server_start(now)
  local lossless = lossless_now(run_id, replicas, fsync_run_id) and '1' or '0'
  redis.call('HSET', record, 'replid', replid, 'epoch', '0', 'quarantine_until', '0',
             'lossless', lossless, 'max_ttl', '0')
  if run_id then redis.call('HSET', record, 'run_id', run_id) end
  return {'marked', '0'}
end
-- The next fencing token of the key whose counter is `fence`, as a decimal string (Lua's
-- numbers are doubles: exact only to 2^53): max(counter + 1, epoch << EPOCH_SHIFT).
local function next_token(fence, epoch)
  if epoch >= EPOCH_LIMIT then  -- its tokens would pass 2^63 - 1
    return nil, redis.error_reply('EPOCH ' .. ms(epoch) .. ' is past the last one tokens can carry')
  end
  if epoch > 0 then
    local base = ms(epoch * EPOCH_BASE)  -- a power of two times an integer: exact
    local counter = redis.call('GET', fence)
    if not counter or decimal_less(counter, base) then
      redis.call('SET', fence, base)
      return base
    end
  end
  redis.call('INCR', fence)
  return redis.call('GET', fence)
end
""".replace("DEFAULT_TTL_MS", str(DEFAULT_TTL_MS))
    .replace("QUARANTINE_MARGIN_MS", str(QUARANTINE_MARGIN_MS))
    .replace("MAX_TTL_MS", str(MAX_TTL_MS))
    .replace("EPOCH_BASE", str(2**EPOCH_SHIFT))
    .replace("EPOCH_LIMIT", str(MAX_EPOCH + 1))
)

#: Lua for every script's prelude: compare two decimal strings of non-negative integers
#: (no leading zeros) exactly.
DECIMAL_LUA = """
local function decimal_less(a, b)
  if #a ~= #b then return #a < #b end
  return a < b
end
"""


def met_quarantine(quarantines: Quarantines, key: str, result: list[Any] | None) -> bool:
    """Whether the acquire script's ``result`` is a quarantine (``{'quarantine', ms left,
    cause}``), noted in ``quarantines`` for ``key`` (a result that is none: noted too)."""
    if result is None or result[0] != b"quarantine":
        quarantines.met(key, None)
        return False
    quarantines.met(key, int(result[1]), result[2].decode("ascii", "replace"))
    return True


def quarantine_state(conn: RedisConnection) -> tuple[float, str]:
    """Seconds left of what keeps the namespace's keys from new holders (0: nothing), and
    why ('failover', 'fresh'), on Redis's clock. Writes nothing: an epoch starts with an
    acquire, never here."""
    name = conn.names.epoch_record()
    state = conn.script("quarantine", [name], [], None)
    if not state:
        return 0.0, ""
    return int(state[0]) / 1000, state[1].decode("ascii", "replace")


def mark_new(conn: RedisConnection) -> str:
    """``tasklock init``: marks the namespace new (see ``mark_new`` in the Lua), and says what
    it found."""
    name = conn.names.epoch_record()
    outcome, epoch = conn.script("mark_new", [name], [conn.durability()], None)
    if outcome == b"marked":
        return "namespace marked new: runs are granted at once"
    return f"namespace in use already (epoch {int(epoch)}): left as it is"
