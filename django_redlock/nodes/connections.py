"""Build connection factories for an alias's nodes from URLs or Redis caches.

Lock connections are separate sockets from cache traffic (a lock call must never queue behind
a slow cache read), but a ``{"CACHE": alias}`` node reuses that cache's connection pool settings:
the same server, credentials, TLS options and connection class. The cache is a django-redis
cache or Django's own ``django.core.cache.backends.redis.RedisCache`` (its first server, the
one it writes to).
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote, urlsplit

import redis
import redis.asyncio
from redis.backoff import NoBackoff
from redis.retry import Retry

from ..engine import socket_timeout as engine_socket_timeout
from ..engine import wall_limit
from .cluster import ClusterSlot, slot_of
from .located import ASYNC_TWINS, located_pool
from .sentinels import Sentinels

if TYPE_CHECKING:
    from .spec import AliasNodes, NodeSpec


_pools: dict[tuple[NodeSpec, float], redis.ConnectionPool] = {}
_pools_guard = threading.Lock()

# Keyword arguments we set ourselves; anything the cache sets for these is overridden.
_ASYNC_CLASSES: dict[str, type[Any]] = {
    **ASYNC_TWINS,
    "Connection": redis.asyncio.Connection,
    "SSLConnection": redis.asyncio.SSLConnection,
    "UnixDomainSocketConnection": redis.asyncio.UnixDomainSocketConnection,
}
_SYNC_ONLY_KWARGS = {
    "retry",
    "redis_connect_func",
    "connection_pool",
    "maint_notifications_config",
    "parser_class",  # a sync parser class would break asyncio connections
}


def socket_timeout(config: AliasNodes) -> float:
    """The per-socket bound (the engine's :func:`~..engine.socket_timeout` of the alias)."""
    return engine_socket_timeout(config.node_timeout)


def _pool_for(spec: NodeSpec, timeout: float) -> redis.ConnectionPool:
    """A process-wide pool per (node, timeout): only its settings are used here (and, for a
    sentinel node, its :class:`~.sentinels.Sentinels`, shared by every connection)."""
    key = (spec, timeout)
    with _pools_guard:
        pool = _pools.get(key)
        if pool is None:
            if spec.url is not None:
                pool = redis.ConnectionPool.from_url(spec.url)
            elif spec.service is not None:
                pool = _sentinel_pool(spec, timeout)
            elif spec.cluster:
                pool = _cluster_pool(spec, timeout)
            else:
                assert spec.cache is not None
                pool = cache_pool(spec.cache)
            _pools[key] = pool
        return pool


def _sentinel_pool(spec: NodeSpec, timeout: float) -> redis.ConnectionPool:
    """Connections to the master the sentinels name, with the node's ``DB`` and credentials;
    over TLS when the sentinels are ``rediss://``, with their URL's TLS options (CA, client
    certificate, verification)."""
    assert spec.service is not None
    tls, options = _url_options(spec.sentinels[0])
    return located_pool(
        Sentinels(spec.sentinels, spec.service, timeout),
        ssl=tls,
        db=spec.db,
        username=spec.username,
        password=spec.password,
        **{k: v for k, v in options.items() if k.startswith("ssl")},
    )


def _cluster_pool(spec: NodeSpec, timeout: float) -> redis.ConnectionPool:
    """Connections to the master serving the alias's slot, with the first seed's credentials
    and TLS options."""
    tls, options = _url_options(spec.cluster[0])
    locator = ClusterSlot(spec.cluster, slot_of(spec.hash_tag_of), timeout, spec.address_remap)
    return located_pool(locator, ssl=tls, **options)


def _url_options(url: str) -> tuple[bool, dict[str, Any]]:
    """Whether ``url`` is a TLS URL, and its connection options but the address (its
    credentials, database and ``ssl_*`` options, as redis-py parses them)."""
    pool = redis.ConnectionPool.from_url(url)
    options = {k: v for k, v in pool.connection_kwargs.items() if k not in ("host", "port")}
    return issubclass(pool.connection_class, redis.SSLConnection), options


#: The cache backends a ``{"CACHE": alias}`` node may name (or subclasses of them).
CACHE_BACKENDS = ("django_redis.cache.RedisCache", "django.core.cache.backends.redis.RedisCache")


def cache_backend_problem(backend: Any) -> str | None:
    """Why the ``BACKEND`` of a cache cannot be a node (None if it can): it must be, or
    subclass, one of :data:`CACHE_BACKENDS`."""
    from django.utils.module_loading import import_string

    try:
        cls = import_string(backend) if isinstance(backend, str) else backend
    except ImportError as exc:
        return f"has BACKEND {backend!r}, which cannot be imported ({exc})."
    for name in CACHE_BACKENDS:
        try:
            base = import_string(name)
        except ImportError:  # pragma: no cover - django-redis is a dependency
            continue
        if isinstance(cls, type) and issubclass(cls, base):
            return None
    return (
        f"has BACKEND {backend!r}, which does not talk to Redis: a lock node must be a "
        f"{' or a '.join(CACHE_BACKENDS)} cache."
    )


def cache_pool(alias: str) -> redis.ConnectionPool:
    """The connection pool of the Redis cache ``alias`` (django-redis's, or that of the first
    server of Django's own ``RedisCache``, the one it writes to)."""
    from django.core.cache import caches
    from django.core.cache.backends.redis import RedisCache

    cache = caches[alias]
    if isinstance(cache, RedisCache):
        # ``_cache`` is Django's RedisCacheClient; get_client(write=True) uses servers[0]
        client: redis.Redis = cache._cache.get_client(write=True)
        return client.connection_pool
    from django_redis import get_redis_connection

    pool: redis.ConnectionPool = get_redis_connection(alias).connection_pool
    return pool


def _kwargs(pool: redis.ConnectionPool, timeout: float) -> dict[str, Any]:
    kwargs = dict(pool.connection_kwargs)
    kwargs.update(
        socket_timeout=timeout,
        socket_connect_timeout=timeout,
        health_check_interval=0,
        retry_on_timeout=False,
    )
    return kwargs


def _sync_parts(pool: redis.ConnectionPool, timeout: float) -> tuple[type[Any], dict[str, Any]]:
    kwargs = _kwargs(pool, timeout)
    kwargs["retry"] = Retry(NoBackoff(), 0)
    return pool.connection_class, kwargs


def _async_parts(pool: redis.ConnectionPool, timeout: float) -> tuple[type[Any], dict[str, Any]]:
    kwargs = {k: v for k, v in _kwargs(pool, timeout).items() if k not in _SYNC_ONLY_KWARGS}
    kwargs["retry"] = redis.asyncio.retry.Retry(NoBackoff(), 0)
    return _ASYNC_CLASSES.get(pool.connection_class.__name__, redis.asyncio.Connection), kwargs


def sync_factory(spec: NodeSpec, config: AliasNodes) -> Callable[[], redis.connection.Connection]:
    """A callable that opens a new, retry-free connection to the node."""
    timeout = socket_timeout(config)
    cls, kwargs = _sync_parts(_pool_for(spec, timeout), timeout)
    return lambda: cls(**kwargs)


def async_factory(spec: NodeSpec, config: AliasNodes) -> Callable[[], Any]:
    """The asyncio twin of :func:`sync_factory`. redis-py's own socket timeouts are the
    wall-clock limit of a connect: the engine's handshake counts the alias's timeout in the
    time its event loop could run (:mod:`~..engine.transport.loop_time`), and a ``BLPOP``
    waiter gives each read its own timeout."""
    timeout = socket_timeout(config)
    cls, kwargs = _async_parts(_pool_for(spec, timeout), timeout)
    limit = wall_limit(timeout)
    kwargs.update(socket_timeout=limit, socket_connect_timeout=limit)
    return lambda: cls(**kwargs)


@functools.lru_cache(maxsize=256)
def url_problem(url: str) -> str | None:
    """How redis-py would refuse or misread a node URL (None: it reads it as written).

    redis-py itself is asked rather than its rules re-implemented: ``ConnectionPool.from_url``
    parses the URL (no connection is made), then the sync and the asyncio connection objects
    the factories above make are built from it, so a malformed or unknown query parameter, a
    bad ``ssl_cert_reqs`` or ``protocol`` fails here, at parse time. What redis-py accepts but
    reads differently from the URL is checked against its result: a db path that is not a
    number (``/O`` is silently db 0) and a negative db. (Port 0, silently 6379, is ``conf``'s.)
    """
    try:
        pool = redis.ConnectionPool.from_url(url)
        for cls, kwargs in (_sync_parts(pool, 0.2), _async_parts(pool, 0.2)):
            cls(**kwargs)  # builds the object only: connecting is lazy
    except Exception as exc:  # whatever redis-py raises for it: TypeError, ValueError, RedisError
        return f"is refused by redis-py: {type(exc).__name__}: {exc}"
    parts = urlsplit(url)
    path = unquote(parts.path)[1:]
    if parts.scheme != "unix" and path and not (path.isascii() and path.isdigit()):
        return (
            f"has db path {path!r}, which is not a database number such as /0: redis-py would "
            "silently use another db."
        )
    db = pool.connection_kwargs.get("db", 0)
    if db < 0:
        return f"names db {db}: database numbers start at 0."
    return None


def client_factory(spec: NodeSpec, config: AliasNodes) -> Callable[[], redis.Redis]:
    """A callable returning a plain client (pub/sub, inspection) for the node."""
    timeout = socket_timeout(config)
    pool = _pool_for(spec, timeout)
    kwargs = _kwargs(pool, timeout)

    def make() -> redis.Redis:
        return redis.Redis(
            connection_pool=redis.ConnectionPool(
                connection_class=pool.connection_class, max_connections=4, **kwargs
            )
        )

    return make


def current_master(spec: NodeSpec, config: AliasNodes, shards: int = 1) -> str | None:
    """Where a sentinel or cluster node's server was found last: ``host:port`` of the
    sentinels' master, or the cluster's slot, its master and the slot coverage (None for
    other nodes, or before any connection). ``shards`` > 1: the node of a spread alias, shown
    as its shards over the cluster's masters."""
    if spec.service is None and not spec.cluster:
        return None
    locator = _pool_for(spec, socket_timeout(config)).connection_kwargs["locator"]
    if isinstance(locator, ClusterSlot):
        if not locator.last:
            return None
        return locator.describe() if shards == 1 else locator.describe_spread(shards)
    address = locator.last
    return None if address is None else f"{address[0]}:{address[1]}"


def reset_pools() -> None:
    """Forget cached pools (called when settings change)."""
    with _pools_guard:
        _pools.clear()
