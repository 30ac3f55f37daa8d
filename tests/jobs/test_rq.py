"""@lock under RQ: real ``rq`` burst workers (each job runs in a forked work horse, so the
lock manager the worker process set up is used after a fork) on a redis-server of this test,
against the session's lock nodes and test database."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from django.conf import settings
from django.db import connection
from redis import Redis
from rq import Queue

from django_redlock.testing import RedisNodes
from testproject.inventory.models import Product
from tests.jobs.queue_jobs import rq_report, rq_report_unlocked

ROOT = Path(__file__).resolve().parent.parent.parent
pytestmark = pytest.mark.django_db(transaction=True)


@pytest.mark.parametrize(
    ("job", "label", "runs"), [(rq_report, "rq locked", 1), (rq_report_unlocked, "rq unlocked", 3)]
)
def test_three_copies_two_rq_workers(
    redis_nodes: RedisNodes, job: object, label: str, runs: int
) -> None:
    """Three copies of one day's job, two burst workers at once: one report with @lock
    (on_busy="skip", min_hold), three without; the skipped jobs finish with result None."""
    broker = Redis.from_url(redis_nodes[0].url)
    queue = Queue("jobs", connection=broker)
    jobs = [queue.enqueue(job, "2026-11-24", 0.5) for _ in range(3)]  # type: ignore[arg-type]
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "tests.support.subprocess_settings",
        "REDLOCK_JSON": json.dumps(settings.REDLOCK),
        "TEST_DATABASE_NAME": str(connection.settings_dict["NAME"]),
        "PYTHONPATH": str(ROOT),
        "RQ_URL": redis_nodes[0].url,
    }
    workers = [
        subprocess.Popen(
            [sys.executable, "-m", "tests.jobs.rq_worker", f"w{i}-{os.getpid()}"],
            env=env,
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for i in range(2)
    ]
    for worker in workers:
        out, _ = worker.communicate(timeout=90)
        assert worker.returncode == 0, out
    assert Product.objects.filter(name=f"{label} 2026-11-24").count() == runs
    statuses = [j.get_status(refresh=True) for j in jobs]
    assert statuses == ["finished"] * 3
    results = sorted(str(j.return_value()) for j in jobs)
    assert results.count("ran") == runs
    broker.close()
