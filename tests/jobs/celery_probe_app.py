# mypy: disable-error-code="untyped-decorator"
"""Tasks of the jobs-and-ops probes, on the app of tests/jobs/celery_app.py (same broker and
record store); a real worker imports this module with ``-A``."""

from __future__ import annotations

import os
import time
from typing import Any

from django_redlock import locks
from django_redlock.contrib.celery import LockedTask
from django_redlock.locking import context
from tests.jobs.celery_app import _record, app, wait_go

__all__ = ["app"]


def _row(name: str) -> None:
    from testproject.inventory.models import Product

    Product.objects.create(name=name)


@app.task(
    base=LockedTask,
    bind=True,
    lock_name="probe-must:{tag}:{part}",
    lock_ttl=1.0,
    acks_late=True,
    reject_on_worker_lost=True,
)
def must_reenter_longer(self: Any, tag: str, part: int, inner_ttl: float = 0.0) -> str:
    """acks_late + reject_on_worker_lost, lock_on_busy="skip" (the default): records PID,
    token and the redelivered flag; with ``inner_ttl`` the body re-enters its own lock with a
    longer TTL (documented re-entry: the lease is extended to it); waits for ``<tag>:go`` and
    writes the end row."""
    redelivered = bool((self.request.delivery_info or {}).get("redelivered"))
    name = f"probe-must:{tag}:{part}"
    _record(f"{tag}:pid", [os.getpid(), context.current_token(), redelivered])
    if inner_ttl:
        with locks["default"].lock(name, ttl=inner_ttl):
            _wait_go(tag)
    else:
        _wait_go(tag)
    _row(f"{tag} end")
    return f"finished {tag}"


def _wait_go(tag: str) -> None:
    wait_go(tag)


@app.task(
    base=LockedTask,
    bind=True,
    lock_name="probe-minhold:{tag}",
    lock_ttl=1.0,
    lock_min_hold=6.0,
    acks_late=True,
    reject_on_worker_lost=True,
)
def must_min_hold(self: Any, tag: str) -> str:
    """As must_reenter_longer with lock_min_hold (longer than lock_ttl)."""
    redelivered = bool((self.request.delivery_info or {}).get("redelivered"))
    _record(f"{tag}:pid", [os.getpid(), context.current_token(), redelivered])
    _wait_go(tag)
    _row(f"{tag} end")
    return f"finished {tag}"


@app.task(
    base=LockedTask,
    bind=True,
    lock_name="probe-once:{tag}",
    lock_ttl=1.0,
    lock_on_busy="retry",
    lock_enqueue_once=True,
    max_retries=None,
    default_retry_delay=0.2,
)
def once_long(self: Any, tag: str, hold: float = 0.0) -> str:
    """lock_enqueue_once; records its start (id, pid) and sleeps ``hold`` seconds."""
    _record(f"{tag}:started", [self.request.id, os.getpid()])
    time.sleep(hold)
    _row(f"once {tag}")
    return "ran"


@app.task(base=LockedTask, lock_name="probe-skip:{0}", lock_on_busy="skip")
def skip_mid(tag: str, previous: Any = None) -> str:
    """A skipping LockedTask for the middle of a chain."""
    _row(f"skip {tag}")
    return "ran"


@app.task
def plain_first(value: Any) -> Any:
    return value


@app.task
def record_callback(value: Any, tag: str) -> Any:
    """A link= callback: records the value it got."""
    _record(f"{tag}:callback", value)
    return value
