# mypy: disable-error-code="untyped-decorator"
"""The Celery app of ``manage.py nightly --celery``: a worker and two ``celery beat``
schedulers, started by that command, send and run the nightly report.

The broker and result store is database 15 of the first lock node (``REDLOCK_NODES``), or
``DEMO_CELERY_BROKER``; ``DEMO_BEAT`` (JSON: task, args, seconds, scheduler) is the beat
schedule. Every message the worker takes leaves a ``sent-<scheduler>-<id>`` file beside the
reports (written before the lock is tried), so the command can count the ticks.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import django

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "testproject.settings")
django.setup()

from celery import Celery  # noqa: E402
from celery.signals import task_prerun  # noqa: E402
from django.conf import settings  # noqa: E402

from django_redlock.contrib.celery import LockedTask  # noqa: E402

BROKER = os.environ.get("DEMO_CELERY_BROKER") or settings.NODE_URLS[0].rsplit("/", 1)[0] + "/15"
app = Celery("redlock_demo", broker=BROKER)
app.conf.update(
    task_serializer="json",
    accept_content=["json"],
    task_default_queue="redlock-demo",
    worker_hijack_root_logger=False,
    broker_connection_retry_on_startup=True,
)
if os.environ.get("DEMO_BEAT"):
    beat = json.loads(os.environ["DEMO_BEAT"])
    app.conf.beat_schedule = {
        "nightly": {
            "task": beat["task"],
            "schedule": beat["seconds"],
            "args": beat["args"],
            "kwargs": {"scheduler": beat.get("scheduler", 0)},
        }
    }


@task_prerun.connect
def _count_send(task_id: str, args: tuple[str, ...], kwargs: dict[str, int], **_: object) -> None:
    """One file per message a scheduler sent (before LockedTask tries its lock)."""
    if args:
        (Path(args[0]) / f"sent-{kwargs.get('scheduler', 0)}-{task_id}").write_text("")


def _write_report(reports: str) -> None:
    time.sleep(0.2)  # the job's work
    (Path(reports) / f"report-{os.getpid()}-{time.time_ns()}.txt").write_text("report")


@app.task(name="demo.nightly_plain")
def nightly_plain(reports: str, scheduler: int = 0) -> None:
    """The nightly report without a lock: every scheduler's send runs it."""
    _write_report(reports)


@app.task(
    name="demo.nightly_locked",
    base=LockedTask,
    lock_name="nightly-report",
    lock_on_busy="skip",
    lock_min_hold=1.5,  # longer than the spread of the schedulers' sends, shorter than 2 s
)
def nightly_locked(reports: str, scheduler: int = 0) -> None:
    """The nightly report under the lock: once per tick, however many schedulers send it."""
    _write_report(reports)
