"""Fenced reads and writes of one cache key through a Redis cache backend's own client.

The value is stored at the backend's own key, encoded as the backend encodes it, so a plain
``cache.get(key)`` reads it. Beside it, at ``redlock:fence:<key>``, a record
``"<token>:<fresh until, ms on the Redis server's clock>"`` (``"<token>:"``: fresh forever) says
which lease wrote it and until when it is fresh. Both are read and written by the Lua scripts
below, on the backend's primary (a replica may not have the value a released lease stored yet).
"""

from __future__ import annotations

import hashlib
from typing import Any, Protocol

from django.core.cache import BaseCache
from django.core.exceptions import ImproperlyConfigured

from .fenced import FENCE_PREFIX, FencedStore, Found, record_key
from .local_store import LocalStore

__all__ = ["FENCE_PREFIX", "FencedStore", "Found", "record_key", "store_for"]

#: Read the value and tell fresh from stale. KEYS: value, fence record. ARGV[1]: how many ms
#: past its freshness a stale value may still be served. Replies nil (a miss: absent, or stale
#: beyond that grace) or {value, 0 fresh | 1 stale}. A value without a record (written by a
#: plain ``cache.set``) is fresh for as long as it lives.
READ_SCRIPT = """
local value = redis.call('GET', KEYS[1])
if not value then return false end
local record = redis.call('GET', KEYS[2])
if not record then return {value, 0} end
local fresh_until = tonumber(string.match(record, ':(%d+)$'))
if not fresh_until then return {value, 0} end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
if now < fresh_until then return {value, 0} end
if now < fresh_until + tonumber(ARGV[1]) then return {value, 1} end
return false
"""

#: Store the value unless the record names a lease at least as new. KEYS: value, fence record.
#: ARGV: encoded value, the lease's token (decimal), fresh ms (0: forever), grace ms. Tokens are
#: compared as decimal strings (length first), so no float rounding enters. Replies 1 (stored)
#: or 0 (a value of a newer lease is there: nothing written).
WRITE_SCRIPT = """
local record = redis.call('GET', KEYS[2])
if record then
  local stored = string.match(record, '^(%d+):')
  local token = ARGV[2]
  if stored and (#stored > #token or (#stored == #token and stored >= token)) then
    return 0
  end
end
local fresh = tonumber(ARGV[3])
if fresh == 0 then
  redis.call('SET', KEYS[1], ARGV[1])
  redis.call('SET', KEYS[2], ARGV[2] .. ':')
  return 1
end
if redis.replicate_commands then redis.replicate_commands() end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local life = fresh + tonumber(ARGV[4])
redis.call('SET', KEYS[1], ARGV[1], 'PX', life)
redis.call('SET', KEYS[2], ARGV[2] .. ':' .. string.format('%d', now + fresh), 'PX', life)
return 1
"""

_READ_SHA = hashlib.sha1(READ_SCRIPT.encode()).hexdigest()
_WRITE_SHA = hashlib.sha1(WRITE_SCRIPT.encode()).hexdigest()

#: Named in the error for any other backend.
SUPPORTED_BACKENDS = (
    "django.core.cache.backends.redis.RedisCache, django_redis.cache.RedisCache with its "
    "DefaultClient or SentinelClient, and django.core.cache.backends.locmem.LocMemCache "
    "(one process's cache: each process fills its own)"
)


class _RawClient(Protocol):
    def evalsha(self, sha: str, numkeys: int, *keys_and_args: Any) -> Any: ...
    def eval(self, script: str, numkeys: int, *keys_and_args: Any) -> Any: ...


class ScriptStore(FencedStore):
    """One Redis backend's key making, encoding and raw client, and the two scripts run on it."""

    # -- what differs per backend ----------------------------------------------------------
    def client(self, full_key: str) -> _RawClient:
        raise NotImplementedError

    def encode(self, value: Any) -> Any:
        raise NotImplementedError

    def decode(self, raw: Any) -> Any:
        raise NotImplementedError

    # -- the scripts -----------------------------------------------------------------------
    def read(self, full_key: str, grace_ms: int) -> Found | None:
        """The value at ``full_key``: fresh, stale within ``grace_ms``, or None (a miss)."""
        reply = _run(self.client(full_key), READ_SCRIPT, _READ_SHA, full_key, grace_ms)
        if reply is None:
            return None
        raw, state = reply
        return Found(self.decode(raw), bool(state))

    def write(self, full_key: str, value: Any, token: int, fresh_ms: int, grace_ms: int) -> bool:
        """Store ``value`` under ``token``; False (nothing written) if a newer lease's is there."""
        encoded = self.encode(value)
        reply = _run(
            self.client(full_key), WRITE_SCRIPT, _WRITE_SHA, full_key, encoded, token, fresh_ms,
            grace_ms,
        )  # fmt: skip
        return bool(reply)


def _run(client: _RawClient, script: str, sha: str, full_key: str, *args: Any) -> Any:
    keys = (full_key, record_key(full_key))
    try:
        return client.evalsha(sha, 2, *keys, *args)
    except Exception as exc:  # redis.exceptions.NoScriptError: the server lost its scripts
        if type(exc).__name__ != "NoScriptError":
            raise
        return client.eval(script, 2, *keys, *args)


class DjangoRedisStore(ScriptStore):
    """``django.core.cache.backends.redis.RedisCache`` (Django's own)."""

    def full_key(self, key: str) -> str:
        return self.backend.make_and_validate_key(key)

    def client(self, full_key: str) -> _RawClient:
        client: _RawClient = self.backend._cache.get_client(full_key, write=True)  # type: ignore[attr-defined]
        return client

    def encode(self, value: Any) -> Any:
        return self.backend._cache._serializer.dumps(value)  # type: ignore[attr-defined]

    def decode(self, raw: Any) -> Any:
        return self.backend._cache._serializer.loads(raw)  # type: ignore[attr-defined]


class JazzbandRedisStore(ScriptStore):
    """``django_redis.cache.RedisCache`` (django-redis) with its default or sentinel client."""

    def full_key(self, key: str) -> str:
        return str(self.backend.client.make_key(key))  # type: ignore[attr-defined]

    def client(self, full_key: str) -> _RawClient:
        client: _RawClient = self.backend.client.get_client(write=True)  # type: ignore[attr-defined]
        return client

    def encode(self, value: Any) -> Any:
        return self.backend.client.encode(value)  # type: ignore[attr-defined]

    def decode(self, raw: Any) -> Any:
        return self.backend.client.decode(raw)  # type: ignore[attr-defined]


#: The store class per (backend class, django-redis client class or None), once decided: the
#: imports and class checks cost more than the rest of a hit's Python work.
_STORE_CLASSES: dict[tuple[type, type | None], type[FencedStore]] = {}


def store_for(alias: str, backend: BaseCache) -> FencedStore:
    """The fenced store of cache ``alias``; ``ImproperlyConfigured`` for other backends (a
    fill that could not fence its writes would break the promise, so none is made)."""
    client = getattr(backend, "_client", None)  # django-redis: None until first used
    if client is None and hasattr(backend, "client"):
        client = backend.client
    kinds = (type(backend), None if client is None else type(client))
    store_class = _STORE_CLASSES.get(kinds)
    if store_class is None:
        store_class = _STORE_CLASSES[kinds] = _store_class(alias, backend, client)
    return store_class(backend)


def _store_class(alias: str, backend: BaseCache, client: Any) -> type[FencedStore]:
    from django.core.cache.backends.redis import RedisCache

    if isinstance(backend, RedisCache):
        return DjangoRedisStore
    from django.core.cache.backends.locmem import LocMemCache

    if isinstance(backend, LocMemCache):
        return LocalStore
    try:
        from django_redis.cache import RedisCache as JazzbandCache
        from django_redis.client import DefaultClient, HerdClient, ShardClient
    except ImportError:  # the django-redis extra is not installed: not one of its caches
        JazzbandCache = None

    if JazzbandCache is not None and isinstance(backend, JazzbandCache):
        if isinstance(client, DefaultClient) and not isinstance(client, HerdClient | ShardClient):
            return JazzbandRedisStore
        raise ImproperlyConfigured(
            f"get_or_set() cannot fence writes to cache {alias!r}: its django-redis client is "
            f"{type(client).__module__}.{type(client).__qualname__} (HerdClient wraps values, "
            "ShardClient spreads keys over servers). Supported: "
            f"{SUPPORTED_BACKENDS}."
        )
    kind = type(backend)
    raise ImproperlyConfigured(
        f"get_or_set() needs a Redis cache, and cache {alias!r} is "
        f"{kind.__module__}.{kind.__qualname__}: its writes cannot be made conditional on the "
        f"lease's fencing token. Supported: {SUPPORTED_BACKENDS}. Use Django's "
        "cache.get_or_set() for other caches."
    )
