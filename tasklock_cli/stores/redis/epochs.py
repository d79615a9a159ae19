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

When the primary changed, leases and tokens the old one granted may be missing here:

- A primary whose ``master_replid`` differs from the recorded one took over from another,
  or restarted.
  A promoted replica gets a new replid and keeps the old one as ``master_replid2``.
- A primary whose ``run_id`` differs restarted.
  A server may keep its replid across a restart, from its RDB file.
- A record without ``run_id`` (an older tasklock's) gains it without a change.

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
"""

from __future__ import annotations

from typing import Any

from tasklock_cli.stores.failover import DEFAULT_TTL_S
from tasklock_cli.stores.failover import EPOCH_SHIFT
from tasklock_cli.stores.failover import MAX_EPOCH
from tasklock_cli.stores.failover import QUARANTINE_MARGIN_S

TYPE_CHECKING = False
if TYPE_CHECKING:
    import redis

    from tasklock_cli.stores.redis.connection import RedisConnection

#: ``stores.failover``'s quarantine floor and margin in ms, Redis ``TIME``'s unit here.
DEFAULT_TTL_MS = round(DEFAULT_TTL_S * 1000)
QUARANTINE_MARGIN_MS = round(QUARANTINE_MARGIN_S * 1000)
#: The role of the epoch record in ``RedisKeys.name``-like terms: ``P{}:epoch``.
EPOCH_RECORD = b"{}:epoch"

#: Lua for the acquire script, after the prelude (``now_ms``, ``decimal_less``).
EPOCH_LUA = (
    """
local NO_REPLID = string.rep('0', 40)
local QUARANTINE_FLOOR = DEFAULT_TTL_MS + QUARANTINE_MARGIN_MS
-- This server's replication ids: {current, the one before it (nil when none)}.
local function replication_ids()
  local info = redis.call('INFO', 'replication')
  local replid = string.match(info, 'master_replid:(%x+)')
  local replid2 = string.match(info, 'master_replid2:(%x+)')
  if replid2 == NO_REPLID then replid2 = nil end
  return replid, replid2
end
-- This server's run id (new at each start; nil when INFO hides it) and the latest moment
-- (ms) it can have started: uptime_in_seconds counts whole seconds of its clock.
local function server_start(now)
  local info = redis.call('INFO', 'server')
  local uptime = tonumber(string.match(info, 'uptime_in_seconds:(%d+)')) or 0
  return string.match(info, 'run_id:(%x+)'), now - math.max(uptime - 1, 0) * 1000
end
-- Whether the primary changed since the record was written, and until when a change
-- keeps new leases out.
local function primary_changed(rec, now)
  local replid, replid2 = replication_ids()
  local run_id, started = server_start(now)
  local max_ttl = tonumber(rec[4]) or 0
  local ends = now + math.max(max_ttl, DEFAULT_TTL_MS) + QUARANTINE_MARGIN_MS
  local changed
  if rec[1] then  -- another replid: a promoted replica; another run_id: a restart
    changed = rec[1] ~= replid or (rec[5] ~= false and run_id ~= nil and rec[5] ~= run_id)
  elseif replid2 ~= nil then  -- no record on a server that took over from another primary
    changed = true
  else  -- no record on a server that started a moment ago: a restart may have lost it
    changed = started + QUARANTINE_FLOOR > now
    ends = started + QUARANTINE_FLOOR
  end
  return changed, ends, replid, run_id
end
-- The namespace's epoch and quarantine end (ms) for an acquire of `ttl` ms, starting a new
-- epoch when the primary changed; raises the recorded max_ttl to `ttl`.
local function current_epoch(record, now, ttl)
  local rec = redis.call('HMGET', record, 'replid', 'epoch', 'quarantine_until', 'max_ttl',
                         'run_id')
  local epoch = tonumber(rec[2]) or 0
  local quarantine_until = tonumber(rec[3]) or 0
  local changed, ends, replid, run_id = primary_changed(rec, now)
  if changed then
    epoch = math.max(epoch + 1, math.floor(now / 1000))
    quarantine_until = ends
    redis.call('HSET', record, 'replid', replid, 'epoch', ms(epoch),
               'quarantine_until', ms(quarantine_until))
  elseif not rec[1] then
    redis.call('HSET', record, 'replid', replid, 'epoch', '0', 'quarantine_until', '0')
  end
  if run_id and rec[5] ~= run_id then redis.call('HSET', record, 'run_id', run_id) end
  if ttl > (tonumber(rec[4]) or 0) then redis.call('HSET', record, 'max_ttl', ms(ttl)) end
  return epoch, quarantine_until
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


def quarantine_left(conn: RedisConnection) -> float:
    """Seconds left of the namespace's failover quarantine (0 or less: none), read from
    its epoch record on Redis's clock."""
    name = conn.names.epoch_record()

    def read(client: redis.Redis) -> list[Any]:
        pipe = client.pipeline(transaction=True)  # one round trip, one moment
        pipe.hget(name, "quarantine_until")
        pipe.time()
        return pipe.execute()

    until, (seconds, micros) = conn.call(read)
    if until is None or not until.isdigit():
        return 0.0
    return (int(until) - seconds * 1000 - micros // 1000) / 1000
