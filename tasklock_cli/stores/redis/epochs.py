"""Failover epochs: the acquire script's check that Redis's primary is still the one whose
writes the namespace's records were made under, and the fencing tokens of a new epoch.

The namespace's epoch record is the hash ``P{}:epoch`` (no lock key is empty, so no lock
key's parts can have this name), never given a TTL:

- ``replid``: the ``master_replid`` (``INFO replication``) of the primary it was written on;
- ``epoch``: 0 until the first change of primary, then ``max(previous + 1, TIME seconds)``;
- ``quarantine_until``: Redis ``TIME`` in ms before which no acquire in the namespace
  succeeds (it answers as a held key does: the caller waits or conflicts);
- ``max_ttl``: the longest lease TTL (ms) an acquire in the namespace has asked for.

A primary whose ``master_replid`` differs from the recorded one took over from another
(a promoted replica gets a new replid and keeps the old one as ``master_replid2``), or
restarted: leases and tokens the old one granted may be missing here. A missing record is
a fresh namespace, unless ``master_replid2`` is set (this server took over from another
primary since it started): the namespace's first acquire may then have been on the old
primary, its record lost with it.
"""

from __future__ import annotations

#: The quarantine is never shorter than this (ms) plus the margin: the default ``--ttl``,
#: for leases whose TTL no record this primary holds knows of.
DEFAULT_TTL_MS = 30_000
#: Added to the quarantine (ms): clocks of two Redis servers, and a holder's send time.
QUARANTINE_MARGIN_MS = 2_000
#: Tokens of epoch ``e`` start at ``e << EPOCH_SHIFT``.
EPOCH_SHIFT = 30
#: The role of the epoch record in ``RedisKeys.name``-like terms: ``P{}:epoch``.
EPOCH_RECORD = b"{}:epoch"

#: Lua for the acquire script, after the prelude (``now_ms``, ``decimal_less``).
EPOCH_LUA = (
    """
local NO_REPLID = string.rep('0', 40)
-- This server's replication ids: {current, the one before it (nil when none)}.
local function replication_ids()
  local info = redis.call('INFO', 'replication')
  local replid = string.match(info, 'master_replid:(%x+)')
  local replid2 = string.match(info, 'master_replid2:(%x+)')
  if replid2 == NO_REPLID then replid2 = nil end
  return replid, replid2
end
-- The namespace's epoch and quarantine end (ms) for an acquire of `ttl` ms, starting a new
-- epoch when the primary changed; raises the recorded max_ttl to `ttl`.
local function current_epoch(record, now, ttl)
  local rec = redis.call('HMGET', record, 'replid', 'epoch', 'quarantine_until', 'max_ttl')
  local replid, replid2 = replication_ids()
  local epoch = tonumber(rec[2]) or 0
  local quarantine_until = tonumber(rec[3]) or 0
  local max_ttl = tonumber(rec[4]) or 0
  local changed
  if rec[1] then changed = rec[1] ~= replid else changed = replid2 ~= nil end
  if changed then
    epoch = math.max(epoch + 1, math.floor(now / 1000))
    quarantine_until = now + math.max(max_ttl, DEFAULT_TTL_MS) + QUARANTINE_MARGIN_MS
    redis.call('HSET', record, 'replid', replid, 'epoch', ms(epoch),
               'quarantine_until', ms(quarantine_until))
  elseif not rec[1] then
    redis.call('HSET', record, 'replid', replid, 'epoch', '0', 'quarantine_until', '0')
  end
  if ttl > max_ttl then redis.call('HSET', record, 'max_ttl', ms(ttl)) end
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
    .replace("EPOCH_LIMIT", str(2 ** (63 - EPOCH_SHIFT)))
)

#: Lua for every script's prelude: compare two decimal strings of non-negative integers
#: (no leading zeros) exactly.
DECIMAL_LUA = """
local function decimal_less(a, b)
  if #a ~= #b then return #a < #b end
  return a < b
end
"""
