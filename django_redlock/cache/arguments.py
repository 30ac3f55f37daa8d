"""Checks of ``get_or_set()``'s arguments, done before anything is read or written."""

from __future__ import annotations

import decimal
import hashlib
import inspect
import math
import numbers
from dataclasses import dataclass
from typing import Any

from asgiref.sync import iscoroutinefunction as asgiref_iscoroutinefunction
from django.core.cache import BaseCache, caches
from django.core.cache.backends.base import DEFAULT_TIMEOUT, InvalidCacheBackendError
from django.core.exceptions import ImproperlyConfigured

from ..engine import MAX_NAME_LENGTH


@dataclass(frozen=True, slots=True)
class Lifetimes:
    """How long a stored value is fresh (ms, 0: forever) and served stale after that (ms)."""

    fresh_ms: int
    grace_ms: int


def check_compute(compute: Any, *, asyncio: bool) -> None:
    """A callable; for the blocking ``get_or_set`` not a coroutine function."""
    if not callable(compute):
        raise TypeError(
            f"compute must be a callable returning the value to cache, not "
            f"{type(compute).__name__}; pass the function itself (get_or_set(key, build, 60))."
        )
    if not asyncio and is_async_callable(compute):
        raise TypeError(
            "compute is a coroutine function (or an object with an async __call__): "
            "get_or_set() would cache the coroutine object, not its result. Pass a plain "
            "function, or await aget_or_set()."
        )


def is_async_callable(compute: Any) -> bool:
    """A coroutine function, a partial of one, or an object whose ``__call__`` is one."""
    if inspect.iscoroutinefunction(compute) or asgiref_iscoroutinefunction(compute):
        return True
    if inspect.isroutine(compute) or isinstance(compute, type):
        return False
    return inspect.iscoroutinefunction(getattr(compute, "__call__", None))  # noqa: B004


def check_key(key: Any) -> str:
    if not isinstance(key, str) or not key:
        raise TypeError(f"The cache key must be a non-empty str, not {key!r}.")
    return key


def lifetimes(timeout: Any, stale: Any, backend: BaseCache) -> Lifetimes:
    """``timeout`` as Django's cache takes it (seconds; None: forever; ``DEFAULT_TIMEOUT``: the
    cache's own), except 0 and below (which store nothing there) are errors; ``stale``: None or
    seconds >= 0, only with a finite timeout; ``timeout + stale`` at most
    :data:`MAX_LIFETIME` seconds (checked here, not by Redis after the compute ran)."""
    if timeout is DEFAULT_TIMEOUT:
        timeout = backend.default_timeout
    fresh_ms = 0 if timeout is None else _positive_ms("timeout", timeout)
    if stale is None:
        return _bounded(Lifetimes(fresh_ms, 0))
    if not _is_number(stale) or not math.isfinite(stale):
        raise TypeError(f"stale must be None or a finite number of seconds, not {stale!r}.")
    if stale < 0:
        raise ValueError(f"stale must be 0 or more seconds, got {stale!r}.")
    if timeout is None and stale:
        raise ValueError(
            "stale needs a finite timeout: with timeout=None the value never goes stale."
        )
    return _bounded(Lifetimes(fresh_ms, round(float(stale) * 1000)))


#: The longest ``timeout + stale``, in seconds (about 31,700 years): the key's lifetime in ms
#: stays an exact integer in the scripts (Lua numbers are doubles) and within Redis's range.
MAX_LIFETIME = 10**12


def _bounded(times: Lifetimes) -> Lifetimes:
    if times.fresh_ms + times.grace_ms > MAX_LIFETIME * 1000:
        raise ValueError(
            f"timeout + stale must be at most {MAX_LIFETIME:.0e} seconds (about 31,700 years), "
            f"got {(times.fresh_ms + times.grace_ms) / 1000:.6g}: Redis cannot keep a key that "
            "long. Use timeout=None to keep the value until it is deleted."
        )
    return times


def _is_number(value: Any) -> bool:
    """A real number as Django's cache takes it (int, float, Fraction, Decimal), not a bool."""
    return not isinstance(value, bool) and isinstance(value, numbers.Real | decimal.Decimal)


def _positive_ms(what: str, seconds: Any) -> int:
    if not _is_number(seconds):
        raise TypeError(f"{what} must be a number of seconds or None (forever), not {seconds!r}.")
    if not math.isfinite(seconds) or seconds <= 0:
        raise ValueError(
            f"{what} must be more than 0 seconds and finite, got {seconds!r}: 0 or less would "
            "store nothing (Django's meaning), so every caller would compute, one at a time. "
            "Use None to keep the value until it is deleted."
        )
    return max(1, round(float(seconds) * 1000))


def cache_backend(alias: Any) -> BaseCache:
    if not isinstance(alias, str):
        raise TypeError(f"cache must be the alias of a CACHES entry (a str), not {alias!r}.")
    try:
        return caches[alias]
    except InvalidCacheBackendError:
        from django.conf import settings

        known = ", ".join(repr(a) for a in settings.CACHES) or "none"
        raise ImproperlyConfigured(
            f"CACHES has no alias {alias!r} (configured: {known}). Pass cache= one of them."
        ) from None


def lock_name(cache_alias: str, full_key: str) -> str:
    """The read-write lock guarding one key: ``cache:<alias>:<full key>`` (its digest when
    that would be longer than a lock name may be)."""
    name = f"cache:{cache_alias}:{full_key}"
    if len(name) <= MAX_NAME_LENGTH:
        return name
    digest = hashlib.sha256(full_key.encode("utf-8", "surrogatepass")).hexdigest()
    return f"cache:{cache_alias[:200]}:sha256:{digest}"
