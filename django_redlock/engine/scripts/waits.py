"""The scripts that keep the waiter sets outside an attempt: register, withdraw, and count
(inspection)."""

from __future__ import annotations

from .fragments import NOW_LUA, REGISTER_LUA
from .script import Script

# KEYS: waiter set; on the node waiters block on also the lock, the wake-up list and the
# hand-off reservation. ARGV: waiter id, registration TTL in ms.
# Registers a caller that queues without a failed attempt (a process that has just handed the
# name to a waiter): on the node waiters block on as EVAL, in the same write as its BLPOP (the
# wake-up connections load no scripts), on the others from a lock connection. It does not
# prune: such a caller has just released the name, and that release pruned. On the node
# waiters block on, a name that is free already (no holder, no reservation, no wake-up left)
# was released before this registration arrived, by a release that saw nobody to wake: it
# leaves a wake-up, so the BLPOP behind it returns at once instead of waiting a whole backoff
# step while the name stands free (a lost wake-up). Returns 1.
REGISTER = Script(
    "register",
    REGISTER_LUA
    + """
register(KEYS[1], ARGV[1], tonumber(ARGV[2]), false)
if KEYS[4] and redis.call('EXISTS', KEYS[2], KEYS[3], KEYS[4]) == 0 then
  redis.call('RPUSH', KEYS[3], '1')
  redis.call('PEXPIRE', KEYS[3], ARGV[2])
end
return 1
""",
)

# KEYS: per name, its waiter set and its hand-off reservation. ARGV: waiter id.
# A caller that won the lock on a quorum is no longer waiting: the nodes that answered "busy"
# registered it, so it withdraws there; so does a caller that gives up before its timeout
# (cancelled, interrupted, or the name is another kind's), from the sets of every name it
# waited for. A reservation left where this removed the last registration serves nobody (a
# woken waiter stays registered until it wins): it goes too, so a release that woke a caller
# who then gave up keeps the name from nobody. Returns how many registrations were removed.
WITHDRAW = Script(
    "withdraw",
    """
local removed = 0
for i = 1, #KEYS, 2 do
  local n = redis.pcall('ZREM', KEYS[i], ARGV[1])
  if type(n) == 'number' then
    removed = removed + n
    if n > 0 and redis.call('EXISTS', KEYS[i]) == 0 then
      redis.call('DEL', KEYS[i + 1])
    end
  end
end
return removed
""",
)

# KEYS: waiter sets. Returns, per key, how many registrations are still ahead (a key that is
# not a sorted set counts 0). Read-only; for inspection.
WAITING = Script(
    "waiting",
    NOW_LUA
    + """
local now = now_ms()
if not now then
  return redis.error_reply('cannot read the clock (TIME)')
end
local after = '(' .. string.format('%d', now)
local counts = {}
for i, key in ipairs(KEYS) do
  local n = redis.pcall('ZCOUNT', key, after, '+inf')
  counts[i] = type(n) == 'number' and n or 0
end
return counts
""",
)
