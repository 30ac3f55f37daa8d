"""Lua scripts run on every node, as commented module constants.

Keys an alias writes (all start with its ``KEY_PREFIX``):

* ``<prefix><name>``: one lock; a string ``<owner>|<token>|<acquired_ms>|<host>|<pid>`` with a
  TTL. ``<owner>`` is a 32-character secret; only its holder can extend or delete the key.
* ``<prefix>__wait__:<name>``: set by every failed attempt that will wait, for longer than the
  holder's lease and than any single wait; while it exists, each release wakes one waiter.
* ``<prefix>__wake__:<name>``: a one-element list pushed by that release on the node the
  name's waiters block on; a waiter blocked in ``BLPOP`` on it wakes (exactly one per
  release). Short TTL.
* ``<prefix>__handoff__:<name>``: set by that release for a few milliseconds: only a woken
  waiter may take the name meanwhile, so the lock changes hands instead of going straight
  back to the releaser.
* ``<prefix>__fence__``: one permanent hash per alias with the fencing counter (``token``), the
  ``run_id`` of the node incarnation last made consistent, and the longest TTL handed out
  (``max_ttl``). It is never deleted by release, clear or force-release, so Redis memory stays
  flat however many names are locked.

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


# KEYS: lock, fence, waiting marker, hand-off reservation.
# ARGV: owner, ttl_ms, run_id, value suffix ("|acquired_ms|host|pid"), how long the waiting
# marker lives at least (ms; 0 = the caller will not wait, do not mark), "1" if this caller
# was woken by a release (else "0").
# Returns {1, token, 0} when acquired (token = the node's counter after the increment),
# {0, counter, pttl} when the name is busy or reserved for a woken waiter (and marks that
# someone waits for it, if the caller will), {-1, counter, 0} when this node is not trusted.
ACQUIRE = Script(
    "acquire",
    """
local meta = redis.call('HMGET', KEYS[2], 'run_id', 'token', 'max_ttl')
local counter = tonumber(meta[2]) or 0
if meta[1] ~= ARGV[3] then
  return {-1, counter, 0}
end
local pttl = redis.call('PTTL', KEYS[1])
if pttl == -2 and ARGV[6] ~= '1' then
  pttl = redis.call('PTTL', KEYS[4])  -- free, but handed to the waiter a release woke
end
if pttl ~= -2 then
  if tonumber(ARGV[5]) > 0 then
    -- the caller will wait: outlive both the holder and the longest single wait
    redis.call('SET', KEYS[3], '1', 'PX', math.max(pttl, tonumber(ARGV[5])))
  end
  return {0, counter, pttl}
end
redis.call('DEL', KEYS[4])
local token = redis.call('HINCRBY', KEYS[2], 'token', 1)
-- string.format: plain concatenation would print a large token as 1.8e+15
redis.call('SET', KEYS[1], ARGV[1] .. '|' .. string.format('%d', token) .. ARGV[4], 'PX', ARGV[2])
if tonumber(ARGV[2]) > (tonumber(meta[3]) or 0) then
  redis.call('HSET', KEYS[2], 'max_ttl', ARGV[2])
end
return {1, token, 0}
""",
)

# KEYS: lock, waiting marker, wake-up list, hand-off reservation.
# ARGV: owner, wake-up TTL in ms, reservation TTL in ms, "1" on the node waiters block on,
# waiting-marker TTL in ms (0 for a lease's release; > 0 when a failed attempt that will wait
# takes back what it got on this node).
# Compare-and-delete: deletes only a key whose owner part equals ARGV[1]. While the name is
# marked as wanted, it reserves the name briefly for the waiter it wakes (so the releaser,
# which needs no wake-up, cannot take it straight back) and, on the node waiters block on,
# leaves one wake-up that exactly one blocked waiter (BLPOP) takes. The marker is left to
# expire: waiters still blocked stay covered for the next release.
# Returns 2 when deleted and someone was waiting, 1 when deleted, 0 when the key is gone or
# owned by someone else.
RELEASE = Script(
    "release",
    """
local value = redis.call('GET', KEYS[1])
local mine = value and string.sub(value, 1, #ARGV[1] + 1) == ARGV[1] .. '|'
if tonumber(ARGV[5]) > 0 then
  if mine then
    redis.call('DEL', KEYS[1])
  end
  redis.call('SET', KEYS[2], '1', 'PX', ARGV[5])
  return mine and 1 or 0
end
if not mine then
  return 0
end
redis.call('DEL', KEYS[1])
if redis.call('EXISTS', KEYS[2]) == 0 then
  return 1
end
redis.call('SET', KEYS[4], '1', 'PX', ARGV[3])
if ARGV[4] == '1' then
  redis.call('DEL', KEYS[3])
  redis.call('RPUSH', KEYS[3], '1')
  redis.call('PEXPIRE', KEYS[3], ARGV[2])
end
return 2
""",
)

# KEYS: lock, fence. ARGV: owner, ttl_ms, run_id.
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
  local max_ttl = tonumber(redis.call('HGET', KEYS[2], 'max_ttl')) or 0
  if tonumber(ARGV[2]) > max_ttl then
    redis.call('HSET', KEYS[2], 'max_ttl', ARGV[2])
  end
  return 1
end
return 0
""",
)

# KEYS: fence, lock. ARGV: token, run_id, owner.
# Token write-back: raise the counter to ARGV[1] if it is lower ("set if greater"). Returns 1
# when the caller still holds the lock here, 0 when it does not (force-released or expired
# since its acquire: someone else may have taken this node and read the old counter, so it
# must not count towards the quorum that hands out this token), -1 when the node is not trusted.
RAISE = Script(
    "raise",
    """
if redis.call('HGET', KEYS[1], 'run_id') ~= ARGV[2] then
  return -1
end
local counter = tonumber(redis.call('HGET', KEYS[1], 'token')) or 0
if counter < tonumber(ARGV[1]) then
  redis.call('HSET', KEYS[1], 'token', ARGV[1])
end
local value = redis.call('GET', KEYS[2])
if value and string.sub(value, 1, #ARGV[3] + 1) == ARGV[3] .. '|' then
  return 1
end
return 0
""",
)

# KEYS: fence. ARGV: run_id, floor.
# Make a restarted or new node trusted again: counter = max(counter, floor), run_id = ARGV[1].
# Returns the counter.
REJOIN = Script(
    "rejoin",
    """
local counter = tonumber(redis.call('HGET', KEYS[1], 'token')) or 0
if counter < tonumber(ARGV[2]) then
  counter = tonumber(ARGV[2])
  redis.call('HSET', KEYS[1], 'token', ARGV[2])
end
redis.call('HSET', KEYS[1], 'run_id', ARGV[1])
return counter
""",
)

# KEYS: fence. Returns {run_id or '', counter, max_ttl, exists(0/1)}.
PROBE = Script(
    "probe",
    """
local meta = redis.call('HMGET', KEYS[1], 'run_id', 'token', 'max_ttl')
return {meta[1] or '', tonumber(meta[2]) or 0, tonumber(meta[3]) or 0,
        redis.call('EXISTS', KEYS[1])}
""",
)

# KEYS: lock, fence, wake-up list. ARGV: expected value ('' = any owner), wake-up TTL in ms.
# Force-release: delete whatever holds the name (or only the expected value), advance the
# counter so the evicted holder's token is older than every later one, and wake one waiter.
# Returns 1 when a key was deleted, 0 otherwise.
FORCE_RELEASE = Script(
    "force_release",
    """
local value = redis.call('GET', KEYS[1])
if not value or (ARGV[1] ~= '' and value ~= ARGV[1]) then
  return 0
end
redis.call('DEL', KEYS[1], KEYS[3])
if redis.call('HEXISTS', KEYS[2], 'token') == 1 then
  redis.call('HINCRBY', KEYS[2], 'token', 1)
end
redis.call('RPUSH', KEYS[3], '1')
redis.call('PEXPIRE', KEYS[3], ARGV[2])
return 1
""",
)

ALL_SCRIPTS = (ACQUIRE, RELEASE, EXTEND, RAISE, REJOIN, PROBE, FORCE_RELEASE)
