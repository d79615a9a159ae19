"""The Redis store's queue of waiters.

This module holds the queue's Lua, which is part of every script's prelude (see
``scripts``).
It also holds a place's record as Python writes and reads it.

Per lock key ``K`` (named after its wake list ``P{K}:wake``)::

    P{K}:queue       zset  owner -> order.
    P{K}:waiters     hash  owner -> 'expires_ms since_ms record' of its place.
    P{K}:superseded  hash  owner -> expires_ms of a place a newer waiter took out.

The keys in detail:

- ``P{K}:queue``: a caller with priority P (``run --priority``) joins at the end of its
  band of scores, ``[-P * PRIORITY_BAND, -P * PRIORITY_BAND + PRIORITY_BAND)`` (the last
  score there + 1): higher priorities first, arrival among equals. An older tasklock's
  waiter (the last score + 1) has priority 0 when the queue's last place has it.
  With ``front`` it joins ahead of everyone and every priority (the first score - 1, at
  most ``-FRONT_BAND - 1``).
  Keeping a place keeps its score.
  With ``--max-waiting`` N a caller without a place does not join N places or more.
- ``P{K}:waiters``: ``record`` is the waiter's holder as JSON.
  When not the default, it adds ``"mode": "shared"`` and ``"supersede": true``.
  An older tasklock reads the holder and ignores both.
  It counts every place as one ahead of it.
  For its callers, all exclusive, that is the rule.
- ``P{K}:superseded``: the places a newer ``--supersede`` waiter took out of the queue.
  Their owners' next acquire raises ``Superseded``.
  Out of the queue, they hold up nobody, older tasklocks included.

Admission (``head_run``):

- A shared place is admitted when every place ahead of it is shared and no exclusive lease
  is live.
- An exclusive place is admitted when fewer places are ahead of it than slots are free.
  None is free while a shared lease is live.

A release wakes every place it may admit, each on its own wake list ``P{K}:wake:<owner>``.
That is the head, or the run of shared places at the head; never the whole queue.
"""

from __future__ import annotations

import json

from tasklock_cli.stores.model import FRONT_BAND
from tasklock_cli.stores.model import PRIORITY_BAND
from tasklock_cli.stores.model import SHARED
from tasklock_cli.stores.model import WAITER_HORIZON_S
from tasklock_cli.stores.model import Ask
from tasklock_cli.stores.model import Holder
from tasklock_cli.stores.model import WaiterInfo
from tasklock_cli.stores.model import place_record as model_place_record
from tasklock_cli.stores.rows import waiter_info as waiter_info_of

#: How a place's record says its waiter is shared, or joined with ``--supersede``
#: (``json.dumps``' own spelling of the pairs, which place_record adds).
SHARED_FLAG = '"mode": "shared"'
SUPERSEDE_FLAG = '"supersede": true'

# Needs from the prelude before it: ms, now_ms, slot_key, WAKE_TOKEN_MS.
_QUEUE_LUA = """
local function queue_names(wake_name)
  local base = string.sub(wake_name, 1, -5)
  return base .. 'queue', base .. 'waiters', base .. 'superseded'
end
local function place_expiry(value)
  return value and tonumber(string.match(value, '^(%d+) ')) or 0
end
-- A place is live until it runs out, and only while that is within the horizon a
-- waiter's renewal could have put it (model.WAITER_HORIZON_S): a later one was forged.
local function place_live(value, now)
  local expires = place_expiry(value)
  return expires > now and expires <= now + WAITER_HORIZON_MS
end
-- A place's mode (true: shared) and supersede flag, from its record (an older
-- tasklock's has neither: exclusive, no supersede). Found as text (place_record writes
-- them so): JSON escapes every quote inside a string, so no note or command can fake them.
local function place_flags(value)
  return string.find(value, SHARED_FLAG, 1, true) ~= nil,
    string.find(value, SUPERSEDE_FLAG, 1, true) ~= nil
end
-- The live places in order, each {owner, shared, supersede, value}; the dead are dropped.
local function live_queue(wake_name, now)
  local q, w = queue_names(wake_name)
  local out = {}
  for _, owner in ipairs(redis.call('ZRANGE', q, 0, -1)) do
    local value = redis.call('HGET', w, owner)
    if place_live(value, now) then
      local shared, supersede = place_flags(value)
      out[#out + 1] = {owner, shared, supersede, value}
    else
      redis.call('ZREM', q, owner)
      redis.call('HDEL', w, owner)
    end
  end
  return out
end
-- How many places at the head of `places` (and then `extra`, a caller without a place:
-- true when shared, nil for none) may be admitted now, with `live` live leases of which
-- `shared_live` shared, and `slots` slots for the exclusive ones.
local function head_run(places, extra, live, shared_live, slots)
  local free = shared_live > 0 and 0 or slots - live
  local readers = live == shared_live
  local n = #places + (extra == nil and 0 or 1)
  for at = 1, n do
    local shared = extra
    if at <= #places then shared = places[at][2] end
    if shared then
      if not readers then return at - 1 end
    else
      readers = false
      if at > free then return at - 1 end
    end
  end
  return n
end
-- The score of a newcomer with `priority`: after the last place of its band.
local function band_score(q, priority)
  local base = -priority * PRIORITY_BAND
  local last = redis.call('ZREVRANGEBYSCORE', q, '(' .. (base + PRIORITY_BAND), base,
                          'WITHSCORES', 'LIMIT', 0, 1)
  return (tonumber(last[2]) or base) + 1
end
-- The score of a newcomer with `front`: ahead of every place and every band.
local function front_score(q)
  local first = tonumber(redis.call('ZRANGE', q, 0, 0, 'WITHSCORES')[2]) or 0
  return math.min(first, -FRONT_BAND) - 1
end
-- Join the queue (at its end, or with `front` ahead of every place), or keep our live
-- place and its order, until now + ttl. True when we joined (had no live place).
local function join_queue(wake_name, owner, now, ttl, record, front, priority)
  local q, w = queue_names(wake_name)
  local value = redis.call('HGET', w, owner)
  local since = now
  local joined = not (redis.call('ZSCORE', q, owner) and place_live(value, now))
  if joined then
    redis.call('ZADD', q, front and front_score(q) or band_score(q, priority), owner)
  else
    since = tonumber(string.match(value, '^%d+ (%d+) '))
  end
  redis.call('HSET', w, owner, ms(now + ttl) .. ' ' .. ms(since) .. ' ' .. record)
  redis.call('PEXPIRE', q, ttl * 4)
  redis.call('PEXPIRE', w, ttl * 4)
  return joined
end
local function leave_queue(wake_name, owner)
  local q, w = queue_names(wake_name)
  redis.call('ZREM', q, owner)
  redis.call('HDEL', w, owner)
end
local function wake_place(wake_name, owner)
  local own = wake_name .. ':' .. owner
  redis.call('RPUSH', own, '1')
  redis.call('LTRIM', own, -1, -1)
  redis.call('PEXPIRE', own, WAKE_TOKEN_MS)
end
-- A --supersede waiter that joins takes every other --supersede place out of the queue,
-- marks it superseded and wakes its owner, whose next acquire then raises Superseded.
-- The marker lives only as long as the place would have (its expiry, waiter_ttl after
-- its owner's last attempt): an owner that does not try again within that finds no
-- marker, and its next acquire joins the queue anew, at its end (a live waiter tries
-- every waiter_ttl/3, so only one that stalled that long meets this edge). How many.
local function supersede_others(wake_name, places, owner, now, ttl)
  local q, w, s = queue_names(wake_name)
  local marked = redis.call('HGETALL', s)
  for i = 1, #marked, 2 do  -- the markers that ran out go
    if (tonumber(marked[i + 1]) or 0) <= now then redis.call('HDEL', s, marked[i]) end
  end
  local n = 0
  for _, place in ipairs(places) do
    if place[3] and place[1] ~= owner then
      redis.call('ZREM', q, place[1])
      redis.call('HDEL', w, place[1])
      redis.call('HSET', s, place[1], ms(place_expiry(place[4])))
      wake_place(wake_name, place[1])
      n = n + 1
    end
  end
  if n > 0 then redis.call('PEXPIRE', s, ttl * 4) end
  return n
end
-- True when `owner`'s place was superseded (the marker is taken: it tells once).
local function take_superseded(wake_name, owner, now)
  local _, _, s = queue_names(wake_name)
  local expires = redis.call('HGET', s, owner)
  if not expires then return false end
  redis.call('HDEL', s, owner)
  return (tonumber(expires) or 0) > now
end
-- How many live leases in slots 0..count-1 of the key, and how many of them are shared.
local function slot_state(base, count)
  local live, shared = 0, 0
  for slot = 0, count - 1 do
    local name = slot_key(base, slot)
    if redis.call('TYPE', name)['ok'] == 'hash' then
      live = live + 1
      if redis.call('HGET', name, 'mode') == 'shared' then shared = shared + 1 end
    end
  end
  return live, shared
end
-- After a release: wake every place the key's state may now admit (see head_run), each on
-- its own wake list. With no queue, up to `pushes` elements on the key's wake list (one
-- per freed slot), whoever BLPOPs first takes one; never more than free slots; nobody
-- blocked: they wait a little for a waiter on its way.
local function wake(name, base, count, pushes)
  local live, shared_live = slot_state(base, count)
  local places = live_queue(name, now_ms())
  if #places > 0 then
    for at = 1, head_run(places, nil, live, shared_live, count) do
      wake_place(name, places[at][1])
    end
    return
  end
  local free = shared_live > 0 and 0 or count - live
  if free < 1 or pushes < 1 then return end
  for _ = 1, pushes do redis.call('RPUSH', name, '1') end
  redis.call('LTRIM', name, -free, -1)
  redis.call('PEXPIRE', name, WAKE_TOKEN_MS)
end
"""
_HORIZON_MS = str(int(WAITER_HORIZON_S * 1000))
QUEUE_LUA = (
    _QUEUE_LUA.replace("SHARED_FLAG", repr(SHARED_FLAG))
    .replace("SUPERSEDE_FLAG", repr(SUPERSEDE_FLAG))
    .replace("WAITER_HORIZON_MS", _HORIZON_MS)
    .replace("FRONT_BAND", str(FRONT_BAND))
    .replace("PRIORITY_BAND", str(PRIORITY_BAND))
)

# Read-only; KEYS[1] = wake; ARGV: our owner ('' = none) -> {how many live places are
# ahead of ours (all when we have none), then each live place's 'expires since record'}.
WAITERS = """
local base = string.sub(KEYS[1], 1, -5)
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local out = {-1}
for _, owner in ipairs(redis.call('ZRANGE', base .. 'queue', 0, -1)) do
  local value = redis.call('HGET', base .. 'waiters', owner)
  local expires = value and tonumber(string.match(value, '^(%d+) ')) or 0
  if expires > now and expires <= now + WAITER_HORIZON_MS then
    if owner == ARGV[1] then out[1] = #out - 1 end
    out[#out + 1] = value
  end
end
if out[1] < 0 then out[1] = #out - 1 end
return out
""".replace("WAITER_HORIZON_MS", _HORIZON_MS)


def place_record(holder: Holder, ask: Ask) -> str:
    """What a place keeps of its waiter: the holder, with its mode, supersede flag and
    priority when not the defaults (so a plain waiter's record is what an older tasklock
    writes)."""
    record = model_place_record(holder, ask)
    mode, supersede = ask.mode, ask.supersede
    if mode == SHARED:
        record["mode"] = SHARED
    if supersede:
        record["supersede"] = True
    return json.dumps(record)


def waiter_info(value: bytes) -> WaiterInfo:
    """A place's value, 'expires_ms since_ms record', read defensively (see rows)."""
    _expires, _, rest = value.partition(b" ")
    since, _, record = rest.partition(b" ")
    return waiter_info_of(record, since, None, per_second=1000)


def place_mode(value: bytes) -> str:
    return waiter_info(value).mode
