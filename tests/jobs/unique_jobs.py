"""Jobs for tests/jobs/test_unique_tasks.py and test_unique_rq.py: unique django-tasks tasks
and a plain function for RQ.

Each run records itself as a Product row named ``"<label> <day> pid=<pid>"`` when it starts,
so a test sees that it runs, how many times, and which process to kill."""

from __future__ import annotations

import os
import time
from typing import Any

from django_tasks import TaskContext, task
from django_tasks.backends.base import BaseTaskBackend

from django_redlock.contrib.tasks import unique_task
from testproject.inventory.models import Product


def _record(label: str, day: str, hold: float) -> str:
    Product.objects.create(name=f"{label} {day} pid={os.getpid()}")
    time.sleep(hold)
    return "ran"


@unique_task("uniq-started:{day}", until="started")
@task()
def report_until_started(day: str, hold: float = 0.0) -> str:
    """Unique while queued only."""
    return _record("until-started", day, hold)


@unique_task("uniq-finished:{day}", until="finished", ttl=2)
@task()
def report_until_finished(day: str, hold: float = 0.0) -> str:
    """Unique while queued and while running (a 2 s marker lease while it runs)."""
    return _record("until-finished", day, hold)


def rq_report(label: str, day: str, hold: float = 0.0) -> str:
    """The RQ job (a plain function)."""
    return _record(label, day, hold)


@task()
def plain_report(day: str) -> str:
    """A task without unique_task (the tests apply it to this one with bad options)."""
    return _record("plain", day, 0.0)


@unique_task("pair:{days}", until="finished", ttl=2)
@task()
def report_pair(days: list[str], hold: float = 0.0) -> str:
    """Its key is filled from a list, which the worker gets back from JSON (a tuple
    enqueued comes back a list)."""
    return _record("pair", "-".join(days), hold)


@unique_task("context:{day}")
@task(takes_context=True)
def report_with_context(context: TaskContext, day: str) -> str:
    """A task that takes its context: the template names the enqueue's arguments only."""
    return _record(f"context-{context.attempt}", day, 0.0)


@unique_task("outage:{day}", until="finished", using="unique-outage")
@task()
def report_in_outage(day: str) -> str:
    """Its markers live on the alias ``unique-outage``, whose node a test stops."""
    return _record("outage", day, 0.0)


@unique_task("first:{days[0]}", until="finished", ttl=2)
@task()
def report_first(days: list[str]) -> str:
    """A test sends it around unique_task with an argument its template cannot index."""
    return _record("first", str(days), 0.0)


def rq_fail(label: str, day: str) -> str:
    """An RQ job that records its run and fails (a test retries it)."""
    _record(label, day, 0.0)
    raise RuntimeError("this job fails")


class NoResultsBackend(BaseTaskBackend):  # type: ignore[misc]
    """A task backend that cannot find a task by its id (no ``get_result``), as some queue
    backends are: unique_task must refuse it before sending."""

    def enqueue(self, task: Any, args: Any, kwargs: Any) -> Any:
        raise AssertionError("unique_task sent a task to a backend it cannot look tasks up in")
