"""@lock under django-tasks' ``@task`` (the backport of Django 6's django.tasks), run by real
``db_worker`` processes against this session's test database and real redis-server nodes:
three servers enqueue the same nightly job and two workers take them at once."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from django.conf import settings
from django.db import connection

from testproject.inventory.models import Product
from tests.jobs.django_tasks_jobs import nightly_report, nightly_report_unlocked

ROOT = Path(__file__).resolve().parent.parent.parent
pytestmark = pytest.mark.django_db(transaction=True)


def run_workers(count: int) -> None:
    """``count`` db_worker processes at once, each working off the queue and exiting."""
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "tests.support.subprocess_settings",
        "REDLOCK_JSON": json.dumps(settings.REDLOCK),
        "TEST_DATABASE_NAME": str(connection.settings_dict["NAME"]),
        "PYTHONPATH": str(ROOT),
    }
    argv = [sys.executable, "-m", "django", "db_worker", "--batch", "--no-startup-delay"]
    argv += ["--interval", "0.05"]
    workers = [
        subprocess.Popen(
            [*argv, "--worker-id", f"w{i}"],
            env=env,
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for i in range(count)
    ]
    for worker in workers:
        out, _ = worker.communicate(timeout=90)
        assert worker.returncode == 0, out


@pytest.mark.parametrize(
    ("job", "label", "runs"),
    [(nightly_report, "locked", 1), (nightly_report_unlocked, "unlocked", 3)],
)
def test_three_servers_enqueue_the_nightly_job(job: object, label: str, runs: int) -> None:
    """Three enqueues of one day's job, two workers: with @lock(on_busy="skip") the report is
    written once and the other runs end as skipped (result None); without it, three times."""
    results = [job.enqueue("2026-11-24", hold=0.5) for _ in range(3)]  # type: ignore[attr-defined]
    run_workers(2)
    assert Product.objects.filter(name=f"{label} 2026-11-24").count() == runs
    values = sorted(str(r.return_value) for r in (r.refresh() or r for r in results))
    assert values.count("ran") == runs
    if label == "locked":
        assert values == ["None", "None", "ran"]
        row = Product.objects.get(name="locked 2026-11-24")
        assert row.fence_token is not None  # written under the job's lease
