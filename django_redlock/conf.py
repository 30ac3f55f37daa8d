"""Read and validate the ``REDLOCK`` setting into frozen dataclasses.

Every error raises :class:`~django.core.exceptions.ImproperlyConfigured` naming the alias and
the key, so ``manage.py check`` and the first lock call report the same message. Each
``NODES`` entry is parsed by :mod:`.node_settings` (re-exported here: ``NodeSpec``,
``mask_url``, ``mask_secrets``, ``url_identity``, ``hash_tag``).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, replace
from functools import cached_property
from typing import Any

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured

from .engine import (
    DEFAULT_IDLE_TIMEOUT,
    DEFAULT_MAX_CONNECTIONS,
    GLOB_CHARACTERS,
    MAX_NAME_LENGTH,
    TOKEN_LIMIT,
    quorum,
)
from .nodes.cluster import shard_prefixes
from .nodes.node_settings import URL_SCHEMES, hash_tag, parse_node
from .nodes.node_settings import setting_error as _error
from .nodes.spec import NodeSpec, mask_secrets, mask_url, url_identity
from .validation import MAX_TTL, ttl_problem

DEFAULT_NODE_URL = "redis://127.0.0.1:6379/0"
DEFAULTS: dict[str, Any] = {
    "NODES": [DEFAULT_NODE_URL],
    "TTL": 30.0,
    "KEY_PREFIX": "lock:",
    "NODE_TIMEOUT": 0.05,
    "RETRY_DELAY": 0.2,
    "DRIFT_FACTOR": 0.01,
    "TIMEOUT": 10.0,
    "FAN_OUT": "all",
    "MAX_CONNECTIONS": DEFAULT_MAX_CONNECTIONS,
    "IDLE_TIMEOUT": DEFAULT_IDLE_TIMEOUT,
}
#: ``FAN_OUT``: "all" asks every node at once; "quorum" asks a quorum of nodes first and the
#: others only when that did not win (docs/algorithm.md).
FAN_OUTS = ("quorum", "all")
#: Bounds no sane deployment reaches (docs/index.md): below 1 ms no node answers a call in time,
#: and the socket timeouts derived from NODE_TIMEOUT must stay finite; a RETRY_DELAY below 1 ms
#: makes each waiter retry thousands of times a second; a DRIFT_FACTOR above 0.5 spends more than
#: half of every lease on the clock-drift allowance.
NODE_TIMEOUT_RANGE = (0.001, 60.0)
RETRY_DELAY_MIN = 0.001
DRIFT_FACTOR_MAX = 0.5
#: Longest IDLE_TIMEOUT, 30 days: the idle closer waits that long in a thread, and a thread
#: wait above about 9.2e9 s raises OverflowError (which would end the closer for good).
IDLE_TIMEOUT_MAX = 30 * 86400.0
__all__ = [
    "MAX_NAME_LENGTH",
    "URL_SCHEMES",
    "AliasConfig",
    "NodeSpec",
    "alias_config",
    "hash_tag",
    "mask_secrets",
    "mask_url",
    "parse_alias",
    "url_identity",
]


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
    fan_out: str = "all"
    #: at most this many connections per node and process (docs/production.md)
    max_connections: int = DEFAULT_MAX_CONNECTIONS
    #: an idle connection is closed after this many seconds
    idle_timeout: float = DEFAULT_IDLE_TIMEOUT
    #: a spread cluster alias: the key prefixes of its shards (see :mod:`.cluster`); else ()
    shards: tuple[str, ...] = ()

    @property
    def quorum(self) -> int:
        return quorum(len(self.nodes))

    @cached_property
    def shard_configs(self) -> tuple[AliasConfig, ...]:
        """One config per shard (its prefix, its cluster nodes on its slot); ``(self,)`` for
        an alias that is not spread."""
        return tuple(_pinned(self, prefix, shards=()) for prefix in self.shards) or (self,)


def _pinned(config: AliasConfig, prefix: str, *, shards: tuple[str, ...]) -> AliasConfig:
    """``config`` with ``prefix`` as its key prefix and its cluster nodes on that prefix's
    hash slot."""
    nodes = tuple(replace(n, hash_tag_of=prefix) if n.cluster else n for n in config.nodes)
    return replace(config, key_prefix=prefix, nodes=nodes, shards=shards)


def _number(alias: str, key: str, value: Any, *, allow_zero: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise _error(alias, key, f"must be a number of seconds, not {type(value).__name__}.")
    if not math.isfinite(value) or value < 0 or (value == 0 and not allow_zero):
        bound = ">= 0" if allow_zero else "> 0"
        raise _error(alias, key, f"must be a finite number {bound}, got {value!r}.")
    return float(value)


def _ttl(alias: str, raw: Any, drift_factor: float) -> float:
    ttl = _number(alias, "TTL", raw)
    if ttl > MAX_TTL or ttl * 1000 >= TOKEN_LIMIT:
        raise _error(
            alias, "TTL", f"{raw!r} seconds is too large for a lease (at most {MAX_TTL:g} s)."
        )
    problem = ttl_problem(ttl, drift_factor)
    if problem is not None:
        raise _error(alias, "TTL", problem)
    return ttl


def _within(alias: str, key: str, raw: Any, low: float, high: float | None, why: str) -> float:
    """A number of seconds from ``low`` to ``high`` (None: no upper bound), both included."""
    value = _number(alias, key, raw)
    if value < low or (high is not None and value > high):
        span = f"at least {low:g}" if high is None else f"from {low:g} to {high:g}"
        raise _error(alias, key, f"must be {span} seconds ({why}), got {raw!r}.")
    return value


def _drift_factor(alias: str, raw: Any) -> float:
    drift = _number(alias, "DRIFT_FACTOR", raw, allow_zero=True)
    if drift > DRIFT_FACTOR_MAX:
        raise _error(
            alias,
            "DRIFT_FACTOR",
            f"must be from 0 to {DRIFT_FACTOR_MAX}, got {drift!r}: the clock-drift allowance "
            "takes TTL * DRIFT_FACTOR + 2 ms of every lease (Redlock's usual factor is 0.01).",
        )
    return drift


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
    nodes = tuple(parse_node(alias, i, node) for i, node in enumerate(nodes_raw))
    prefix = merged["KEY_PREFIX"]
    if not isinstance(prefix, str):
        raise _error(alias, "KEY_PREFIX", f"must be a str, not {type(prefix).__name__}.")
    if any(ch in prefix for ch in GLOB_CHARACTERS):
        raise _error(
            alias, "KEY_PREFIX", f"must not contain glob characters ({' '.join(GLOB_CHARACTERS)})."
        )
    spread = any(node.cluster for node in nodes) and hash_tag(prefix) is None
    if spread and "{" in prefix:
        raise _error(
            alias,
            "KEY_PREFIX",
            f"{prefix!r} has a '{{' but no hash tag: with a cluster node, KEY_PREFIX either "
            "has no braces (the alias's locks spread over the cluster's masters, e.g. "
            "'lock:') or a non-empty {tag} (every key in that tag's slot, e.g. '{lock}:').",
        )
    timeout = merged["TIMEOUT"]
    drift = _drift_factor(alias, merged["DRIFT_FACTOR"])
    config = AliasConfig(
        alias=alias,
        nodes=nodes,
        ttl=_ttl(alias, merged["TTL"], drift),
        key_prefix=prefix,
        node_timeout=_within(
            alias,
            "NODE_TIMEOUT",
            merged["NODE_TIMEOUT"],
            *NODE_TIMEOUT_RANGE,
            "below 1 ms calls fail on scheduling jitter alone; above 60 s callers hang",
        ),
        retry_delay=_within(
            alias,
            "RETRY_DELAY",
            merged["RETRY_DELAY"],
            RETRY_DELAY_MIN,
            None,
            "less would make every waiter retry thousands of times a second",
        ),
        drift_factor=drift,
        timeout=None if timeout is None else _number(alias, "TIMEOUT", timeout, allow_zero=True),
        fan_out=_fan_out(alias, merged["FAN_OUT"]),
        max_connections=_max_connections(alias, merged["MAX_CONNECTIONS"]),
        idle_timeout=_idle_timeout(alias, merged["IDLE_TIMEOUT"]),
    )
    if spread:
        # the alias's own nodes (health, checks) look at its first shard's slot
        shards = shard_prefixes(prefix)
        return replace(_pinned(config, shards[0], shards=shards), key_prefix=prefix)
    if any(node.cluster for node in nodes):
        return _pinned(config, prefix, shards=())
    return config


def _max_connections(alias: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise _error(
            alias,
            "MAX_CONNECTIONS",
            f"must be an int >= 1 (connections per node and process), got {value!r}.",
        )
    return value


def _idle_timeout(alias: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise _error(
            alias, "IDLE_TIMEOUT", f"must be a number of seconds, not {type(value).__name__}."
        )
    if not math.isfinite(value) or not 0 < value <= IDLE_TIMEOUT_MAX:
        raise _error(
            alias,
            "IDLE_TIMEOUT",
            f"must be a finite number > 0 and at most {IDLE_TIMEOUT_MAX:.0f} (30 days; seconds "
            f"before an idle connection is closed), got {value!r}.",
        )
    return float(value)


def _fan_out(alias: str, value: Any) -> str:
    if value not in FAN_OUTS:
        choices = " or ".join(map(repr, FAN_OUTS))
        raise _error(alias, "FAN_OUT", f"must be {choices}, not {value!r}.")
    return str(value)


#: Every Django setting django-redlock reads; another ``REDLOCK*`` name is most likely a
#: misspelt one, which Django would silently ignore (system check W009).
SETTING_NAMES = (
    "REDLOCK",
    "REDLOCK_BUSY_POLL",
    "REDLOCK_BUSY_STATUS",
    "REDLOCK_CHECK_ORDER",
    "REDLOCK_IDEMPOTENCY",
    "REDLOCK_REQUEST_LOCKS",
    "REDLOCK_SCHEDULE",
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


def check_order_setting() -> bool:
    """``REDLOCK_CHECK_ORDER``: whether the lock-order checker runs (True or False; unset or
    None: ``DEBUG``). See docs/production.md, Ordering locks."""
    value = getattr(settings, "REDLOCK_CHECK_ORDER", None)
    if value is None:
        return bool(getattr(settings, "DEBUG", False))
    if not isinstance(value, bool):
        raise ImproperlyConfigured(
            f"REDLOCK_CHECK_ORDER must be True or False (or None: follow DEBUG), not {value!r}."
        )
    return value


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


# -- per-request locks: REDLOCK_BUSY_STATUS, REDLOCK_REQUEST_LOCKS ---------------------------
# Read here only; django_redlock.request_locks turns them into responses and rules, and its
# system checks attach ids (E016, E010) to these errors.

#: Default of ``REDLOCK_BUSY_STATUS``: the status of a request whose lock is busy.
DEFAULT_BUSY_STATUS = 409


def busy_status_setting() -> int:
    """``REDLOCK_BUSY_STATUS``: an int from 400 to 599, default 409."""
    status = getattr(settings, "REDLOCK_BUSY_STATUS", DEFAULT_BUSY_STATUS)
    if isinstance(status, bool) or not isinstance(status, int) or not 400 <= status <= 599:
        raise ImproperlyConfigured(
            f"REDLOCK_BUSY_STATUS must be an int from 400 to 599, got {status!r}."
        )
    return status


def request_locks_setting() -> list[Any]:
    """The raw entries of ``REDLOCK_REQUEST_LOCKS`` (default none); each is parsed by
    ``django_redlock.request_locks.rules.parse_rule``."""
    raw = getattr(settings, "REDLOCK_REQUEST_LOCKS", [])
    if not isinstance(raw, list | tuple):
        raise ImproperlyConfigured(
            f"REDLOCK_REQUEST_LOCKS must be a list of dicts, not {type(raw).__name__}."
        )
    return list(raw)


# -- idempotent requests: REDLOCK_IDEMPOTENCY --------------------------------------------------
IDEMPOTENCY_DEFAULTS: dict[str, Any] = {
    "HEADER": "Idempotency-Key",
    "TTL": 86400,
    "MAX_BYTES": 1048576,
}
#: Longest ``TTL`` of a kept response: 365 days.
IDEMPOTENCY_TTL_MAX = 365 * 86400.0
#: Largest ``MAX_BYTES``: 1 MiB. The engine writes a record in one send on its non-blocking
#: socket and reads it back within the alias's ``NODE_TIMEOUT``; a larger record can fail
#: both (an 8 MB one did, on loopback), and then is never kept or never replayed.
IDEMPOTENCY_MAX_BYTES_MAX = 1024 * 1024
#: An HTTP header name (RFC 9110 token characters).
_HEADER_NAME = re.compile(r"^[A-Za-z0-9!#$%&'*+.^_`|~-]+$")


@dataclass(frozen=True)
class IdempotencyConfig:
    """The validated ``REDLOCK_IDEMPOTENCY`` setting."""

    header: str = "Idempotency-Key"
    ttl: float = 86400.0
    max_bytes: int = 1048576


def _idempotency_error(key: str, why: str) -> ImproperlyConfigured:
    return ImproperlyConfigured(f"REDLOCK_IDEMPOTENCY['{key}'] {why}")


def idempotency_setting() -> IdempotencyConfig:
    """``REDLOCK_IDEMPOTENCY``: the request header, how long a response is kept (seconds) and
    the largest response body kept (bytes); each key defaults as in ``IDEMPOTENCY_DEFAULTS``."""
    raw = getattr(settings, "REDLOCK_IDEMPOTENCY", {})
    if not isinstance(raw, Mapping):
        raise ImproperlyConfigured(
            f"REDLOCK_IDEMPOTENCY must be a dict with the keys HEADER, TTL and MAX_BYTES, not "
            f"{type(raw).__name__}."
        )
    unknown = sorted(map(str, set(raw) - set(IDEMPOTENCY_DEFAULTS)))
    if unknown:
        raise ImproperlyConfigured(
            f"REDLOCK_IDEMPOTENCY has unknown key(s) {', '.join(unknown)}; allowed: "
            f"{', '.join(IDEMPOTENCY_DEFAULTS)}."
        )
    merged = {**IDEMPOTENCY_DEFAULTS, **raw}
    header, ttl, max_bytes = merged["HEADER"], merged["TTL"], merged["MAX_BYTES"]
    if not isinstance(header, str) or not _HEADER_NAME.match(header):
        raise _idempotency_error(
            "HEADER", f"must be an HTTP header name such as 'Idempotency-Key', got {header!r}."
        )
    if isinstance(ttl, bool) or not isinstance(ttl, int | float):
        raise _idempotency_error("TTL", f"must be a number of seconds, not {type(ttl).__name__}.")
    if not math.isfinite(ttl) or not 1 <= ttl <= IDEMPOTENCY_TTL_MAX:
        raise _idempotency_error(
            "TTL",
            f"must be from 1 to {IDEMPOTENCY_TTL_MAX:.0f} seconds (365 days; how long a "
            f"response is kept for replays), got {ttl!r}.",
        )
    if isinstance(max_bytes, bool) or not isinstance(max_bytes, int):
        raise _idempotency_error(
            "MAX_BYTES", f"must be an int (bytes), not {type(max_bytes).__name__}."
        )
    if not 0 <= max_bytes <= IDEMPOTENCY_MAX_BYTES_MAX:
        raise _idempotency_error(
            "MAX_BYTES",
            f"must be from 0 to {IDEMPOTENCY_MAX_BYTES_MAX} (1 MiB: the largest record the "
            "engine's transport writes in one send and reads back within NODE_TIMEOUT "
            "reliably; a larger response is sent but not kept, and its retry gets 409), "
            f"got {max_bytes!r}.",
        )
    return IdempotencyConfig(header, float(ttl), max_bytes)
