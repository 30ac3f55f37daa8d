"""Exceptions raised by django-redlock. Every one carries its context and says what to do next."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


class LockError(Exception):
    """Base class of every lock error."""


class LockNotAcquired(LockError):
    """The lock is held by someone else and was not acquired within ``timeout``."""

    def __init__(
        self,
        name: str,
        *,
        timeout: float | None = None,
        votes: int = 0,
        quorum: int = 1,
        errors: Mapping[str, str] | None = None,
        retry_after: float | None = None,
        waited: float | None = None,
        raced: bool = False,
    ) -> None:
        self.name = name
        self.timeout = timeout
        #: seconds until the holder's lease runs out, when a node said so
        self.retry_after = retry_after
        self.votes = votes
        self.quorum = quorum
        self.errors = dict(errors or {})
        if not timeout:
            how = "in one attempt"
        elif waited is not None and waited < timeout / 2:  # ended early: nothing to wait for
            how = (
                f"after {waited:.2g} s, before its {timeout:g} s timeout (it cannot be waited for)"
            )
        else:
            how = f"within {timeout:g} s"
        if raced:  # its fencing token lost to other callers racing for it, again and again
            message = (
                f"Lock {name!r} was not acquired {how}: {votes}/{quorum} votes granted it, "
                "but each attempt's fencing token was drawn first on a lagging node by another "
                "caller (many leases taken at the same moment). Retry, or pass a timeout=."
            )
        elif votes >= quorum:  # granted, yet too late: the lease had no validity left
            message = (
                f"Lock {name!r} was not acquired {how}: {votes}/{quorum} votes granted it, but "
                "it could not be kept, most often because its validity ran out before the "
                "nodes answered (a ttl= too short for their round trip and the clock-drift "
                "allowance). Pass a longer ttl=."
            )
        else:
            message = (
                f"Lock {name!r} is busy: not acquired {how} ({votes}/{quorum} votes). "
                "Retry later, or pass a longer timeout=."
            )
        super().__init__(message)


class LockLost(LockError):
    """The lease expired or was taken by someone else while it was held."""

    def __init__(self, name: str, reason: str = "its validity ran out") -> None:
        self.name = name
        self.reason = reason
        super().__init__(
            f"Lock {name!r} was lost while held: {reason}. The critical section may have run "
            "unprotected; use a longer ttl=, extend() the lease, or auto_extend=True."
        )


class NodesUnavailable(LockError):
    """Too few nodes answered (or too few are trusted) to reach a quorum."""

    def __init__(
        self,
        name: str,
        *,
        answered: int,
        quorum: int,
        total: int,
        errors: Mapping[str, str] | None = None,
        retry_after: float | None = None,
    ) -> None:
        self.name = name
        self.retry_after = retry_after
        self.answered = answered
        self.quorum = quorum
        self.total = total
        self.errors = dict(errors or {})
        detail = "; ".join(f"{node}: {err}" for node, err in self.errors.items())
        super().__init__(
            f"Lock {name!r}: only {answered} of {total} Redis nodes could vote, {quorum} needed"
            + (f" ({detail})" if detail else "")
            + ". Check the nodes with `manage.py redlock nodes`; a restarted, wiped or evicted "
            "node (one that lost its keys: see check W004) votes again one lease TTL later."
        )


class StaleTokenError(LockError):
    """A FencedModel write carried an older fencing token than the row has seen.

    ``deleted_token`` is set when an insert was refused because a row with the same unique
    key was deleted under that (newer) token; ``row_token`` is then None.
    """

    deleted_token: int | None = None

    def __init__(
        self,
        model: Any,
        pk: Any,
        *,
        row_token: int | None,
        token: int | None,
        message: str | None = None,
    ) -> None:
        self.model = model
        self.pk = pk
        self.row_token = row_token
        self.token = token
        label = getattr(getattr(model, "_meta", None), "label", repr(model))
        super().__init__(
            message
            or f"{label} pk={pk!r}: write with fencing token {token} rejected "
            f"(row token {row_token}). Re-acquire the lock and re-read the row."
        )
