"""Read and validate the ``REDLOCK`` setting into frozen dataclasses.

Every error raises :class:`~django.core.exceptions.ImproperlyConfigured` naming the alias and
the key, so ``manage.py check`` and the first lock call report the same message.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote, urlsplit

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured

DEFAULT_NODE_URL = "redis://127.0.0.1:6379/0"
DEFAULTS: dict[str, Any] = {
    "NODES": [DEFAULT_NODE_URL],
    "TTL": 30.0,
    "KEY_PREFIX": "lock:",
    "NODE_TIMEOUT": 0.05,
    "RETRY_DELAY": 0.2,
    "DRIFT_FACTOR": 0.01,
    "TIMEOUT": 10.0,
}
URL_SCHEMES = ("redis", "rediss", "unix")
MAX_NAME_LENGTH = 512


@dataclass(frozen=True)
class NodeSpec:
    """One Redis node: a URL, or the alias of a django-redis cache whose pool is reused."""

    url: str | None = None
    cache: str | None = None

    @property
    def label(self) -> str:
        """A printable name with any password masked."""
        if self.cache is not None:
            return f"cache:{self.cache}"
        return mask_url(self.url or "")

    @property
    def address(self) -> str | None:
        """``host:port`` or the socket path, used to spot duplicate nodes (None for caches)."""
        if self.url is None:
            return None
        parts = urlsplit(self.url)
        if parts.scheme == "unix":
            return parts.path
        return f"{(parts.hostname or '').lower()}:{parts.port or 6379}"


@dataclass(frozen=True)
class AliasConfig:
    """The validated settings of one ``REDLOCK`` alias."""

    alias: str
    nodes: tuple[NodeSpec, ...]
    ttl: float
    key_prefix: str
    node_timeout: float
    retry_delay: float
    drift_factor: float
    timeout: float | None

    @property
    def quorum(self) -> int:
        return len(self.nodes) // 2 + 1


def mask_url(url: str) -> str:
    """Return ``url`` with its password replaced by ``***``."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    user = unquote(parts.username or "")
    host = parts.netloc.rsplit("@", 1)[1]
    netloc = f"{user}:***@{host}" if user else f":***@{host}"
    return parts._replace(netloc=netloc).geturl()


def _error(alias: str, key: str, message: str) -> ImproperlyConfigured:
    return ImproperlyConfigured(f"REDLOCK[{alias!r}][{key!r}]: {message}")


def _number(alias: str, key: str, value: Any, *, allow_zero: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise _error(alias, key, f"must be a number of seconds, not {type(value).__name__}.")
    if not math.isfinite(value) or value < 0 or (value == 0 and not allow_zero):
        bound = ">= 0" if allow_zero else "> 0"
        raise _error(alias, key, f"must be a finite number {bound}, got {value!r}.")
    return float(value)


def _ttl(alias: str, raw: Any) -> float:
    ttl = _number(alias, "TTL", raw)
    if ttl * 1000 >= 2**53:
        raise _error(alias, "TTL", f"{raw!r} seconds is too large for a lease.")
    return ttl


def _node(alias: str, index: int, raw: Any) -> NodeSpec:
    key = f"NODES[{index}]"
    if isinstance(raw, str):
        parts = urlsplit(raw)
        if parts.scheme not in URL_SCHEMES:
            raise _error(
                alias,
                key,
                f"{mask_url(raw)!r} is not a redis://, rediss:// or unix:// URL.",
            )
        try:
            port = parts.port
        except ValueError as exc:
            raise _error(alias, key, f"{mask_url(raw)!r} has a bad port.") from exc
        if parts.scheme == "unix" and not parts.path:
            raise _error(alias, key, f"{raw!r} names no socket path.")
        if parts.scheme != "unix" and not parts.hostname:
            raise _error(alias, key, f"{mask_url(raw)!r} names no host.")
        del port
        return NodeSpec(url=raw)
    if isinstance(raw, Mapping):
        if set(raw) != {"CACHE"} or not isinstance(raw["CACHE"], str):
            raise _error(alias, key, 'a node given as a dict must be {"CACHE": "<cache alias>"}.')
        cache = raw["CACHE"]
        if cache not in getattr(settings, "CACHES", {}):
            raise _error(alias, key, f"CACHES has no alias {cache!r}.")
        return NodeSpec(cache=cache)
    raise _error(alias, key, f"must be a URL string or a {{'CACHE': alias}} dict, not {raw!r}.")


def parse_alias(alias: str, raw: Any) -> AliasConfig:
    """Validate one alias's dict; raises ``ImproperlyConfigured`` naming the alias and key."""
    if not isinstance(raw, Mapping):
        raise ImproperlyConfigured(f"REDLOCK[{alias!r}] must be a dict, not {type(raw).__name__}.")
    unknown = sorted(set(raw) - set(DEFAULTS))
    if unknown:
        raise _error(alias, unknown[0], f"unknown key; known keys are {', '.join(DEFAULTS)}.")
    merged = {**DEFAULTS, **raw}
    nodes_raw = merged["NODES"]
    if isinstance(nodes_raw, str | bytes) or not isinstance(nodes_raw, list | tuple):
        raise _error(alias, "NODES", "must be a list of node URLs or CACHE dicts.")
    if not nodes_raw:
        raise _error(alias, "NODES", "must list at least one node.")
    nodes = tuple(_node(alias, i, node) for i, node in enumerate(nodes_raw))
    prefix = merged["KEY_PREFIX"]
    if not isinstance(prefix, str):
        raise _error(alias, "KEY_PREFIX", f"must be a str, not {type(prefix).__name__}.")
    if any(ch in prefix for ch in "*?[]\\"):
        raise _error(alias, "KEY_PREFIX", "must not contain glob characters (* ? [ ] \\).")
    timeout = merged["TIMEOUT"]
    drift = _number(alias, "DRIFT_FACTOR", merged["DRIFT_FACTOR"], allow_zero=True)
    if drift >= 1:
        raise _error(alias, "DRIFT_FACTOR", f"must be below 1, got {drift!r}.")
    return AliasConfig(
        alias=alias,
        nodes=nodes,
        ttl=_ttl(alias, merged["TTL"]),
        key_prefix=prefix,
        node_timeout=_number(alias, "NODE_TIMEOUT", merged["NODE_TIMEOUT"]),
        retry_delay=_number(alias, "RETRY_DELAY", merged["RETRY_DELAY"]),
        drift_factor=drift,
        timeout=None if timeout is None else _number(alias, "TIMEOUT", timeout, allow_zero=True),
    )


#: Default of ``REDLOCK_BUSY_POLL``, seconds; and the largest value it accepts.
BUSY_POLL_DEFAULT = 0.0001
BUSY_POLL_MAX = 0.01


def busy_poll_setting() -> float:
    """``REDLOCK_BUSY_POLL``: how long a lock call may spin for the replies of a fast node
    before it sleeps in ``poll()`` (seconds; 0 turns spinning off). See docs/algorithm.md."""
    value = getattr(settings, "REDLOCK_BUSY_POLL", BUSY_POLL_DEFAULT)
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ImproperlyConfigured(
            f"REDLOCK_BUSY_POLL must be a number of seconds, not {type(value).__name__}."
        )
    if not math.isfinite(value) or not 0 <= value <= BUSY_POLL_MAX:
        raise ImproperlyConfigured(
            f"REDLOCK_BUSY_POLL must be between 0 (off) and {BUSY_POLL_MAX} seconds, got {value!r}."
        )
    return float(value)


def redlock_settings() -> dict[str, Any]:
    """The raw ``REDLOCK`` setting, defaulting to one ``default`` alias on localhost."""
    raw = getattr(settings, "REDLOCK", None)
    if raw is None:
        return {"default": {}}
    if not isinstance(raw, Mapping):
        raise ImproperlyConfigured(f"REDLOCK must be a dict of aliases, not {type(raw).__name__}.")
    return dict(raw)


def alias_config(alias: str) -> AliasConfig:
    """The validated config of ``alias``; unknown aliases raise ``ImproperlyConfigured``."""
    raw = redlock_settings()
    if alias not in raw:
        known = ", ".join(repr(a) for a in raw) or "none"
        raise ImproperlyConfigured(
            f"REDLOCK has no alias {alias!r} (configured: {known}). Add it to settings.REDLOCK."
        )
    return parse_alias(alias, raw[alias])
