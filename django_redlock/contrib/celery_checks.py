"""What :class:`~.celery.LockedTask` checks of a task class when it is made (its ``lock_*``
options) and of a message it sends (canvases, expiry)."""

from __future__ import annotations

import inspect
from collections.abc import Iterator
from datetime import datetime
from typing import Any

from celery import Task

from ..locking.templates import CallTemplate
from ..validation import check_max_hold, check_permits, check_ttl

#: What a busy run may do (``lock_on_busy``).
ON_BUSY_CHOICES = ("skip", "retry", "raise")


def check_options(cls: Any) -> None:
    """Refuse options that could never work, when the task class is created."""
    if cls.lock_on_busy not in ON_BUSY_CHOICES:
        raise ValueError(
            f"{cls.__qualname__}: lock_on_busy must be 'skip', 'retry' or 'raise', "
            f"not {cls.lock_on_busy!r}."
        )
    if not isinstance(cls.lock_using, str):
        raise TypeError(f"{cls.__qualname__}: lock_using must be an alias (str).")
    if not isinstance(cls.lock_enqueue_once, bool):
        raise TypeError(f"{cls.__qualname__}: lock_enqueue_once must be True or False.")
    try:
        if cls.lock_ttl is not None:
            check_ttl(cls.lock_ttl)
        check_ttl(cls.lock_enqueue_ttl)
        check_max_hold(cls.lock_min_hold, "lock_min_hold")
    except (TypeError, ValueError) as exc:
        raise type(exc)(f"{cls.__qualname__}: {exc}") from None
    check_limits(cls)
    if cls.lock_name is not None:
        if not isinstance(cls.lock_name, str):
            raise TypeError(f"{cls.__qualname__}: lock_name must be a str template.")
        run = _run_of(cls)
        if run is not None:
            CallTemplate(cls.lock_name, run)  # a field the task has no argument for fails here


def check_limits(cls: Any) -> None:
    """``lock_limits``: a dict of name templates to permits (ints >= 1)."""
    limits = cls.lock_limits
    if limits is None:
        return
    if not isinstance(limits, dict) or not limits:
        raise TypeError(
            f"{cls.__qualname__}: lock_limits must be a non-empty dict of name templates to "
            'permits, e.g. {"api:global": 20, "api:tenant:{tenant}": 2}.'
        )
    run = _run_of(cls)
    for template, permits in limits.items():
        if not isinstance(template, str):
            raise TypeError(f"{cls.__qualname__}: lock_limits keys must be str templates.")
        try:
            check_permits(permits)
        except (TypeError, ValueError) as exc:
            raise type(exc)(f"{cls.__qualname__}: lock_limits[{template!r}]: {exc}") from None
        if run is not None:
            CallTemplate(template, run)  # a field the task has no argument for fails here


def _run_of(cls: Any) -> Any:
    """The task's body as its callers see it (without ``self``), or None when it is
    Celery's placeholder (a base class for tasks)."""
    raw = inspect.getattr_static(cls, "run")
    if raw is inspect.getattr_static(Task, "run"):
        return None
    if isinstance(raw, staticmethod | classmethod):
        return cls.run
    return raw.__get__(_Unbound(), cls)  # a method (bind=True): the signature without self


class _Unbound:
    """Stands for the task instance when reading a method's signature."""


def canvas_message(task: str, role: str) -> str:
    return (
        f"Task {task} has lock_enqueue_once and cannot be sent as a member of a {role}: "
        "lock_enqueue_once refuses canvases (group, chord or chain), because a send it "
        "suppressed would leave the canvas waiting forever. Send it on its own, or use a task "
        "without lock_enqueue_once in the canvas."
    )


def members(signatures: Any) -> Iterator[dict[str, Any]]:
    """The task signatures in ``signatures`` (a list of signatures, groups, chains and
    chords, as dicts or Signatures), nested canvases flattened."""
    if isinstance(signatures, list | tuple):
        for each in signatures:
            yield from members(each)
        return
    if not isinstance(signatures, dict):
        return
    kind = signatures.get("subtask_type")
    inner = signatures.get("kwargs") or {}
    if kind in ("group", "chain"):
        yield from members(inner.get("tasks"))
    elif kind == "chord":
        yield from members([inner.get("header"), inner.get("body")])
    elif signatures.get("task"):
        yield signatures


def seconds_to_expiry(expires: Any, now: datetime) -> float | None:
    """Seconds until a message's ``expires`` (seconds, a datetime or an ISO 8601 string, as
    Celery accepts it), or None when it has none."""
    if expires is None:
        return None
    if isinstance(expires, str):
        expires = datetime.fromisoformat(expires)
    if isinstance(expires, datetime):
        if expires.tzinfo is None or now.tzinfo is None:
            now = now.replace(tzinfo=expires.tzinfo)
        return (expires - now).total_seconds()
    return float(expires)
