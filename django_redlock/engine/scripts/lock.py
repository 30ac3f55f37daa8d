"""The lock's scripts: acquire, release, extend, the fence write-back, rejoin, probe and
force-release, with their reply codes."""

from __future__ import annotations

from .fragments import RELEASE_LUA, TAKE_LUA, TRUST_READ, grant_if_free
from .script import Script, taking

# KEYS: lock, fence, waiter set, hand-off reservation.
# ARGV: owner, ttl_ms, run_id, value suffix ("|acquired_ms|host|pid"), how long the caller's
# registration as a waiter lives (ms; 0 = the caller will not wait, do not register), "1" if
# this caller was woken by a release (else "0"), the caller's waiter id ('' when it never waits).
# Returns {1, token, 0} when acquired (token = the node's counter after the increment; the
# caller no longer counts as a waiter), {0, counter, pttl} when the name is busy or reserved for
# a woken waiter (and registers the caller as a waiter, if it will wait), {-1, counter, 0} when
# this node is not trusted.
# The common case (a trusted node, neither the lock nor a hand-off reservation there) is
# granted first, before the shared functions are defined (see ``grant_if_free``).
#: ACQUIRE after the trust check, with ``present`` read (the test of the common case builds
#: the script without it from this).
ACQUIRE_BODY = """local woken = ARGV[6] == '1'
if present > 0 then  -- the lock or a hand-off reservation exists (read above)
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
"""
ACQUIRE = taking(
    "acquire",
    grant_if_free(fence=2, key=1, reservation=4, waiting=(3,)) + TAKE_LUA,
    ACQUIRE_BODY,
    fence=2,
    trust=TRUST_READ,
)
#: ACQUIRE reply statuses (the first element of its reply).
GRANTED, BUSY, UNTRUSTED, OTHER_KIND = 1, 0, -1, -2

# KEYS and ARGV: see ``RELEASE_LUA`` in :mod:`.fragments`.
# The common case first, as ACQUIRE's: a lease's release (no registration) where nobody waits
# is a compare-and-delete, answered as ``release()`` answers it.
_RELEASE_UNWATCHED = """if tonumber(ARGV[5]) == 0 and redis.call('EXISTS', KEYS[2]) == 0 then
  local value = redis.call('GET', KEYS[1])
  if value and string.sub(value, 1, #ARGV[1] + 1) == ARGV[1] .. '|' then
    redis.call('DEL', KEYS[1])
    return 1
  end
  return 0
end
"""
#: RELEASE after the shared functions.
RELEASE_BODY = "return release(KEYS[1], KEYS[2], KEYS[3], KEYS[4], ARGV[4] == '1')\n"
RELEASE = Script("release", _RELEASE_UNWATCHED + RELEASE_LUA + RELEASE_BODY)

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

# KEYS: fence, then every key the caller must still hold here (its lock; every lock of a
# ``lock_many`` set; the slots of a ``limits()`` set this node granted; none for a read
# lease). ARGV: first, last (the caller's tokens: one, or a set's consecutive ones), run_id,
# owner, then per held key the offset of its token from ``first``.
# Token write-back: move the counter onto the caller's tokens (to ``last``) while it is still
# below ``first``, and write each held key's token into its value (TTL kept), so that
# inspection reads the lease's token. Returns 1 when it did and the caller still holds every
# key; 0 when the caller lost one (force-released or expired since its acquire: someone else
# may have taken this node and read the old counter); -1 when the node is not trusted;
# {counter} when the counter had reached ``first`` already: another caller may have been
# handed one of these tokens through this node. A node's counter moves onto a value once,
# and any two quorums share a node, so of two callers given one token at most one confirms
# it on a quorum.
RAISE = Script(
    "raise",
    """
if redis.call('HGET', KEYS[1], 'run_id') ~= ARGV[3] then
  return -1
end
local values = {}
for i = 2, #KEYS do
  local value = redis.call('GET', KEYS[i])
  if not (value and string.sub(value, 1, #ARGV[4] + 1) == ARGV[4] .. '|') then
    return 0
  end
  values[i] = value
end
local counter = tonumber(redis.call('HGET', KEYS[1], 'token')) or 0
if counter >= tonumber(ARGV[1]) then
  return {counter}  -- passed: another caller got here first
end
redis.call('HSET', KEYS[1], 'token', ARGV[2])
for i = 2, #KEYS do
  -- owner|token|...: the rest of the value (acquired, host, pid, a write lease's mark) stays
  local rest = string.sub(values[i], #ARGV[4] + 2)
  local token = string.format('%d', tonumber(ARGV[1]) + tonumber(ARGV[3 + i]))
  rest = string.sub(rest, (string.find(rest, '|', 1, true) or #rest + 1))
  redis.call('SET', KEYS[i], ARGV[4] .. '|' .. token .. rest, 'KEEPTTL')
end
return 1
""",
)
#: RAISE replies: STILL_HELD, NOT_HELD (above), UNTRUSTED (above) or a passed counter
#: (:func:`passed_counter`).
STILL_HELD = 1


def passed_counter(reply: object) -> int | None:
    """The counter a RAISE found at or past the caller's first token, else None."""
    return int(reply[0]) if isinstance(reply, list) and reply else None


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
# A semaphore's marker is not deleted unless it is the expected value: its permits live in
# slot keys of their own, and the marker alone gone would let a lock in beside them.
# Readers' marker: every read lease goes with it (else a reader's renewal would mark the name
# "readers" again over the writer that came next). Returns 1 when a key was deleted, 0 otherwise.
FORCE_RELEASE = Script(
    "force_release",
    """
local value = redis.call('GET', KEYS[1])
if not value or (ARGV[1] ~= '' and value ~= ARGV[1]) then
  return 0
end
if ARGV[1] == '' and string.sub(value, 1, 10) == 'semaphore|' then
  return -2  -- a semaphore's marker goes only when named: its permits are keys of their own
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
#: FORCE_RELEASE replies: DELETED, NOT_HELD or OTHER_KIND (above: a semaphore's marker, which
#: is deleted only when given as the expected value, after its permits).
DELETED = 1
