"""Unique RQ jobs: :func:`enqueue_unique` (needs ``rq``).

::

    job = enqueue_unique(queue, build_report, "2026-11-24", key="report:2026-11-24")

sends ``build_report("2026-11-24")`` unless a job of that key is queued (or running, with
``until="finished"``), and returns that job then. The job RQ runs is :func:`run_unique`, which
frees (or holds, and renews) the key's marker around the call. See docs/effects.md
("Unique tasks").
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from rq import Queue, get_current_job
from rq.exceptions import NoSuchJobError
from rq.job import Job, JobStatus

from ..jobs.unique import (
    DEFAULT_QUEUED_TTL,
    OVER,
    QUEUED,
    RUNNING,
    Found,
    UniqueRule,
)

__all__ = ["enqueue_unique", "run_unique"]

_WAITING = {JobStatus.QUEUED, JobStatus.DEFERRED, JobStatus.SCHEDULED}


@dataclass(frozen=True)
class UniqueCall:
    """What :func:`run_unique` gets with the job's arguments: the function, key and rule."""

    func: Callable[..., Any] | str
    key: str
    rule: UniqueRule


def enqueue_unique(
    queue: Queue,
    func: Callable[..., Any] | str,
    *args: Any,
    key: str,
    until: str = "started",
    using: str = "default",
    queued_ttl: float = DEFAULT_QUEUED_TTL,
    lease_ttl: float | None = None,
    **kwargs: Any,
) -> Job:
    """``queue.enqueue(func, *args, **kwargs)`` unless a job of ``key`` is queued (or running,
    with ``until="finished"``): then that job, re-fetched, and nothing is sent.

    ``using``: the ``REDLOCK`` alias of the marker; ``queued_ttl``: how long a queued job holds
    its key without a worker starting it; ``lease_ttl``: the running marker's TTL
    (``until="finished"``; default: the alias's ``TTL``). RQ's own options (``job_timeout``,
    ``result_ttl``, ``at_front``...) pass through ``kwargs`` as for ``queue.enqueue``."""
    if not isinstance(queue, Queue):
        raise TypeError(f"enqueue_unique needs an rq.Queue, not {type(queue).__name__}.")
    if not (callable(func) or _is_dotted_path(func)):
        raise TypeError(
            f"enqueue_unique needs a function (or its dotted path, 'module.function'), "
            f"not {func!r}."
        )
    if not isinstance(key, str):
        raise TypeError(f"key must be a str, not {type(key).__name__}.")
    _check_rq_options(kwargs)
    rule = UniqueRule(until, using, queued_ttl, lease_ttl)
    call = UniqueCall(func, key, rule)
    _check_serializable(queue, call)

    def lookup(ident: str) -> Found[Job]:
        try:
            job = Job.fetch(ident, connection=queue.connection, serializer=queue.serializer)
        except NoSuchJobError:
            return Found(OVER)
        status = job.get_status(refresh=False)
        if status in _WAITING:
            return Found(QUEUED, job)
        if status == JobStatus.STARTED:
            return Found(RUNNING, job, _seconds_since(job.started_at))
        return Found(OVER, job)

    def send() -> tuple[str, Job]:
        job = queue.enqueue(run_unique, call, *args, **kwargs)
        return str(job.id), job

    return rule.enqueue_once(key, lookup, send)


def _is_dotted_path(func: object) -> bool:
    if not isinstance(func, str):
        return False
    parts = func.split(".")
    return len(parts) > 1 and all(part.isidentifier() for part in parts)


def _check_rq_options(kwargs: dict[str, Any]) -> None:
    """Refuse the options of ``queue.enqueue`` that cannot go through ``enqueue_unique``."""
    if "pipeline" in kwargs:
        raise TypeError(
            "enqueue_unique cannot take pipeline=: the job would be sent when the pipeline "
            "executes, after the key's check and mark, so each call would send a job. Call "
            "it without a pipeline."
        )
    for name in ("args", "kwargs"):
        if name in kwargs:
            raise TypeError(
                f"enqueue_unique passes its own *args and **kwargs to the function; RQ's "
                f"explicit {name}= is not supported: write enqueue_unique(queue, func, *args, "
                f"key=..., **kwargs)."
            )


def _check_serializable(queue: Queue, call: UniqueCall) -> None:
    """The job's first argument (the :class:`UniqueCall`) must go through the queue's
    serializer: refuse, before sending, a serializer that cannot carry it (JSON)."""
    try:
        queue.serializer.dumps(call)
    except Exception as exc:
        serializer = getattr(queue.serializer, "__name__", queue.serializer)
        raise TypeError(
            f"enqueue_unique sends the function, key and rule with the job (a UniqueCall), "
            f"which this queue's serializer ({serializer}) cannot write ({exc}); use a queue "
            f"with RQ's default (pickle) serializer."
        ) from None


def run_unique(call: UniqueCall, *args: Any, **kwargs: Any) -> Any:
    """The job RQ runs for :func:`enqueue_unique`: free the key (``until="started"``) or hold
    it while ``call.func`` runs (``until="finished"``), then call it."""
    job = get_current_job()
    func = call.func
    if isinstance(func, str):
        from django.utils.module_loading import import_string

        func = import_string(func)
    if job is None:  # called outside a worker: nothing holds the key
        return func(*args, **kwargs)
    call.rule.started(call.key, str(job.id))
    try:
        result = func(*args, **kwargs)
    except BaseException:
        if job.should_retry:  # RQ queues (or schedules) it again: it keeps holding the key
            call.rule.requeued(call.key, str(job.id))
        else:
            call.rule.finished(call.key, str(job.id))
        raise
    call.rule.finished(call.key, str(job.id))
    return result


def _seconds_since(moment: datetime | None) -> float | None:
    if moment is None:
        return None
    if moment.tzinfo is None:  # RQ keeps UTC
        moment = moment.replace(tzinfo=UTC)
    return (datetime.now(UTC) - moment).total_seconds()
