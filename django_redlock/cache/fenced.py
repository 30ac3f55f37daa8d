"""What every fenced cache store offers :mod:`.fill`: read a value (fresh or stale), write one
under a lease's token unless a newer lease's is there. :mod:`.stores` runs them as Lua scripts
on a Redis cache; :mod:`.local_store` in one process's ``LocMemCache``."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.core.cache import BaseCache

#: Prefix of the fence record's key (before the backend's full key of the value). Django's and
#: django-redis's keys are ``<KEY_PREFIX>:<version>:<key>`` with an integer version, so no key
#: given to the cache API becomes a record's key (a suffix could: ``key + suffix``), and their
#: ``keys()``/``delete_pattern()`` (which match ``<KEY_PREFIX>:<version>:...``) leave it out.
FENCE_PREFIX = "redlock:fence:"


def record_key(full_key: str) -> str:
    """The key of the fence record of the value at ``full_key``."""
    return FENCE_PREFIX + full_key


@dataclass(frozen=True, slots=True)
class Found:
    """A value read from the cache; ``stale``: past its freshness, within the grace asked."""

    value: Any
    stale: bool


class FencedStore:
    """One cache backend's fenced reads and writes of a key."""

    def __init__(self, backend: BaseCache) -> None:
        self.backend = backend

    def full_key(self, key: str) -> str:
        """The backend's own key of ``key`` (what the lock's name is made from)."""
        raise NotImplementedError

    def read(self, full_key: str, grace_ms: int) -> Found | None:
        """The value at ``full_key``: fresh, stale within ``grace_ms``, or None (a miss)."""
        raise NotImplementedError

    def write(self, full_key: str, value: Any, token: int, fresh_ms: int, grace_ms: int) -> bool:
        """Store ``value`` under ``token``; False (nothing written) if a newer lease's is there."""
        raise NotImplementedError
