"""A lease request, checked (:func:`want`), and what a failed one raises
(:func:`failure_exception`): the two ends of every acquire of :class:`~.manager.LockManager`."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Protocol

from .. import signals
from ..conf import AliasConfig
from ..engine import MAX_NAME_LENGTH, RESERVED_MARK, AcquireFailure
from ..exceptions import LockError, LockNotAcquired, NodesUnavailable
from ..validation import (
    UNSET,
    check_max_hold,
    check_name,
    check_permits,
    check_rw,
    check_timeout,
    check_ttl,
)


class Manager(Protocol):
    """What :func:`failure_exception` needs of a :class:`~.manager.LockManager`."""

    config: AliasConfig

    @property
    def alias(self) -> str: ...


# docs/index.md: one logger name (records carry .module)
logger = logging.getLogger("django_redlock")

_MARK_LENGTH = len(RESERVED_MARK)


@dataclass(slots=True)
class Wanted:
    """One checked request for a lease."""

    name: str
    ttl: float
    timeout: float | None
    max_hold: float | None
    #: a semaphore's permits; 0: a lock
    permits: int = 0
    #: "read" or "write" (a read-write lock); '': a lock
    rw: str = ""


def want(
    config: AliasConfig,
    name: Any,
    ttl: Any,
    timeout: Any,
    max_hold: Any,
    permits: Any = None,
    rw: Any = None,
) -> Wanted:
    """One request for a lease, checked (its TTL and TIMEOUT defaults were checked when the
    settings were read)."""
    if not (
        type(name) is str
        and 0 < len(name) <= MAX_NAME_LENGTH
        and name[:_MARK_LENGTH] != RESERVED_MARK
        and name.isascii()
    ):  # the common case passes without the call; check_name says what is wrong
        name = check_name(name)
    wanted = Wanted(
        name,
        config.ttl if ttl is None else check_ttl(ttl, config.drift_factor),
        config.timeout if timeout is UNSET else check_timeout(timeout),
        None if max_hold is None else check_max_hold(max_hold),
        0 if permits is None else check_permits(permits),
        "" if rw is None else check_rw(rw),
    )
    if wanted.permits and wanted.rw:
        raise ValueError("A lease is a semaphore's permit or a read-write lock's, not both.")
    return wanted


def failure_exception(manager: Manager, wanted: Wanted, failure: AcquireFailure) -> Exception:
    """What a failed attempt raises (``lock_failed`` is sent, the outcome logged at DEBUG)."""
    name, timeout, quorum = wanted.name, wanted.timeout, manager.config.quorum
    logger.debug(
        "Lock %r (alias %r) not acquired: %s, %d/%d votes",
        name,
        manager.alias,
        failure.reason,
        failure.votes,
        quorum,
    )
    if failure.reason == "other_kind":
        what = f"a semaphore of {wanted.permits} permits" if wanted.permits else "a lock"
        return LockError(
            f"{name!r} (alias {manager.alias!r}) is in use as another kind than {what}: a lock "
            "and a semaphore, or two semaphores with different numbers of permits, cannot "
            "share a name."
        )
    if failure.reason == "unavailable":
        reason = "unavailable"
        exc: Exception = NodesUnavailable(
            name,
            answered=failure.answered,
            quorum=quorum,
            total=len(manager.config.nodes),
            errors=failure.errors,
            retry_after=failure.retry_after,
        )
    else:
        reason = "busy" if not timeout else "timeout"
        exc = LockNotAcquired(
            name,
            timeout=timeout,
            votes=failure.votes,
            quorum=quorum,
            errors=failure.errors,
            retry_after=failure.retry_after,
            waited=failure.waited,
            raced=failure.raced,
        )
    signals.emit(
        signals.lock_failed,
        manager,
        alias=manager.alias,
        name=name,
        reason=reason,
        waited=failure.waited,
        attempts=failure.attempts,
        votes=failure.votes,
    )
    return exc
