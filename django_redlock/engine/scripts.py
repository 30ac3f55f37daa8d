"""Lua scripts run on every node, as commented module constants.

The keys they touch are named in :mod:`.keyspace`. Each script's reply codes are named
constants right after it; the plans compare replies with those names, never bare numbers.

* ``<prefix>__waiters__:<name>`` is a sorted set of the callers waiting for the name: each
  failed attempt of a caller that will wait adds (or refreshes) its waiter id, scored with the
  moment its registration lapses (``TIME`` of that node + at most 1 s); a caller that wins
  removes itself. A release wakes one waiter only while a registration is still ahead, so a
  waiter that won, gave up or died stops counting (at once, at its deadline, within 1 s).
* ``<prefix>__wake__:<name>`` is a one-element list pushed by that release on the node the
  name's waiters block on; a waiter blocked in ``BLPOP`` on it wakes (exactly one per release).
* ``<prefix>__handoff__:<name>`` is set by that release for a few milliseconds: only a woken
  waiter may take the name meanwhile, so the lock changes hands instead of going straight
  back to the releaser.
* ``<prefix>__fence__`` is never deleted by release, clear or force-release, so Redis memory
  stays flat however many names are locked.

A node whose ``run_id`` field differs from the ``run_id`` the client read from ``INFO`` on
connect has restarted (or is new): it votes for nothing until :data:`REJOIN` marks it again.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Script:
    """A Lua script and its SHA1, called with EVALSHA (EVAL when the node lost it)."""

    name: str
    source: str
    sha: str = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "sha", hashlib.sha1(self.source.encode()).hexdigest())


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
_NOW = """
local function now_ms()
  local clock = redis.pcall('TIME')
  if clock.err then
    return nil
  end
  return clock[1] * 1000 + math.floor(clock[2] / 1000)
end
"""
_REGISTER = (
    _NOW
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
# new). ``busy(waiters, pttl, counter)`` registers a caller that will wait and answers "busy".
# ``won(...)`` uses up the reservation, stops the winner waiting and gives its token;
# ``take(key, ...)`` also sets ``key`` to the lock value; ``mark(key, value, ms)`` keeps a
# marker of several leases alive at least ``ms``; ``note_ttl`` records the longest TTL.
_TAKE = (
    _REGISTER
    + """
local function trusted(fence)
  local meta = redis.call('HMGET', fence, 'run_id', 'token', 'max_ttl')
  return meta[1] == ARGV[3], tonumber(meta[2]) or 0, tonumber(meta[3]) or 0
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

# KEYS: lock, fence, waiter set, hand-off reservation.
# ARGV: owner, ttl_ms, run_id, value suffix ("|acquired_ms|host|pid"), how long the caller's
# registration as a waiter lives (ms; 0 = the caller will not wait, do not register), "1" if
# this caller was woken by a release (else "0"), the caller's waiter id ('' when it never waits).
# Returns {1, token, 0} when acquired (token = the node's counter after the increment; the
# caller no longer counts as a waiter), {0, counter, pttl} when the name is busy or reserved for
# a woken waiter (and registers the caller as a waiter, if it will wait), {-1, counter, 0} when
# this node is not trusted.
ACQUIRE = Script(
    "acquire",
    _TAKE
    + """
local ok, counter, max_ttl = trusted(KEYS[2])
if not ok then
  return {-1, counter, 0}
end
local woken = ARGV[6] == '1'
-- the common case, in one call: neither the lock nor a hand-off reservation exists
if redis.call('EXISTS', KEYS[1], KEYS[4]) > 0 then
  local pttl = redis.call('PTTL', KEYS[1])
  if pttl == -2 and not woken then
    pttl = redis.call('PTTL', KEYS[4])  -- free, but handed to the waiter a release woke
  end
  if pttl ~= -2 then
    if string.sub(redis.call('GET', KEYS[1]) or '', 1, 10) == 'semaphore|' then
      return {-2, counter, 0}  -- the name is a semaphore's (only looked at when busy)
    end
    return busy(KEYS[3], pttl, counter)
  end
end
-- only a woken caller can find a reservation to use up
return {1, take(KEYS[1], KEYS[2], KEYS[3], woken and KEYS[4] or nil, max_ttl), 0}
""",
)
#: ACQUIRE reply statuses (the first element of its reply).
GRANTED, BUSY, UNTRUSTED, OTHER_KIND = 1, 0, -1, -2

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
_RELEASE = (
    _REGISTER
    + """
local function wake_permits(waiters, wake_list, handoff, wakes, slots)
-- a semaphore's: one waiter more may go, for the slot this release freed; the reservation
-- counts the slots promised to woken waiters (a woken winner takes one off)
local waiting = redis.call('ZCARD', waiters)
local promised = math.min(waiting, (tonumber(redis.call('GET', handoff)) or 0) + 1)
redis.call('SET', handoff, promised, 'PX', ARGV[3])
if wakes and waiting > redis.call('LLEN', wake_list) then
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
  if mine then
    redis.call('DEL', lock)
  end
  register(waiters, ARGV[6], tonumber(ARGV[5]), true)
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
RELEASE = Script(
    "release", _RELEASE + "return release(KEYS[1], KEYS[2], KEYS[3], KEYS[4], ARGV[4] == '1')\n"
)

#: RELEASE replies.
NOT_HELD, RELEASED, HANDED_OFF = 0, 1, 2

# KEYS: lock, fence (and, for a permit, its semaphore's marker). ARGV: owner, ttl_ms, run_id.
# Compare-and-pexpire on a trusted node. Returns 1 when renewed, 0 when not held, -1 untrusted.
EXTEND = Script(
    "extend",
    """
if redis.call('HGET', KEYS[2], 'run_id') ~= ARGV[3] then
  return -1
end
local value = redis.call('GET', KEYS[1])
if value and string.sub(value, 1, #ARGV[1] + 1) == ARGV[1] .. '|' then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  if KEYS[3] and redis.call('PTTL', KEYS[3]) < tonumber(ARGV[2]) then
    redis.call('PEXPIRE', KEYS[3], ARGV[2])  -- a permit's semaphore marker
  end
  local max_ttl = tonumber(redis.call('HGET', KEYS[2], 'max_ttl')) or 0
  if tonumber(ARGV[2]) > max_ttl then
    redis.call('HSET', KEYS[2], 'max_ttl', ARGV[2])
  end
  return 1
end
return 0
""",
)
#: EXTEND replies: RENEWED, NOT_HELD (above) or UNTRUSTED (above).
RENEWED = 1

# KEYS: fence, lock (several for ``lock_many``: all must be held). ARGV: token, run_id,
# owner, "1" for a permit (strict).
# Token write-back: raise the counter to ARGV[1] if it is lower ("set if greater"). Returns 1
# when the caller still holds the lock here, 0 when it does not (force-released or expired
# since its acquire: someone else may have taken this node and read the old counter, so it
# must not count towards the quorum that hands out this token), -1 when the node is not trusted.
# Strict (permits, which may be held side by side): the counter must still be below the token,
# else 0: another permit may have been handed the same token through this node, and any two
# quorums share a node, so of two permits given one token at most one confirms it.
RAISE = Script(
    "raise",
    """
if redis.call('HGET', KEYS[1], 'run_id') ~= ARGV[2] then
  return -1
end
local counter = tonumber(redis.call('HGET', KEYS[1], 'token')) or 0
if counter < tonumber(ARGV[1]) then
  redis.call('HSET', KEYS[1], 'token', ARGV[1])
elseif ARGV[4] == '1' then
  return 0  -- strict: another caller reached this token here first
end
for i = 2, #KEYS do
  local value = redis.call('GET', KEYS[i])
  if not (value and string.sub(value, 1, #ARGV[3] + 1) == ARGV[3] .. '|') then
    return 0
  end
end
return 1
""",
)
#: RAISE replies: STILL_HELD, NOT_HELD (above) or UNTRUSTED (above).
STILL_HELD = 1

# KEYS: fence. ARGV: run_id, floor.
# Make a restarted or new node trusted again: counter = max(counter, floor), run_id = ARGV[1];
# 'joined' keeps the counter it rejoined with (the tokens drawn since are counter - joined).
# Returns the counter.
REJOIN = Script(
    "rejoin",
    """
local counter = tonumber(redis.call('HGET', KEYS[1], 'token')) or 0
if counter < tonumber(ARGV[2]) then
  counter = tonumber(ARGV[2])
end
redis.call('HSET', KEYS[1], 'token', string.format('%d', counter), 'joined',
           string.format('%d', counter), 'run_id', ARGV[1])
return counter
""",
)

# KEYS: fence. Returns {run_id or '', counter, max_ttl, exists(0/1), joined (-1: unknown)}.
PROBE = Script(
    "probe",
    """
local meta = redis.call('HMGET', KEYS[1], 'run_id', 'token', 'max_ttl', 'joined')
return {meta[1] or '', tonumber(meta[2]) or 0, tonumber(meta[3]) or 0,
        redis.call('EXISTS', KEYS[1]), tonumber(meta[4]) or -1}
""",
)

# KEYS: lock, fence, wake-up list, the name's readers (of a read-write lock). ARGV: expected
# value ('' = any owner), wake-up TTL in ms.
# Force-release: delete whatever holds the name (or only the expected value), advance the
# counter so the evicted holder's token is older than every later one, and wake one waiter.
# Readers' marker: every read lease goes with it (else a reader's renewal would mark the name
# "readers" again over the writer that came next). Returns 1 when a key was deleted, 0 otherwise.
FORCE_RELEASE = Script(
    "force_release",
    """
local value = redis.call('GET', KEYS[1])
if not value or (ARGV[1] ~= '' and value ~= ARGV[1]) then
  return 0
end
redis.call('DEL', KEYS[1], KEYS[3])
if string.sub(value, 1, 7) == 'rwlock|' then
  redis.call('DEL', KEYS[4])
end
if redis.call('HEXISTS', KEYS[2], 'token') == 1 then
  redis.call('HINCRBY', KEYS[2], 'token', 1)
end
redis.call('RPUSH', KEYS[3], '1')
redis.call('PEXPIRE', KEYS[3], ARGV[2])
return 1
""",
)
#: FORCE_RELEASE replies: DELETED, or NOT_HELD (above).
DELETED = 1

# KEYS: waiter set. ARGV: waiter id, registration TTL in ms.
# Registers a caller that queues without a failed attempt (a process that has just handed the
# name to a waiter): on the node waiters block on as EVAL, in the same write as its BLPOP (the
# wake-up connections load no scripts), on the others from a lock connection. It does not
# prune: such a caller has just released the name, and that release pruned. Returns 1.
REGISTER = Script(
    "register",
    _REGISTER
    + """
register(KEYS[1], ARGV[1], tonumber(ARGV[2]), false)
return 1
""",
)

# KEYS: waiter sets. ARGV: waiter id.
# A caller that won the lock on a quorum is no longer waiting: the nodes that answered "busy"
# registered it, so it withdraws there; so does a caller that gives up before its timeout
# (cancelled, interrupted, or the name is another kind's), from the sets of every name it
# waited for. Returns how many registrations were removed.
WITHDRAW = Script(
    "withdraw",
    """
local removed = 0
for i = 1, #KEYS do
  local n = redis.pcall('ZREM', KEYS[i], ARGV[1])
  if type(n) == 'number' then
    removed = removed + n
  end
end
return removed
""",
)

# KEYS: waiter sets. Returns, per key, how many registrations are still ahead (a key that is
# not a sorted set counts 0). Read-only; for inspection.
WAITING = Script(
    "waiting",
    _NOW
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
