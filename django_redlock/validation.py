"""Argument checks done before any network call."""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

from .engine import (
    DRIFT_ALLOWANCE,
    MAX_NAME_LENGTH,
    RESERVED_MARK,
    TOKEN_LIMIT,
    drift_allowance,
)


class _Unset:
    def __repr__(self) -> str:
        return "UNSET"


#: ``timeout`` not given: the alias's ``TIMEOUT`` applies.
UNSET: Any = _Unset()


def check_name(name: Any) -> str:
    """A lock name: a non-empty ``str`` of at most 512 characters (not counting the prefix)."""
    if not isinstance(name, str):
        raise TypeError(f"Lock name must be a str, not {type(name).__name__}.")
    if type(name) is not str:  # a subclass: a plain str of it (its methods may say anything)
        name = str.__str__(name)
    if not name:
        raise ValueError("Lock name must not be empty.")
    if name.startswith(RESERVED_MARK):
        raise ValueError(
            f"Lock name {name[:40]!r} starts with {RESERVED_MARK!r}, which is reserved for "
            "django-redlock's own keys; choose another name."
        )
    if len(name) > MAX_NAME_LENGTH:
        raise ValueError(
            f"Lock name is {len(name)} characters long; the limit is {MAX_NAME_LENGTH}."
        )
    if not name.isascii():
        try:
            name.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise ValueError(
                f"Lock name contains a lone surrogate ({name[exc.start]!r} at position "
                f"{exc.start}); names must be encodable as UTF-8."
            ) from None
    return str(name)


#: ``DRIFT_FACTOR``'s default; ``check_ttl`` uses it unless told the alias's own.
DEFAULT_DRIFT_FACTOR = 0.01


def ttl_problem(ttl: float, drift_factor: float) -> str | None:
    """Why a lease of ``ttl`` seconds can never be valid (None if it can): the engine counts
    a lease valid for ``TTL - (TTL * DRIFT_FACTOR + 2 ms)`` minus the round trip."""
    if ttl - drift_allowance(ttl, drift_factor) > 0:
        return None
    shortest = DRIFT_ALLOWANCE / (1 - drift_factor)
    return (
        f"{ttl!r} s leaves no validity: a lease is valid for TTL - (TTL * DRIFT_FACTOR + 2 ms) "
        f"minus the round trip, so with DRIFT_FACTOR {drift_factor!r} it must be above "
        f"{shortest:.6g} s."
    )


#: The longest lease, seconds: its renewals wait a third of it, which a thread can (about 31
#: years; a longer wait overflows ``threading``'s timeout, and no lease needs one).
MAX_TTL = 1e9


def check_ttl(ttl: Any, drift_factor: float = DEFAULT_DRIFT_FACTOR) -> float:
    """A lease TTL in seconds: a finite number > 0 that leaves some validity after the
    alias's clock-drift allowance (see :func:`ttl_problem`)."""
    if isinstance(ttl, bool) or not isinstance(ttl, int | float):
        raise TypeError(f"ttl must be a number of seconds, not {type(ttl).__name__}.")
    if not math.isfinite(ttl) or ttl <= 0:
        raise ValueError(f"ttl must be a finite number of seconds > 0, got {ttl!r}.")
    if ttl > MAX_TTL or ttl * 1000 >= TOKEN_LIMIT:
        raise ValueError(f"ttl {ttl!r} is too large: at most {MAX_TTL:g} s (about 31 years).")
    problem = ttl_problem(ttl, drift_factor)
    if problem is not None:
        raise ValueError(f"ttl {problem}")
    return float(ttl)


def check_timeout(timeout: Any) -> float | None:
    """How long to wait: ``None`` (forever) or a number >= 0."""
    if timeout is None:
        return None
    if (type(timeout) is int or type(timeout) is float) and 0 <= timeout < math.inf:
        return float(timeout)  # the common case, without the calls below (NaN fails 0 <=)
    if isinstance(timeout, bool) or not isinstance(timeout, int | float):
        raise TypeError(
            f"timeout must be a number of seconds or None, not {type(timeout).__name__}."
        )
    if math.isnan(timeout) or timeout < 0:
        raise ValueError(f"timeout must be >= 0 (or None to wait forever), got {timeout!r}.")
    return None if math.isinf(timeout) else float(timeout)


#: The longest ``min_hold`` (seconds): 400 days, above any schedule's period.
MAX_MIN_HOLD = 400 * 86400.0


def check_max_hold(max_hold: Any, what: str = "max_hold") -> float | None:
    """How long auto-extend may keep renewing: ``None`` or ``inf`` (no limit) or a number > 0.
    As ``min_hold`` (how long a job's name stays taken after a run): ``None`` or a finite
    number > 0 of at most :data:`MAX_MIN_HOLD` seconds."""
    if max_hold is None:
        return None
    if isinstance(max_hold, bool) or not isinstance(max_hold, int | float):
        raise TypeError(f"{what} must be a number of seconds, not {type(max_hold).__name__}.")
    if math.isnan(max_hold) or max_hold <= 0:
        raise ValueError(f"{what} must be > 0, got {max_hold!r}.")
    if what == "max_hold":
        return None if math.isinf(max_hold) else float(max_hold)
    if math.isinf(max_hold) or max_hold > MAX_MIN_HOLD:
        raise ValueError(
            f"{what} must be a finite number of seconds of at most {MAX_MIN_HOLD:.0f} "
            f"(400 days), got {max_hold!r}."
        )
    return float(max_hold)


#: The most permits a semaphore may have: each attempt passes every slot's key to the nodes.
MAX_PERMITS = 1024


def check_permits(permits: Any) -> int:
    """A semaphore's number of permits: an int from 1 to :data:`MAX_PERMITS`."""
    if isinstance(permits, bool) or not isinstance(permits, int):
        raise TypeError(f"permits must be an int, not {type(permits).__name__}.")
    if not 1 <= permits <= MAX_PERMITS:
        raise ValueError(f"permits must be from 1 to {MAX_PERMITS}, got {permits!r}.")
    return permits


def check_rw(rw: Any) -> str:
    """Which lease of a read-write lock: ``"read"`` or ``"write"``."""
    if rw not in ("read", "write"):
        raise ValueError(f"rw must be 'read' or 'write', not {rw!r}.")
    return str(rw)


def check_keywords(given: Iterable[str], allowed: Iterable[str]) -> None:
    """Refuse a keyword argument a ``**options`` signature does not take (as Python would)."""
    unknown = sorted(set(given) - set(allowed))
    if unknown:
        raise TypeError(f"Unexpected keyword argument {unknown[0]!r}.")
