"""Jobs for the task-queue tests (RQ): plain functions under ``@lock``, as any queue calls them.

Each run records itself as a Product row named ``"<label> <day>"``."""

from __future__ import annotations

import time

from django_redlock import lock
from testproject.inventory.models import Product


@lock("rq-nightly:{day}", ttl=10, on_busy="skip", min_hold=60)
def rq_report(day: str, hold: float = 0.0) -> str:
    """Runs once per day, however many copies are queued and however the workers order them."""
    Product.objects.create(name=f"rq locked {day}")
    time.sleep(hold)
    return "ran"


def rq_report_unlocked(day: str, hold: float = 0.0) -> str:
    """The control: the same job without the lock."""
    Product.objects.create(name=f"rq unlocked {day}")
    time.sleep(hold)
    return "ran"
