"""Jobs for tests/jobs/test_django_tasks.py: django-tasks ``@task`` over django-redlock ``@lock``.

Each run records itself as a Product row named ``"<job> <day>"`` (written under the job's
lease when it has one, so the row also carries the lease's fencing token)."""

from __future__ import annotations

import time

from django_tasks import task

from django_redlock import lock
from testproject.inventory.models import Product


@task()
@lock("nightly:{day}", ttl=10, on_busy="skip", min_hold=60)
def nightly_report(day: str, hold: float = 0.0) -> str:
    """The nightly report: must run once per day, however many servers enqueue it (and
    however the workers order the copies: min_hold keeps the name taken after the run)."""
    Product.objects.create(name=f"locked {day}")
    time.sleep(hold)
    return "ran"


@task()
def nightly_report_unlocked(day: str, hold: float = 0.0) -> str:
    """The same job without the lock (the control)."""
    Product.objects.create(name=f"unlocked {day}")
    time.sleep(hold)
    return "ran"
