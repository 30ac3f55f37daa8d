"""Lua shared by several scripts: the node's clock, waiter registration, granting (``TAKE_LUA``)
and releasing (``RELEASE_LUA``)."""

from __future__ import annotations

# Lua shared by the scripts that keep the waiter sets. ``now_ms()`` is this node's clock in ms
# (nil if it cannot be read). ``register(key, waiter, ms, prune)`` adds (or refreshes)
# ``waiter`` in the waiter set ``key`` until ``ms`` from now, lets the set expire with its last
# registration and, with ``prune``, drops the registrations that have lapsed (a failed attempt
# prunes: a long hold sees no release that would).
# * ``TIME`` before a write needs scripts replicated by their effects: the default since
#   Redis 5 and the only mode since Redis 7 (a replica gets the ZADD with its score).
# * Waiter sets only make waiting fair and quick, never the lock safe, so their commands go
#   through ``redis.pcall``: an ACL user set up before they existed (no ZADD, TIME...) keeps
#   locking; its waiters are simply not registered and retry after their backoff.
NOW_LUA = """
local function now_ms()
  local clock = redis.pcall('TIME')
  if clock.err then
    return nil
  end
  return clock[1] * 1000 + math.floor(clock[2] / 1000)
end
"""
REGISTER_LUA = (
    NOW_LUA
    + """
local function register(key, waiter, ms, prune)
  local now = now_ms()
  if not now then
    return
  end
  if prune then
    redis.pcall('ZREMRANGEBYSCORE', key, '-inf', now)
  end
  redis.pcall('ZADD', key, now + ms, waiter)
  if redis.call('PTTL', key) < ms then
    redis.call('PEXPIRE', key, ms)
  end
end
"""
)

# Lua shared by ACQUIRE and PERMIT (ARGV as ACQUIRE's). ``trusted(fence)`` returns the fence
# hash's counter and longest TTL, or nil when this node's run_id is not ARGV[3] (restarted or
# new). ``free_slot(first, last, reserved, reservation)``: the first free slot of a semaphore
# among ``KEYS[first..last]`` when more than ``reserved`` are free (the rest are kept for
# woken waiters), else nil and the soonest a slot frees (ms; -2 none known; the reservation
# key's PTTL when the free ones are all reserved). ``busy(waiters, pttl, counter)`` registers
# a caller that will wait and answers "busy".
# ``won(...)`` uses up the reservation, stops the winner waiting and gives its token;
# ``take(key, ...)`` also sets ``key`` to the lock value; ``mark(key, value, ms)`` keeps a
# marker of several leases alive at least ``ms``; ``note_ttl`` records the longest TTL.
TAKE_LUA = (
    REGISTER_LUA
    + """
local function trusted(fence)
  local meta = redis.call('HMGET', fence, 'run_id', 'token', 'max_ttl')
  return meta[1] == ARGV[3], tonumber(meta[2]) or 0, tonumber(meta[3]) or 0
end
local function free_slot(first, last, reserved, reservation)
  local free, free_count, soonest = nil, 0, -2
  for k = first, last do
    local pttl = redis.call('PTTL', KEYS[k])
    if pttl == -2 then
      free = free or k
      free_count = free_count + 1
      if free_count > reserved then
        return free, soonest
      end
    elseif soonest == -2 or pttl < soonest then
      soonest = pttl
    end
  end
  if free_count > 0 then
    soonest = redis.call('PTTL', reservation)
  end
  return nil, soonest
end
local function busy(waiters, pttl, counter)
  if tonumber(ARGV[5]) > 0 then
    register(waiters, ARGV[7], tonumber(ARGV[5]), true)
  end
  return {0, counter, pttl}
end
local function note_ttl(fence, max_ttl)
  -- the fence hash keeps the longest TTL ever granted (the restart quarantine's length)
  if tonumber(ARGV[2]) > max_ttl then
    redis.call('HSET', fence, 'max_ttl', ARGV[2])
  end
end
local function won(fence, waiters, handoff, max_ttl)
  -- the caller wins: the reservation (nil: none, or one the caller counts down itself) is
  -- used up, it stops waiting, the counter gives a token
  if handoff then
    redis.call('DEL', handoff)
  end
  if ARGV[7] ~= '' then
    redis.pcall('ZREM', waiters, ARGV[7])  -- the winner stops waiting the moment it wins
  end
  note_ttl(fence, max_ttl)
  return redis.call('HINCRBY', fence, 'token', 1)
end
local function lock_value(token)
  -- string.format: plain concatenation would print a large token as 1.8e+15
  return ARGV[1] .. '|' .. string.format('%d', token) .. ARGV[4]
end
local function take(key, fence, waiters, handoff, max_ttl)
  local token = won(fence, waiters, handoff, max_ttl)
  redis.call('SET', key, lock_value(token), 'PX', ARGV[2])
  return token
end
local function mark(key, value, ms)
  -- a marker of several leases lives as long as the longest of them
  if redis.call('PTTL', key) < ms then
    redis.call('SET', key, value, 'PX', ms)
  end
end
"""
)

# KEYS: lock, waiter set, wake-up list, hand-off reservation.
# ARGV: owner, wake-up TTL in ms, reservation TTL in ms, "1" on the node waiters block on,
# registration TTL in ms (0 for a lease's release; > 0 when a failed attempt that will wait
# takes back what it got on this node: it registers as a waiter, like ACQUIRE), waiter id,
# "1" for a semaphore's permit (releases of several permits wake as many waiters), "2" for
# a write lease (every waiter is woken: the readers it kept out go in together), else "0".
# Compare-and-delete: deletes only a key whose owner part equals ARGV[1]. While a registration
# in the waiter set is still ahead, it reserves the name briefly for the waiter it wakes (so the
# releaser, which needs no wake-up, cannot take it straight back) and, on the node waiters block
# on, leaves one wake-up that exactly one blocked waiter (BLPOP) takes. Lapsed registrations are
# dropped; live ones stay: waiters still blocked stay covered for the next release.
# A semaphore's release (``slots``: its slot keys) counts in its reservation the slots promised
# to woken waiters (only woken callers may take those) and, when a free slot is left beyond
# them, answers 1, so the releaser tries at once instead of queueing: that is how a semaphore
# that fell below its permits (a free slot whose waiters all block in BLPOP, each release
# waking one) fills up again.
# Returns 2 when deleted and the waiters take every free slot (the releaser then queues behind
# them), 1 when deleted, 0 when the key is gone or owned by someone else.
RELEASE_LUA = (
    REGISTER_LUA
    + """
local function wake_permits(waiters, wake_list, handoff, wakes, slots)
-- a semaphore's: one waiter more may go, for the slot this release freed; the reservation
-- counts the slots promised to woken waiters (a woken winner takes one off). A woken waiter
-- stays registered until it wins: only a waiter beyond those promised a slot already, and
-- beyond the wake-ups still pending, gets one
local waiting = redis.call('ZCARD', waiters)
local before = tonumber(redis.call('GET', handoff)) or 0
local promised = math.min(waiting, before + 1)
redis.call('SET', handoff, promised, 'PX', ARGV[3])
if wakes and waiting > math.max(before, redis.call('LLEN', wake_list)) then
  redis.call('RPUSH', wake_list, '1')
  redis.call('PEXPIRE', wake_list, ARGV[2])
end
return #slots - redis.call('EXISTS', unpack(slots)) > promised and 1 or 2
end
local function wake(waiters, wake_list, handoff, wakes, slots)
if redis.call('EXISTS', waiters) == 0 then
  return 1  -- the common case: nobody waits, no clock read
end
local now = now_ms()
local lapsed = now and redis.pcall('ZREMRANGEBYSCORE', waiters, '-inf', now)
if type(lapsed) ~= 'number' then
  return 1  -- unreadable (not a sorted set; an ACL without TIME): treated as nobody waiting
end
if lapsed > 0 and redis.call('EXISTS', waiters) == 0 then
  return 1  -- every registration had lapsed (an empty set is deleted)
end
if slots then
  return wake_permits(waiters, wake_list, handoff, wakes, slots)
end
redis.call('SET', handoff, '1', 'PX', ARGV[3])
if wakes then
  if ARGV[7] == '0' then
    redis.call('DEL', wake_list)  -- a lock: one wake-up is enough
    redis.call('RPUSH', wake_list, '1')
  else
    -- a write lease: every waiter may go (the readers it kept out go in together)
    local missing = redis.call('ZCARD', waiters) - redis.call('LLEN', wake_list)
    for _ = 1, missing do
      redis.call('RPUSH', wake_list, '1')
    end
  end
  redis.call('PEXPIRE', wake_list, ARGV[2])
end
return 2
end
local function release(lock, waiters, wake_list, handoff, wakes, slots)
local value = redis.call('GET', lock)
local mine = value and string.sub(value, 1, #ARGV[1] + 1) == ARGV[1] .. '|'
if tonumber(ARGV[5]) > 0 then
  -- a failed attempt's give-back that registers the caller: granted here (the name was free),
  -- it lost the quorum to nodes the holder's release had not reached yet. On the node waiters
  -- block on, that release ran before the caller was registered and woke nobody, so a caller
  -- registered here only now leaves the wake-up itself (unless one is pending or the name is
  -- reserved for a woken waiter): else it blocks a whole backoff step while the name is free
  local fresh = mine and wakes and redis.pcall('ZSCORE', waiters, ARGV[6]) == false
  if mine then
    redis.call('DEL', lock)
  end
  register(waiters, ARGV[6], tonumber(ARGV[5]), true)
  if fresh and redis.call('EXISTS', wake_list, handoff) == 0 then
    -- the caller's own: it serves nobody once the caller's registration lapses
    redis.call('RPUSH', wake_list, '1')
    redis.call('PEXPIRE', wake_list, math.min(tonumber(ARGV[2]), tonumber(ARGV[5])))
  end
  return mine and 1 or 0
end
if not mine then
  return 0
end
redis.call('DEL', lock)
return wake(waiters, wake_list, handoff, wakes, slots)
end
"""
)


def fence_read(fence: int) -> str:
    """Lua: ``meta``, the fence hash ``KEYS[fence]``'s run_id, counter and longest TTL (what
    ``trusted()`` reads; :data:`TRUST_READ` makes its answer of it)."""
    return f"local meta = redis.call('HMGET', KEYS[{fence}], 'run_id', 'token', 'max_ttl')\n"


def token_drawn(fence: int, waiting: tuple[int, ...], indent: str) -> str:
    """Lua lines (each indented by ``indent``) that do what ``won()`` does for a caller no
    release woke, before the shared functions exist: the caller stops waiting in the sets
    ``KEYS[waiting]``, the fence hash ``KEYS[fence]`` (read into ``meta``) notes the TTL and
    gives the token, in the local ``token``."""
    lines = [
        "if ARGV[7] ~= '' then  -- the winner stops waiting the moment it wins",
        *(f"  redis.pcall('ZREM', KEYS[{k}], ARGV[7])" for k in waiting),
        "end",
        "if tonumber(ARGV[2]) > (tonumber(meta[3]) or 0) then",
        f"  redis.call('HSET', KEYS[{fence}], 'max_ttl', ARGV[2])",
        "end",
        f"local token = redis.call('HINCRBY', KEYS[{fence}], 'token', 1)",
    ]
    return "".join(f"{indent}{line}\n" for line in lines)


#: Lua: the lock value of the ``token`` drawn (as ``lock_value()``).
VALUE_OF_TOKEN = "ARGV[1] .. '|' .. string.format('%d', token) .. ARGV[4]"


def grant_if_free(
    fence: int, key: int, reservation: int, waiting: tuple[int, ...], mark: str = ""
) -> str:
    """Lua that grants at once on a trusted node where neither ``KEYS[key]`` nor the hand-off
    reservation ``KEYS[reservation]`` exists, before the script defines any of the functions
    its other paths share (each definition costs the node time on every call): the caller
    stops waiting in the sets ``KEYS[waiting]``, the fence hash ``KEYS[fence]`` notes the
    TTL and gives the token, ``KEYS[key]`` takes the lock value (ending with ``mark``), as
    ``take()`` does (a woken caller's reservation does not exist here: none to use up).
    Leaves ``meta`` (the fence hash's run_id, counter and longest TTL, for :data:`TRUST_READ`)
    and ``present`` (how many of the two keys exist; false on a node not trusted)."""
    value = VALUE_OF_TOKEN + (f" .. '{mark}'" if mark else "")
    exists = f"redis.call('EXISTS', KEYS[{key}], KEYS[{reservation}])"
    return f"""{fence_read(fence)}local present = meta[1] == ARGV[3] and {exists}
if present == 0 then
{token_drawn(fence, waiting, "  ")}  redis.call('SET', KEYS[{key}], {value}, 'PX', ARGV[2])
  return {{1, token, 0}}
end
"""


#: What ``trusted()`` gives, from the ``meta`` that :func:`grant_if_free` read.
TRUST_READ = "meta[1] == ARGV[3], tonumber(meta[2]) or 0, tonumber(meta[3]) or 0"
