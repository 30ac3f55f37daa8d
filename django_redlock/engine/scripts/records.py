"""Fenced records: a value kept beside a lock, written only by a holder of the lock and never
over a value written under a newer fencing token (idempotent requests keep their responses so).

A record is a hash at ``<prefix>__record__:<name>`` (see :meth:`..keyspace.Keyspace.record`)
with the fields ``token`` and any others the caller gives.
"""

from __future__ import annotations

from .script import Script

# KEYS: lock, record. ARGV: owner, token, ttl_ms, then field, value pairs.
# Writes the record (replacing it whole) and its expiry, only while the caller's owner value
# holds the lock here and no record written under a newer token exists. Returns STORED,
# NOT_HOLDER (the lock is not the caller's here: expired, released, taken over) or NEWER (a
# record of a later token is there: the caller's lease was overtaken).
STORE_RECORD = Script(
    "store_record",
    """
local value = redis.call('GET', KEYS[1])
if not (value and string.sub(value, 1, #ARGV[1] + 1) == ARGV[1] .. '|') then
  return 0
end
local stored = tonumber(redis.call('HGET', KEYS[2], 'token'))
if stored and stored > tonumber(ARGV[2]) then
  return -1
end
redis.call('DEL', KEYS[2])
redis.call('HSET', KEYS[2], 'token', ARGV[2], unpack(ARGV, 4))
redis.call('PEXPIRE', KEYS[2], ARGV[3])
return 1
""",
)
#: STORE_RECORD replies.
STORED, NOT_HOLDER, NEWER = 1, 0, -1

# KEYS: record. ARGV: the fields to read. Returns the token, then the fields' values (nil for
# each when there is no record).
READ_RECORD = Script(
    "read_record",
    """
return redis.call('HMGET', KEYS[1], 'token', unpack(ARGV))
""",
)
