"""The Redis store's Lua scripts: every mutation, and the reads that must see one moment.

Each script is one EVALSHA.
Times come from Redis's ``TIME``, never the client's clock.
Types are checked first, before anything is written.
So a foreign key under the prefix is reported, as "WRONGTYPE lease|fence|wake|limit <type>".

Slots:

- Slot 0 is the key's lease hash (``P{K}:lease``, as before semaphores).
- Slot ``n`` is the hash ``P{K}:lease:n``.
  No lock key's parts can have this name: theirs end in a role, these in a digit.
- The scripts build a slot's name from slot 0's.
- A plain lock's hash has no ``slot`` or ``limit`` field.
  It is slot 0 of limit 1; so are an older tasklock's leases.
- A semaphore's hashes have both fields.
- ``P{K}:limit`` holds the semaphore's limit.
  Its PX is at least as late as the last expiry of its live slots.
  It tells how many slots to look at.
  The liveness of the slots themselves then decides.

Shared holders (``run --shared``):

- They are slots of limit 1 whose hashes add ``mode`` = shared and ``slot``.
- Each takes the lowest slot no live lease holds, unbounded.
- ``P{K}:limit`` then covers one past the highest (``cover_slots``).
  So every reader of the key's slots sees them all.
  That includes an older tasklock, which takes it for a limit.
- An exclusive lease of limit 1 is taken only when no slot at all is live.
"""

from __future__ import annotations

from tasklock_cli.stores.model import BROKEN_OWNER_PREFIX
from tasklock_cli.stores.model import LEDGER_KEEP
from tasklock_cli.stores.model import UNREADABLE_EXPIRY_FLOOR_S
from tasklock_cli.stores.model import UNREADABLE_EXPIRY_MARGIN_S
from tasklock_cli.stores.redis.epochs import DECIMAL_LUA
from tasklock_cli.stores.redis.epochs import EPOCH_LUA
from tasklock_cli.stores.redis.queue import QUEUE_LUA
from tasklock_cli.stores.redis.queue import WAITERS


def ms_of(seconds: float) -> str:
    return str(round(seconds * 1000))


#: How long a release's wake-up waits for a waiter that is between its look and its BLPOP.
WAKE_TOKEN_MS = 5_000

# All scripts: KEYS[1] = the lease hash (slot 0's unless said otherwise).
_PRELUDE = (
    (
        """
if redis.replicate_commands then redis.replicate_commands() end
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
local function ms(n) return string.format('%d', n) end
-- The key's type, and an error reply when it is neither missing nor the expected one.
local function key_type(name, expected, role)
  local t = redis.call('TYPE', name)['ok']
  if t ~= 'none' and t ~= expected then
    return t, redis.error_reply('WRONGTYPE ' .. role .. ' ' .. t)
  end
  return t, nil
end
-- The first error reply among {name, expected type, role} checks, or nil.
local function bad_types(checks)
  for _, c in ipairs(checks) do
    local _, bad = key_type(c[1], c[2], c[3])
    if bad then return bad end
  end
  return nil
end
local lease_type, bad_lease = key_type(KEYS[1], 'hash', 'lease')
if bad_lease then return bad_lease end
local BROKEN = 'BROKEN_OWNER_PREFIX'
local function is_broken(owner) return string.sub(owner, 1, #BROKEN) == BROKEN end
local function slot_key(base, slot)
  if slot == 0 then return base end
  return base .. ':' .. slot
end
-- How many slots to look at: the recorded limit (a semaphore's, or one past the highest
-- live shared slot), else 1.
local function slot_count(limit_key)
  return tonumber(redis.call('GET', limit_key) or '1') or 1
end
local function live_slots(base, count)
  local live = 0
  for slot = 0, count - 1 do live = live + redis.call('EXISTS', slot_key(base, slot)) end
  return live
end
-- The limit record covers `count` slots (at least) and outlives every live slot of a
-- semaphore, or of shared holders above slot 0 (a plain lock keeps none).
local function cover_slots(limit_key, count, ttl)
  if count <= 1 then return end
  local held = tonumber(redis.call('GET', limit_key) or '0') or 0
  local pttl = redis.call('PTTL', limit_key)
  if held < count or pttl < ttl then
    redis.call('SET', limit_key, math.max(held, count), 'PX', math.max(pttl, ttl))
  end
end
"""
        + DECIMAL_LUA
        + QUEUE_LUA
    )
    .replace("WAKE_TOKEN_MS", str(WAKE_TOKEN_MS))
    .replace("BROKEN_OWNER_PREFIX", BROKEN_OWNER_PREFIX)
)

# KEYS[2] = fence, KEYS[3] = wake, KEYS[4] = limit, KEYS[5] = the namespace's epoch record
# (see ``epochs``).
# ARGV: owner, ttl_ms, holder_json, limit, queue ('1' or ''), waiter_ttl_ms,
# mode ('shared' or '': exclusive), supersede ('1' or ''), front ('1' or ''),
# the place's record (see ``queue``), the run_id of the server the client saw
# ``appendfsync always`` on ('' when not: see ``epochs``), the priority (a decimal),
# max_waiting ('' = no cap).
# Returns:
# - {fencing_token (a decimal string), acquired_at_ms, expires_at_ms, slot} when taken;
# - nil when every slot is held, or the free ones go to waiters ahead of us (first come,
#   first served);
# - {'quarantine', ms left, cause} while a change of primary (cause 'failover'), or a
#   fresh server that may have lost the namespace's record ('fresh'), keeps every key
#   from new holders (it queues as nil does);
# - {'limit', held} when a live holder uses another limit;
# - {'superseded'} when a newer --supersede waiter took our place (we leave the queue);
# - {'full'} when, with queue and max_waiting, we have no place and that many places or
#   more wait (we do not join).
# With queue, nil joins the queue or keeps our place.
# A shared caller (limit 1) looks one slot past those recorded: there is always one free.
ACQUIRE = (
    _PRELUDE
    + EPOCH_LUA
    + """
local fence_type, bad_fence = key_type(KEYS[2], 'string', 'fence')
if bad_fence then return bad_fence end
local bad = bad_types({{KEYS[3], 'list', 'wake'}, {KEYS[4], 'string', 'limit'},
                      {KEYS[5], 'hash', 'epoch'}})
if bad then return bad end
local now = now_ms()
if take_superseded(KEYS[3], ARGV[1], now) then
  leave_queue(KEYS[3], ARGV[1])
  return {'superseded'}
end
local ttl = tonumber(ARGV[2])
local limit = tonumber(ARGV[4])
local shared = ARGV[7] == 'shared'
local count = math.max(limit, slot_count(KEYS[4]))
local free, live, shared_live = nil, 0, 0
for slot = 0, shared and count or count - 1 do
  local name = slot_key(KEYS[1], slot)
  local t, bad = key_type(name, 'hash', 'lease')
  if bad then return bad end
  if t == 'hash' then
    local cur = redis.call('HMGET', name, 'owner', 'fencing_token', 'acquired_at', 'limit', 'mode')
    local held = tonumber(cur[4]) or 1
    if held ~= limit then return {'limit', held} end
    if cur[1] == ARGV[1] then
      -- our own acquisition whose reply was lost: same lease, same token, refreshed TTL
      redis.call('HSET', name, 'expires_at', ms(now + ttl), 'holder', ARGV[3])
      redis.call('PEXPIRE', name, ttl)
      cover_slots(KEYS[4], shared and slot + 1 or limit, ttl)
      return {cur[2], tonumber(cur[3]), now + ttl, slot}
    end
    live = live + 1
    if cur[5] == 'shared' then shared_live = shared_live + 1 end
  elseif free == nil and (shared or slot < limit) then
    free = slot
  end
end
local epoch, quarantine_until, cause = current_epoch(KEYS[5], now, ttl, ARGV[11])
local queue = live_queue(KEYS[3], now)
local at = #queue + 1
for i, place in ipairs(queue) do
  if place[1] == ARGV[1] then at = i end
end
local mine = nil
if at > #queue then mine = shared end
local quarantined = now < quarantine_until
if quarantined or free == nil or head_run(queue, mine, live, shared_live, limit) < at then
  if ARGV[5] == '1' then
    local waiter_ttl = tonumber(ARGV[6])
    if at > #queue and ARGV[13] ~= '' and #queue >= tonumber(ARGV[13]) then
      return {'full'}
    end
    local joined = join_queue(KEYS[3], ARGV[1], now, waiter_ttl, ARGV[10], ARGV[9] == '1',
                              tonumber(ARGV[12]) or 0)
    local superseding = joined and ARGV[8] == '1'
    if superseding and supersede_others(KEYS[3], queue, ARGV[1], now, waiter_ttl) > 0 then
      wake(KEYS[3], KEYS[1], count, 0)  -- the places behind them may go now
    end
  end
  if quarantined then return {'quarantine', quarantine_until - now, cause} end
  return false
end
leave_queue(KEYS[3], ARGV[1])
if fence_type == 'string' then
  local value = redis.call('GET', KEYS[2])
  if not string.match(value, '^%d+$') then
    return redis.error_reply('WRONGTYPE fence string')  -- (not digits: -5, 1e3, text)
  end
  -- (as text: Lua's numbers are doubles) no token after 2**63-1
  if #value > 19 or (#value == 19 and value >= '9223372036854775807') then
    return {'exhausted'}
  end
end
local token, too_late = next_token(KEYS[2], epoch)
if too_late then return too_late end
local name = slot_key(KEYS[1], free)
redis.call('HSET', name, 'owner', ARGV[1], 'fencing_token', token, 'holder', ARGV[3],
           'acquired_at', ms(now), 'expires_at', ms(now + ttl))
if limit > 1 then redis.call('HSET', name, 'slot', free, 'limit', limit) end
if shared then redis.call('HSET', name, 'slot', free, 'mode', 'shared') end
redis.call('PEXPIRE', name, ttl)
if limit > 1 or shared then
  cover_slots(KEYS[4], shared and free + 1 or limit, ttl)
else
  redis.call('DEL', KEYS[4])
end
-- held again: a wake-up left beyond the slots still free would be a false one
if shared or live + 1 >= limit then
  redis.call('DEL', KEYS[3])
else
  redis.call('LTRIM', KEYS[3], -(limit - live - 1), -1)
end
return {token, now, now + ttl, free}
"""
)

# KEYS[1] = the lease's slot hash, KEYS[2] = limit; ARGV: owner, fencing_token, ttl_ms,
# the slots the limit record must cover (the limit; a shared lease's slot + 1)
# -> expires_at_ms, or nil when the lease is not ours/live
RENEW = (
    _PRELUDE
    + """
if lease_type == 'none' then return false end
local bad = bad_types({{KEYS[2], 'string', 'limit'}})
if bad then return bad end
local cur = redis.call('HMGET', KEYS[1], 'owner', 'fencing_token')
if cur[1] ~= ARGV[1] or cur[2] ~= ARGV[2] then return false end
local now = now_ms()
local ttl = tonumber(ARGV[3])
redis.call('HSET', KEYS[1], 'expires_at', ms(now + ttl))
redis.call('PEXPIRE', KEYS[1], ttl)
cover_slots(KEYS[2], tonumber(ARGV[4]), ttl)
return now + ttl
"""
)

# KEYS[1] = the lease's slot hash, KEYS[2] = wake, KEYS[3] = runs, KEYS[4] = success,
# KEYS[5] = limit, KEYS[6] = slot 0's hash.
# ARGV:
# - owner, fencing_token;
# - keep_ms (0 = delete now);
# - the run's record as JSON without ended_at ('' = none);
# - '1' when the run succeeded: it then becomes the key's newest success, unless a newer
#   one is there;
# - the slots the limit record must cover (as RENEW's).
# Returns 1 released (or kept for keep_ms), 0 no lease at all, -1 someone else's lease.
# Our broken lease is ours to release too, and is never kept. The record goes into the
# ledger whatever the lease's state (once per token), ended_at from Redis's clock.
RELEASE = (
    _PRELUDE
    + """
local bad = bad_types({{KEYS[2], 'list', 'wake'}, {KEYS[5], 'string', 'limit'}})
if bad then return bad end
local recording = ARGV[4] ~= ''
if recording then
  local bad = bad_types({{KEYS[3], 'zset', 'runs'}, {KEYS[4], 'string', 'success'}})
  if bad then return bad end
end
local limit = tonumber(ARGV[6])
local function release()
  if lease_type == 'none' then return 0 end
  local cur = redis.call('HMGET', KEYS[1], 'owner', 'fencing_token')
  local broken = cur[1] == BROKEN .. ARGV[1]
  if (cur[1] ~= ARGV[1] and not broken) or cur[2] ~= ARGV[2] then return -1 end
  local keep = tonumber(ARGV[3])
  if keep > 0 and not broken then  -- ('done': its command has ended, nothing runs under it)
    redis.call('HSET', KEYS[1], 'expires_at', ms(now_ms() + keep), 'done', '1')
    redis.call('PEXPIRE', KEYS[1], keep)
    cover_slots(KEYS[5], limit, keep)
    return 1
  end
  redis.call('DEL', KEYS[1])
  local count = math.max(limit, slot_count(KEYS[5]))
  if live_slots(KEYS[6], count) == 0 then redis.call('DEL', KEYS[5]) end
  wake(KEYS[2], KEYS[6], count, 1)
  return 1
end
local result = release()
-- (a score is a double: tokens of an epoch, above 2^53, share scores; the records' own
-- text, which begins with the token, tells them apart, and orders them within a score)
local function recorded(token)
  local head = '{"fencing_token": ' .. token .. ','
  for _, member in ipairs(redis.call('ZRANGEBYSCORE', KEYS[3], token, token)) do
    if string.sub(member, 1, #head) == head then return true end
  end
  return false
end
if recording and not recorded(ARGV[2]) then
  local record = string.sub(ARGV[4], 1, -2) .. ',"ended_at":' .. ms(now_ms()) .. '}'
  redis.call('ZADD', KEYS[3], ARGV[2], record)
  redis.call('ZREMRANGEBYRANK', KEYS[3], 0, -(LEDGER_KEEP + 1))
  if ARGV[5] == '1' then
    local newest = redis.call('GET', KEYS[4])
    local newest_token = newest and string.match(newest, '^{"fencing_token": (%d+),')
    if not newest_token or decimal_less(newest_token, ARGV[2]) then
      redis.call('SET', KEYS[4], record)
    end
  end
end
return result
""".replace("LEDGER_KEEP", str(LEDGER_KEEP))
)

# The live slots of the key whose fencing token is ARGV[1] ('' = every one), for break and
# force release; KEYS[2] = limit. Defines `matching`: {slot, name, token} per slot.
_MATCHING_SLOTS = """
local bad = bad_types({{KEYS[2], 'string', 'limit'}})
if bad then return bad end
local count = slot_count(KEYS[2])
local matching = {}
for slot = 0, count - 1 do
  local name = slot_key(KEYS[1], slot)
  local t, bad = key_type(name, 'hash', 'lease')
  if bad then return bad end
  if t == 'hash' then
    local token = redis.call('HGET', name, 'fencing_token')
    if ARGV[1] == '' or token == ARGV[1] then matching[#matching + 1] = {slot, name, token} end
  end
end
"""

# A lease hash whose expiry cannot be read: no PX (a tasklock's lease always has one), or
# an ``expires_at`` that is not a time. Without a PX it gets the longest a holder's lease
# could still be valid (model.UNREADABLE_EXPIRY_FLOOR_S; ``record``: the namespace's epoch
# record, whose max_ttl is the longest TTL granted); its ``expires_at`` then tells its PX.
# -> 1 when it changed the hash, else 0.
_BOUND_EXPIRY = (
    """
local function bound_expiry(name, record)
  local pttl = redis.call('PTTL', name)
  if pttl == -2 then return 0 end
  local expires = tonumber(redis.call('HGET', name, 'expires_at'))
  if pttl >= 0 and expires and expires >= 0 and expires <= LATEST_MS then return 0 end
  if pttl == -1 then
    local longest = tonumber(redis.call('HGET', record, 'max_ttl')) or 0
    if not (longest >= 0) then longest = 0 end
    pttl = math.floor(math.min(math.max(longest, FLOOR_MS), 1e12) + MARGIN_MS)
    redis.call('PEXPIRE', name, pttl)
  end
  redis.call('HSET', name, 'expires_at', ms(now_ms() + pttl))
  return 1
end
-- A live lease whose PX lies further ahead than any lease the namespace granted could have
-- (someone else set it), not one kept after its command ended (a hold may be longer, and
-- release --force frees that at once): bounded as one whose expiry cannot be read.
local function bound_forged(name, record)
  local longest = tonumber(redis.call('HGET', record, 'max_ttl')) or 0
  if not (longest >= 0) then longest = 0 end
  local bound = math.floor(math.min(math.max(longest, FLOOR_MS), 1e12) + MARGIN_MS)
  if redis.call('PTTL', name) > bound and redis.call('HGET', name, 'done') ~= '1' then
    redis.call('PEXPIRE', name, bound)
    redis.call('HSET', name, 'expires_at', ms(now_ms() + bound))
  end
end
""".replace("LATEST_MS", "253402300799999")
    .replace("FLOOR_MS", ms_of(UNREADABLE_EXPIRY_FLOOR_S))
    .replace("MARGIN_MS", ms_of(UNREADABLE_EXPIRY_MARGIN_S))
)

# KEYS[2] = limit, KEYS[3] = the epoch record; ARGV: fencing_token ('' = any), the holders'
# break channel without the token, who breaks them (JSON) -> per broken slot, its hash as
# a flat list (ordered by slot; empty: none matched). The first break's breaker stays; a
# slot whose expiry cannot be read gets a bounded one first (``bound_expiry``).
BREAK = (
    _PRELUDE
    + _MATCHING_SLOTS
    + _BOUND_EXPIRY
    + """
local out = {}
for _, slot in ipairs(matching) do
  bound_expiry(slot[2], KEYS[3])
  bound_forged(slot[2], KEYS[3])
  local owner = redis.call('HGET', slot[2], 'owner')
  if not is_broken(owner) then  -- (HSET keeps the TTL: the expiry is not extended)
    redis.call('HSET', slot[2], 'owner', BROKEN .. owner, 'broken_by', ARGV[3])
  end
  redis.call('PUBLISH', ARGV[2] .. slot[3], '1')
  out[#out + 1] = redis.call('HGETALL', slot[2])
end
return out
"""
)

# KEYS[1] = the epoch record, then lease hashes (slots of any key): ``bound_expiry`` on
# each (``sweep``) -> how many it changed
BOUND_EXPIRIES = (
    _PRELUDE  # (its check of KEYS[1]: the epoch record is a hash too)
    + _BOUND_EXPIRY
    + """
local changed = 0
for i = 2, #KEYS do
  if redis.call('TYPE', KEYS[i])['ok'] == 'hash' then
    changed = changed + bound_expiry(KEYS[i], KEYS[1])
  end
end
return changed
"""
)

# KEYS[2] = limit, KEYS[3] = wake; ARGV as BREAK -> per freed slot, its hash as a flat list
FORCE_RELEASE = (
    _PRELUDE
    + _MATCHING_SLOTS
    + """
local bad = bad_types({{KEYS[3], 'list', 'wake'}})
if bad then return bad end
local out = {}
for _, slot in ipairs(matching) do
  out[#out + 1] = redis.call('HGETALL', slot[2])
  redis.call('DEL', slot[2])
  redis.call('PUBLISH', ARGV[2] .. slot[3], '1')
end
if #out > 0 then
  if live_slots(KEYS[1], count) == 0 then redis.call('DEL', KEYS[2]) end
  wake(KEYS[3], KEYS[1], count, #out)
end
return out
"""
)

# KEYS[1] = the lease's slot hash; ARGV: owner, fencing_token -> 1 while that lease is ours
# and unbroken (live), else 0
INTACT = (
    _PRELUDE
    + """
if lease_type == 'none' then return 0 end
local cur = redis.call('HMGET', KEYS[1], 'owner', 'fencing_token')
if cur[1] == ARGV[1] and cur[2] == ARGV[2] then return 1 end
return 0
"""
)

# KEYS[2] = wake, KEYS[3] = limit: a waiter whose wait was cut short may have taken the
# last release's wake-up with it; while a slot is still free, one is left for the next.
PASS_ON = (
    _PRELUDE
    + """
local bad = bad_types({{KEYS[2], 'list', 'wake'}, {KEYS[3], 'string', 'limit'}})
if bad then return bad end
wake(KEYS[2], KEYS[1], slot_count(KEYS[3]), 1)
return 1
"""
)

# Read-only; KEYS[2] = limit -> per live slot, ordered: {slot, fencing_token, acquired_at,
# expires_at, holder, limit, pttl, 1 when broken else 0, mode} (false for a missing field)
SLOTS = (
    _PRELUDE
    + """
local bad = bad_types({{KEYS[2], 'string', 'limit'}})
if bad then return bad end
local rows = {}
for slot = 0, slot_count(KEYS[2]) - 1 do
  local name = slot_key(KEYS[1], slot)
  local t, bad = key_type(name, 'hash', 'lease')
  if bad then return bad end
  if t == 'hash' then
    local f = redis.call('HMGET', name, 'fencing_token', 'acquired_at', 'expires_at', 'holder',
                         'limit', 'owner', 'mode', 'done')
    local broken = f[6] and is_broken(f[6]) and 1 or 0
    rows[#rows + 1] = {slot, f[1], f[2], f[3], f[4], f[5], redis.call('PTTL', name), broken,
                       f[7], f[8]}
  end
end
return rows
"""
)

# KEYS[2] = wake, KEYS[3] = limit; ARGV: owner: leave the key's queue, and wake the waiter
# now first in it when a slot is free (our turn, had it come, is theirs).
LEAVE = (
    _PRELUDE
    + """
local bad = bad_types({{KEYS[2], 'list', 'wake'}, {KEYS[3], 'string', 'limit'}})
if bad then return bad end
leave_queue(KEYS[2], ARGV[1])
wake(KEYS[2], KEYS[1], slot_count(KEYS[3]), 1)
return 1
"""
)

# Read-only: for each KEYS[i] -> [fencing_token, acquired_at, expires_at, holder, limit,
# mode, done]
# (false for a missing field), 0 when the key is gone, or the type name of a foreign key.
# One JSON string per batch: decoding it is C-speed, where parsing 100,000 HGETALL replies
# in Python is not.
READ_MANY = """
local out = {}
for i, name in ipairs(KEYS) do
  local t = redis.call('TYPE', name)['ok']
  if t == 'hash' then
    out[i] = redis.call('HMGET', name, 'fencing_token', 'acquired_at', 'expires_at', 'holder',
                        'limit', 'mode', 'done')
  elseif t == 'none' then
    out[i] = 0
  else
    out[i] = t
  end
end
return cjson.encode(out)
"""

#: name -> source, as the store loads them.
# KEYS[1] = the epoch record -> {ms left, cause} of what keeps the namespace's keys from
# new holders now (``quarantine_state``), nil when nothing does. Writes nothing.
QUARANTINE = (
    _PRELUDE  # (its check of KEYS[1]: the epoch record is a hash too)
    + EPOCH_LUA
    + """
return quarantine_state(KEYS[1], now_ms())
"""
)

# KEYS[1] = the epoch record; ARGV: as the acquire's last one (``mark_new``)
# -> {'marked' or 'used', the epoch}
MARK_NEW = (
    _PRELUDE
    + EPOCH_LUA
    + """
return mark_new(KEYS[1], now_ms(), ARGV[1])
"""
)

SCRIPTS = {
    "acquire": ACQUIRE,
    "renew": RENEW,
    "release": RELEASE,
    "force_release": FORCE_RELEASE,
    "break": BREAK,
    "bound_expiries": BOUND_EXPIRIES,
    "intact": INTACT,
    "pass_on": PASS_ON,
    "slots": SLOTS,
    "waiters": WAITERS,
    "leave": LEAVE,
    "read_many": READ_MANY,
    "quarantine": QUARANTINE,
    "mark_new": MARK_NEW,
}
