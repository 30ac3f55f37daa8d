"""Lua of ``limits()``: one permit of each of several semaphores, all or nothing, and the
release of such a set in one call per node. Semaphores are stored as :mod:`.primitives`
describes (``PERMIT``): N slot keys and a ``semaphore|<N>`` marker at the name's own key, so
a permit taken here is a permit of ``semaphore(name, N)`` and the other way round."""

from __future__ import annotations

from .fragments import RELEASE_LUA, TAKE_LUA
from .script import Script, taking

# KEYS: fence, then for each semaphore: waiter set, hand-off reservation, the name's key
# (marker), then its N slot keys in the order PERMIT tries them (3 + N keys each).
# ARGV: as ACQUIRE, but ARGV[6] is the position (from 1) of the semaphore a release woke this
# caller for ('0': none; only that one's reservation may be used up), then each semaphore's N.
# A node grants a permit of every semaphore or of none, so no caller holds a permit while it
# waits for another. Returns {1, first token, k1, k2, ...} when granted (semaphore i's token is
# first + i - 1; ki: the position of its slot, from 1), {0, counter, pttl, i} when semaphore i
# has no free slot (the caller registers as its waiter), {-1, counter, 0, 0} untrusted,
# {-2, counter, 0, i} when name i is a lock's or a semaphore's with another N.
ACQUIRE_LIMITS = taking(
    "acquire_limits",
    TAKE_LUA,
    """local chosen, base = {}, 2
for i = 8, #ARGV do
  local which, n = i - 7, tonumber(ARGV[i])
  local found = redis.call('GET', KEYS[base + 2])
  if found and found ~= 'semaphore|' .. ARGV[i] then
    return {-2, counter, 0, which}
  end
  local reserved = 0
  if ARGV[6] ~= tostring(which) then
    reserved = tonumber(redis.call('GET', KEYS[base + 1])) or 0
  end
  local free, soonest = free_slot(base + 3, base + 2 + n, reserved, KEYS[base + 1])
  if not free then
    local reply = busy(KEYS[base], soonest, counter)
    reply[4] = which
    return reply
  end
  chosen[which] = free
  base = base + 3 + n
end
-- a free slot in every semaphore: one counter step per semaphore, handed out in order
local count = #ARGV - 7
local last = redis.call('HINCRBY', KEYS[1], 'token', count)
local first = last - count + 1
local reply = {1, first}
base = 2
for i = 8, #ARGV do
  local which, n = i - 7, tonumber(ARGV[i])
  redis.call('SET', KEYS[chosen[which]], lock_value(first + which - 1), 'PX', ARGV[2])
  if ARGV[6] == tostring(which) and redis.call('DECR', KEYS[base + 1]) <= 0 then
    redis.call('DEL', KEYS[base + 1])  -- a woken winner uses up one reserved slot
  end
  if ARGV[7] ~= '' then
    redis.pcall('ZREM', KEYS[base], ARGV[7])
  end
  mark(KEYS[base + 2], 'semaphore|' .. ARGV[i], tonumber(ARGV[2]))
  reply[#reply + 1] = chosen[which] - base - 2
  base = base + 3 + n
end
note_ttl(KEYS[1], max_ttl)
return reply
""",
    width=4,
)

# KEYS: for each permit of a set (one owner): waiter set, wake-up list, hand-off reservation,
# then its semaphore's slot keys, the one it holds first (3 + N keys each). ARGV: as RELEASE
# (ARGV[7] '1': a permit's), but ARGV[4] has one '1'/'0' per permit (whether this node is the
# one its waiters block on), then each permit's N. RELEASE_PERMIT of every permit in one call;
# returns the replies, one per permit.
RELEASE_PERMITS = Script(
    "release_permits",
    RELEASE_LUA
    + """
local replies, base = {}, 1
for i = 8, #ARGV do
  local which, n = i - 7, tonumber(ARGV[i])
  local slots, lock = {}, KEYS[base + 3]
  for k = base + 3, base + 2 + n do
    slots[#slots + 1] = KEYS[k]
  end
  for k = base + 3, base + 2 + n do
    local value = redis.call('GET', KEYS[k])
    if value and string.sub(value, 1, #ARGV[1] + 1) == ARGV[1] .. '|' then
      lock = KEYS[k]
      break
    end
  end
  local wakes = string.sub(ARGV[4], which, which) == '1'
  replies[which] = release(lock, KEYS[base], KEYS[base + 1], KEYS[base + 2], wakes, slots)
  base = base + 3 + n
end
return replies
""",
)
