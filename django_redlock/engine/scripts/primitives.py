"""Lua scripts of the other primitives: semaphore permits, ``lock_many`` sets and
read-write locks. They build on the shared Lua of :mod:`.fragments` (granting, waiting, waking)
and are loaded with the others (``ALL_SCRIPTS``)."""

from __future__ import annotations

from .fragments import (
    RELEASE_LUA,
    TAKE_LUA,
    TRUST_READ,
    VALUE_OF_TOKEN,
    fence_read,
    grant_if_free,
    token_drawn,
)
from .script import Script, taking

# KEYS: fence, then for each name: lock, waiter set, hand-off reservation (three keys each).
# ARGV: as ACQUIRE. All or nothing (``lock_many``): grants every name or none. Returns {1,
# first token, 0} when granted (the names' tokens are first, first + 1, ... in KEYS order),
# {0, counter, pttl, i} when name i (from 1) is busy or reserved for a woken waiter (the caller
# registers as that name's waiter), {-1, counter, 0, 0} untrusted, {-2, counter, 0, i} when
# name i is a semaphore's.
ACQUIRE_MANY = taking(
    "acquire_many",
    TAKE_LUA,
    """local looked = {}  -- the locks, and the reservations unless a release woke this caller
for i = 2, #KEYS, 3 do
  looked[#looked + 1] = KEYS[i]
  if ARGV[6] ~= '1' then
    looked[#looked + 1] = KEYS[i + 2]
  end
end
local taken = redis.call('EXISTS', unpack(looked))
for i = 2, #KEYS, 3 do
  if taken == 0 then
    break  -- the common case: all free, found with one or two calls
  end
  local pttl = redis.call('PTTL', KEYS[i])
  if pttl == -2 and ARGV[6] ~= '1' then
    pttl = redis.call('PTTL', KEYS[i + 2])
  end
  if pttl ~= -2 then
    local which = (i + 1) / 3
    if string.sub(redis.call('GET', KEYS[i]) or '', 1, 10) == 'semaphore|' then
      return {-2, counter, 0, which}
    end
    local reply = busy(KEYS[i + 1], pttl, counter)
    reply[4] = which
    return reply
  end
end
-- every name is free: one counter step per name, handed out in order
local count = (#KEYS - 1) / 3
local last = redis.call('HINCRBY', KEYS[1], 'token', count)
local first = last - count + 1
for i = 2, #KEYS, 3 do
  redis.call('SET', KEYS[i], lock_value(first + (i - 2) / 3), 'PX', ARGV[2])
  if ARGV[6] == '1' then
    redis.call('DEL', KEYS[i + 2])  -- a woken caller uses up the reservation it may have had
  end
  if ARGV[7] ~= '' then
    redis.pcall('ZREM', KEYS[i + 1], ARGV[7])
  end
end
note_ttl(KEYS[1], max_ttl)
return {1, first, 0}
""",
    width=4,
)

# A semaphore of N permits is N slots, each a lock of its own: ``<prefix>__permit__:<k>:<name>``
# (k = 0..N-1), and a marker at the name's own key, ``semaphore|<N>``, that lives as long as
# the longest permit granted or renewed through it (so the name cannot be taken as a lock, or
# with another N, meanwhile). One permit is one slot held on a quorum of nodes: two holders of
# a slot exclude each other as two holders of a lock do, so at most N permits are valid.
# KEYS: fence, waiter set, hand-off reservation, the name's key (marker), then the N slot keys
# in the order they are tried (the same for every caller and node: the plan explains why).
# ARGV: as ACQUIRE, then N.
# Returns {1, token, k} (k: the position in KEYS of the slot granted, from 1), {0, counter,
# pttl} when every slot is taken (pttl: the soonest a slot frees) or the free ones are
# reserved for woken waiters, {-1, counter, 0} untrusted, {-2, counter, 0} when the name is
# a lock's or a semaphore's with another N.
# PERMIT's common case first, as ``grant_if_free``: on a trusted node, a caller no release woke,
# no slot reserved, the marker the semaphore's (or none): the first free slot is granted before
# the shared functions are defined. When every slot is taken, the general path below goes on
# from what this read (``found``; ``full``: the soonest a slot frees, as ``free_slot`` gives it
# with nothing reserved).
_PERMIT_OPEN = f"""{fence_read(1)}local here = meta[1] == ARGV[3]
local marker = 'semaphore|' .. ARGV[8]
local found = here and redis.call('GET', KEYS[4])
local full = nil
if here and (not found or found == marker) and ARGV[6] ~= '1'
    and redis.call('EXISTS', KEYS[3]) == 0 then
  full = -2
  for k = 5, #KEYS do
    local pttl = redis.call('PTTL', KEYS[k])
    if pttl == -2 then
      local ms = tonumber(ARGV[2])
{token_drawn(1, (2,), "      ")}\
      redis.call('SET', KEYS[k], {VALUE_OF_TOKEN}, 'PX', ARGV[2])
      if not found or redis.call('PTTL', KEYS[4]) < ms then
        redis.call('SET', KEYS[4], marker, 'PX', ms)
      end
      return {{1, token, k - 4}}
    elseif full == -2 or pttl < full then
      full = pttl
    end
  end
end
"""
#: PERMIT after the trust check, with ``marker``, ``found`` and ``full`` read.
PERMIT_BODY = """if found and found ~= marker then
  return {-2, counter, 0}
end
-- a release that woke waiters reserved a free slot for each: others may take a slot only
-- while one more is free
local woken = ARGV[6] == '1'
local free, soonest = nil, full
if not full then
  local reserved = woken and 0 or (tonumber(redis.call('GET', KEYS[3])) or 0)
  free, soonest = free_slot(5, #KEYS, reserved, KEYS[3])
end
if not free then
  return busy(KEYS[2], soonest, counter)
end
local token = take(KEYS[free], KEYS[1], KEYS[2], nil, max_ttl)
if woken and redis.call('DECR', KEYS[3]) <= 0 then
  redis.call('DEL', KEYS[3])  -- a woken winner uses up one reserved slot
end
mark(KEYS[4], marker, tonumber(ARGV[2]))
return {1, token, free - 4}
"""
PERMIT = taking("permit", _PERMIT_OPEN + TAKE_LUA, PERMIT_BODY, trust=TRUST_READ)

# KEYS: waiter set, wake-up list, hand-off reservation, then every slot key of the semaphore,
# those the permit may hold first. ARGV: as RELEASE. RELEASE on the slot that holds the
# owner's value (the first one, if any: a permit whose slot is unknown, its acquire having got
# no reply, passes every slot as one it may hold); the slots tell whether a free one is left
# for its releaser.
# RELEASE_PERMIT's common case first (a lease's release, nobody waiting): the slot that holds
# the owner's value is deleted before the shared functions are defined, as ``release()`` would.
_PERMIT_RELEASE_UNWATCHED = """if tonumber(ARGV[5]) == 0 and redis.call('EXISTS', KEYS[1]) == 0 then
  for i = 4, #KEYS do
    local value = redis.call('GET', KEYS[i])
    if value and string.sub(value, 1, #ARGV[1] + 1) == ARGV[1] .. '|' then
      redis.call('DEL', KEYS[i])
      return 1
    end
  end
  return 0
end
"""
#: RELEASE_PERMIT after the shared functions.
PERMIT_RELEASE_BODY = """
local slots, lock = {}, KEYS[4]
for i = 4, #KEYS do
  slots[#slots + 1] = KEYS[i]
end
for i = 4, #KEYS do
  local value = redis.call('GET', KEYS[i])
  if value and string.sub(value, 1, #ARGV[1] + 1) == ARGV[1] .. '|' then
    lock = KEYS[i]
    break
  end
end
return release(lock, KEYS[1], KEYS[2], KEYS[3], ARGV[4] == '1', slots)
"""
RELEASE_PERMIT = Script(
    "release_permit", _PERMIT_RELEASE_UNWATCHED + RELEASE_LUA + PERMIT_RELEASE_BODY
)

# A read-write lock ``<name>`` (``read_lock``/``write_lock``): readers are the members of the
# sorted set ``<prefix>__readers__:<name>`` (owner -> when its read lease lapses, ms on the
# node's clock); while any is there, the name's own key holds the marker ``rwlock|readers``,
# living as long as the longest of them (so a plain lock or a writer sees the name taken). A
# writer holds the name's own key like a lock, its value ending with ``|write``. Writers that
# wait register in ``<prefix>__writers__:<name>`` (waiter id -> when the registration lapses):
# while one is there, new readers are kept out (writer preference).
# KEYS (READ and WRITE): fence, readers, the name's key, waiter set, hand-off reservation,
# waiting writers. ARGV: as ACQUIRE. Replies as ACQUIRE ({-2, ...} when the name is a
# semaphore's).
RW_LUA = (
    TAKE_LUA
    + """
local function held_by(key)
  -- 'lock' (a writer or a plain lock), 'readers', 'semaphore' or nil
  local value = redis.call('GET', key)
  if not value then
    return nil
  end
  if string.sub(value, 1, 10) == 'semaphore|' then
    return 'semaphore'
  end
  if string.sub(value, 1, 7) == 'rwlock|' then
    return 'readers'
  end
  return 'lock'
end
local function live_readers(readers, now)
  redis.call('ZREMRANGEBYSCORE', readers, '-inf', now)
  return redis.call('ZCARD', readers)
end
local function refused(counter)
  -- the reply when the name is a semaphore's or held like a lock (else nil), and its holder
  local holder = held_by(KEYS[3])
  if holder == 'semaphore' then
    return {-2, counter, 0}, holder
  end
  if holder == 'lock' then
    return busy(KEYS[4], redis.call('PTTL', KEYS[3]), counter), holder
  end
  return nil, holder
end
"""
)
# READ's common case first, as ``grant_if_free``: a trusted node where the name is free or
# held by readers, no hand-off reservation and no writer waiting: the read lease is granted as
# the general path below grants it, before the shared functions are defined.
_READ_OPEN = f"""{fence_read(1)}local here = meta[1] == ARGV[3]
local held = here and redis.call('GET', KEYS[3])
if here and (not held or held == 'rwlock|readers')
    and redis.call('EXISTS', KEYS[5], KEYS[6]) == 0 then
  local clock = redis.pcall('TIME')
  if not clock.err then
    local now = clock[1] * 1000 + math.floor(clock[2] / 1000)
    local ms = tonumber(ARGV[2])
{token_drawn(1, (4,), "    ")}\
    redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now)  -- lapsed read leases go
    redis.call('ZADD', KEYS[2], now + ms, ARGV[1])
    if redis.call('PTTL', KEYS[2]) < ms then
      redis.call('PEXPIRE', KEYS[2], ms)
    end
    if not held or redis.call('PTTL', KEYS[3]) < ms then
      redis.call('SET', KEYS[3], 'rwlock|readers', 'PX', ms)
    end
    return {{1, token, 0}}
  end
end
"""
#: READ after the trust check (and ``RW_LUA``).
READ_BODY = """local refusal = refused(counter)
if refusal then
  return refusal
end
local now = now_ms()
local woken = ARGV[6] == '1'
-- the common case, in one call: no hand-off reservation and no writer waiting
if redis.call('EXISTS', KEYS[5], KEYS[6]) > 0 then
  redis.call('ZREMRANGEBYSCORE', KEYS[6], '-inf', now)
  if not woken then
    local reserved = redis.call('PTTL', KEYS[5])
    if reserved ~= -2 then
      return busy(KEYS[4], reserved, counter)
    end
    if redis.call('ZCARD', KEYS[6]) > 0 then
      return busy(KEYS[4], 1, counter)  -- a writer waits: it goes first
    end
  end
end
-- only a woken caller can find a reservation to use up
local token = won(KEYS[1], KEYS[4], woken and KEYS[5] or nil, max_ttl)
local ms = tonumber(ARGV[2])
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now)  -- lapsed read leases go
-- the read lease, until it lapses on the clock read above; the set lives as long as its
-- longest lease
redis.call('ZADD', KEYS[2], now + ms, ARGV[1])
if redis.call('PTTL', KEYS[2]) < ms then
  redis.call('PEXPIRE', KEYS[2], ms)
end
mark(KEYS[3], 'rwlock|readers', ms)
return {1, token, 0}
"""
READ = taking("read", _READ_OPEN + RW_LUA, READ_BODY, trust=TRUST_READ)
#: WRITE after the trust check (and ``RW_LUA``).
WRITE_BODY = """local refusal, holder = refused(counter)
if refusal then
  return refusal
end
if holder == 'readers' then
  local now = now_ms()
  if live_readers(KEYS[2], now) > 0 then
    if tonumber(ARGV[5]) > 0 then  -- it will wait: new readers must wait behind it
      register(KEYS[6], ARGV[7], tonumber(ARGV[5]), true)
    end
    local first = redis.call('ZRANGE', KEYS[2], 0, 0, 'WITHSCORES')
    return busy(KEYS[4], math.max(1, tonumber(first[2]) - now), counter)
  end
  redis.call('DEL', KEYS[3])  -- the marker of readers that are all gone
end
if ARGV[6] ~= '1' then
  local reserved = redis.call('PTTL', KEYS[5])
  if reserved ~= -2 then
    return busy(KEYS[4], reserved, counter)
  end
end
if ARGV[7] ~= '' then
  redis.pcall('ZREM', KEYS[6], ARGV[7])
end
-- a lock value that ends with '|write', so a listing tells a write lease from a plain lock;
-- only a woken caller can find a reservation to use up
local token = won(KEYS[1], KEYS[4], ARGV[6] == '1' and KEYS[5] or nil, max_ttl)
redis.call('SET', KEYS[3], lock_value(token) .. '|write', 'PX', ARGV[2])
return {1, token, 0}
"""
WRITE = taking(
    "write",
    grant_if_free(fence=1, key=3, reservation=5, waiting=(6, 4), mark="|write") + RW_LUA,
    WRITE_BODY,
    trust=TRUST_READ,
)

# ``fit_to_readers(readers, key, now)``: the readers' set and the marker at the name's key live
# as long as the longest read lease left in the set, no longer: after the longest one is
# released or extended to a shorter TTL, they would outlive every lease by up to its old TTL
# (a plain lock of the name found it busy all that time). Called with readers left.
FIT_READERS_LUA = """
local function fit_to_readers(readers, key, now)
  local last = redis.call('ZRANGE', readers, -1, -1, 'WITHSCORES')
  local left = math.max(1, tonumber(last[2]) - now)
  if redis.call('PTTL', readers) > left then
    redis.call('PEXPIRE', readers, left)
  end
  local marker = string.sub(redis.call('GET', key) or '', 1, 7) == 'rwlock|'
  if marker and redis.call('PTTL', key) > left then
    redis.call('PEXPIRE', key, left)
  end
end
"""

# KEYS: readers, the name's key, waiter set, wake-up list, hand-off reservation.
# ARGV: as RELEASE. Removes the owner's read lease; when no reader is left, removes the marker
# and wakes a waiter (a writer, most likely). With a registration TTL (ARGV[5] > 0: a failed
# attempt that will wait gives back what it got), registers the caller as a waiter instead.
# Returns as RELEASE.
# READ_RELEASE's common case first (a lease's release): the read lease goes and, for the last
# reader with nobody waiting, the marker too, before the shared functions are defined;
# otherwise the general path goes on from ``mine``.
_READ_RELEASE_LAST = """local mine = nil
if tonumber(ARGV[5]) == 0 then
  mine = redis.call('ZREM', KEYS[1], ARGV[1]) == 1
  if not mine then
    return 0
  end
  if redis.call('ZCARD', KEYS[1]) == 0 and redis.call('EXISTS', KEYS[3]) == 0 then
    if string.sub(redis.call('GET', KEYS[2]) or '', 1, 7) == 'rwlock|' then
      redis.call('DEL', KEYS[2])
    end
    return 1
  end
end
"""
#: READ_RELEASE after the shared functions, with ``mine`` (nil: not removed yet).
READ_RELEASE_BODY = """
if mine == nil then
  mine = redis.call('ZREM', KEYS[1], ARGV[1]) == 1
end
if tonumber(ARGV[5]) > 0 then
  register(KEYS[3], ARGV[6], tonumber(ARGV[5]), true)
end
if not mine then
  return 0
end
-- the common case, the last reader: no clock read
if redis.call('ZCARD', KEYS[1]) > 0 then
  local now = now_ms()
  if not now then
    return 1
  end
  redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)  -- lapsed read leases go
  if redis.call('ZCARD', KEYS[1]) > 0 then
    fit_to_readers(KEYS[1], KEYS[2], now)
    return 1
  end
end
if string.sub(redis.call('GET', KEYS[2]) or '', 1, 7) == 'rwlock|' then
  redis.call('DEL', KEYS[2])
end
if tonumber(ARGV[5]) > 0 then
  return 1
end
return wake(KEYS[3], KEYS[4], KEYS[5], ARGV[4] == '1')
"""
READ_RELEASE = Script(
    "read_release", _READ_RELEASE_LAST + RELEASE_LUA + FIT_READERS_LUA + READ_RELEASE_BODY
)

# KEYS: readers, fence, the name's key. ARGV: owner, ttl_ms, run_id.
# Renews a read lease that has not lapsed, and the marker with it; a lease whose name is held
# by anything but readers (a writer after a force-release evicted the readers) is lost.
# Replies as EXTEND.
READ_EXTEND = Script(
    "read_extend",
    TAKE_LUA
    + FIT_READERS_LUA
    + """
local ok, _, max_ttl = trusted(KEYS[2])
if not ok then
  return -1
end
local held = redis.call('GET', KEYS[3])
if held and held ~= 'rwlock|readers' then
  return 0
end
local now = now_ms()
local lapses = tonumber(redis.call('ZSCORE', KEYS[1], ARGV[1]) or 0)
if lapses <= now then
  return 0
end
register(KEYS[1], ARGV[1], tonumber(ARGV[2]), false)  -- the read lease, renewed
mark(KEYS[3], 'rwlock|readers', tonumber(ARGV[2]))
fit_to_readers(KEYS[1], KEYS[3], now)  -- a shorter TTL than it had: no longer than the readers
note_ttl(KEYS[2], max_ttl)
return 1
""",
)

# KEYS: for each lease of a ``lock_many`` set: lock, waiter set, wake-up list, hand-off
# reservation (four keys each). ARGV: as RELEASE (one owner for the whole set), but ARGV[4]
# has one "1"/"0" per name: whether this node is the one that name's waiters block on.
# RELEASE of every name in one call; returns the replies, one per name.
RELEASE_MANY = Script(
    "release_many",
    RELEASE_LUA
    + """
local replies = {}
for i = 1, #KEYS, 4 do
  local wakes = string.sub(ARGV[4], #replies + 1, #replies + 1) == '1'
  replies[#replies + 1] = release(KEYS[i], KEYS[i + 1], KEYS[i + 2], KEYS[i + 3], wakes)
end
return replies
""",
)
