"""Code run in worker processes (``multiprocessing`` spawn) by ``tests/cache/`` and
``benchmarks/cache_fill.py``: ``get_or_set()`` against a real Redis cache."""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

#: The cache backends a test runs against, by short name.
BACKENDS = {
    "django": "django.core.cache.backends.redis.RedisCache",
    "django-redis": "django_redis.cache.RedisCache",
}


def caches_setting(backend: str, url: str, prefix: str = "cachetest") -> dict[str, Any]:
    """``CACHES`` with a ``default`` alias of ``backend`` (a key of :data:`BACKENDS`) at ``url``."""
    return {"default": {"BACKEND": BACKENDS[backend], "LOCATION": url, "KEY_PREFIX": prefix}}


def setup_django(redlock: dict[str, Any], caches: dict[str, Any]) -> None:
    """Configure a bare Django with the given ``REDLOCK`` and ``CACHES`` in a fresh process."""
    import django
    from django.conf import settings

    if not settings.configured:
        settings.configure(
            INSTALLED_APPS=["django_redlock"],
            REDLOCK=redlock,
            CACHES=caches,
            USE_TZ=True,
            DATABASES={},
        )
        django.setup()


def _counting_compute(counter_url: str, counter_key: str, seconds: float) -> Any:
    """A compute that counts its runs in Redis (INCR), takes ``seconds`` and returns its pid."""
    import redis

    counter = redis.Redis.from_url(counter_url)

    def compute() -> str:
        counter.incr(counter_key)
        time.sleep(seconds)
        counter.set(f"{counter_key}:end", repr(time.time()))  # the last compute's end
        return f"computed by {os.getpid()}"

    return compute


def fill_at(
    key: str,
    counter_url: str,
    counter_key: str,
    seconds: float,
    start_at: float,
    how: str,
) -> tuple[str, float]:
    """In a process set up by :func:`setup_django`: at wall-clock ``start_at``, fill ``key``
    with a compute of ``seconds``; ``how``: ``"get_or_set"`` (ours), ``"django"`` (Django's
    plain ``cache.get_or_set``) or ``"lock"`` (each caller takes the key's plain lock, reads,
    and computes on a miss: N waiters, N hand-offs). Returns the value and the wall-clock
    time when it was returned."""
    from django.core.cache import cache

    from django_redlock import locks
    from django_redlock.cache import get_or_set

    compute = _counting_compute(counter_url, counter_key, seconds)
    time.sleep(max(0.0, start_at - time.time()))
    if how == "get_or_set":
        value = get_or_set(key, compute, 30)
    elif how == "django":
        value = cache.get_or_set(key, compute, 30)
    else:
        with locks["default"].lock(f"plain:{key}", timeout=30):
            value = cache.get(key)
            if value is None:
                value = compute()
                cache.set(key, value, 30)
    return value, time.time()


def fill_paused(
    redlock: dict[str, Any],
    caches: dict[str, Any],
    key: str,
    counter_url: str,
    ready_key: str,
    using: str,
) -> str:
    """``get_or_set(key)`` whose compute says it runs (``ready_key`` set in Redis), then
    returns 'old'; the test SIGSTOPs this process meanwhile, past its lease's TTL."""
    setup_django(redlock, caches)
    import redis

    from django_redlock.cache import get_or_set

    signal = redis.Redis.from_url(counter_url)

    def compute() -> str:
        signal.set(ready_key, os.getpid())
        time.sleep(0.5)  # the test stops the process in here
        return "old"

    return get_or_set(key, compute, 30, using=using)


def fill_gated(
    redlock: dict[str, Any],
    caches: dict[str, Any],
    key: str,
    counter_url: str,
    counter_key: str,
    timeout: float,
    stale: float | None,
    use_async: bool = False,
) -> str:
    """``get_or_set(key, ...)`` (``use_async``: ``aget_or_set`` in ``asyncio.run``) whose
    compute counts its run (INCR ``counter_key``) and then blocks until the test pushes onto
    ``<counter_key>:gate``; returns the value it got."""
    setup_django(redlock, caches)
    import asyncio

    import redis

    from django_redlock.cache import aget_or_set, get_or_set

    counter = redis.Redis.from_url(counter_url)

    def compute() -> str:
        counter.incr(counter_key)
        counter.blpop([f"{counter_key}:gate"], timeout=30)
        return f"computed by {os.getpid()}"

    if use_async:
        return asyncio.run(aget_or_set(key, compute, timeout, stale=stale))
    return get_or_set(key, compute, timeout, stale=stale)


@contextlib.contextmanager
def held_by_another_thread(manager: Any, name: str) -> Iterator[None]:
    """Hold the write lease of ``name`` from another thread (a caller in this thread holding
    its key's lease itself would be refused at once) for the ``with`` block."""
    with ThreadPoolExecutor(1) as pool:
        lease = pool.submit(manager.acquire, name, rw="write", timeout=0).result()
        try:
            yield
        finally:
            pool.submit(lease.release).result()
