"""``enqueue_unique`` for RQ with real ``rq`` workers (each job in a forked work horse) on a
redis-server of this test, against the session's lock nodes and test database: duplicates
enqueued at once from threads and processes, ``until="started"`` and ``until="finished"``
while a worker runs the job, a worker SIGKILLed mid-job, and bad input."""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.core.exceptions import ImproperlyConfigured
from redis import Redis
from rq import Queue, Retry
from rq.job import Job
from rq.serializers import JSONSerializer

from django_redlock.contrib.rq import enqueue_unique
from django_redlock.testing import RedisNode
from testproject.inventory.models import Product
from tests.jobs.start_line import StartLine
from tests.jobs.unique_jobs import rq_fail, rq_report
from tests.jobs.unique_support import Processes, gather_ids, processes, python, wait_for

pytestmark = pytest.mark.django_db(transaction=True)

ENQUEUE_AT = """
import os, sys, django
django.setup()
from redis import Redis
from rq import Queue, Retry
from rq.serializers import JSONSerializer
from django_redlock.contrib.rq import enqueue_unique
from tests.jobs.start_line import wait_for_go
queue = Queue("jobs", connection=Redis.from_url(os.environ["RQ_URL"]))
wait_for_go(sys.argv[1])
job = enqueue_unique(
    queue, "tests.jobs.unique_jobs.rq_report", "rq", sys.argv[2], key="rq-uniq:" + sys.argv[2]
)
print("id=" + job.id)
"""


@pytest.fixture
def broker(redis_node: RedisNode) -> Iterator[tuple[Queue, str]]:
    connection = Redis.from_url(redis_node.url)
    try:
        yield Queue("jobs", connection=connection), redis_node.url
    finally:
        connection.close()


@pytest.fixture
def started(tmp_path: Path) -> Iterator[Processes]:
    with processes(tmp_path) as running:
        yield running


def worker_argv(name: str, *mode: str) -> list[str]:
    return [sys.executable, "-m", "tests.jobs.rq_worker", f"{name}-{os.getpid()}", *mode]


def rows(label: str, day: str) -> list[str]:
    return list(
        Product.objects.filter(name__startswith=f"{label} {day} ").values_list("name", flat=True)
    )


def run_burst(started: Processes, url: str) -> None:
    worker = started.start(worker_argv("burst"), RQ_URL=url)
    assert worker.wait(90) == 0, started.log_of(worker)


def test_five_enqueues_while_queued_send_one_job(
    broker: tuple[Queue, str], started: Processes
) -> None:
    """Three threads and two processes enqueue one key at once: one job is sent, every call
    returns that Job's id, and a worker runs it once."""
    queue, url = broker
    line = StartLine(started.log_dir / "go")
    others = [
        started.start([*python(ENQUEUE_AT), str(line.path), "2026-11-24"], RQ_URL=url)
        for _ in range(2)
    ]
    at = line.go(others, started)  # once both processes have set Django up
    ids: list[str] = []

    def enqueue() -> None:
        time.sleep(max(0.0, at - time.time()))
        job = enqueue_unique(queue, rq_report, "rq", "2026-11-24", key="rq-uniq:2026-11-24")
        ids.append(job.id)

    pool = [threading.Thread(target=enqueue) for _ in range(3)]
    ids.extend(gather_ids(pool, others, started))
    assert len(ids) == 5
    assert len(set(ids)) == 1, ids
    assert queue.count == 1
    run_burst(started, url)
    assert len(rows("rq", "2026-11-24")) == 1
    assert Job.fetch(ids[0], connection=queue.connection).return_value() == "ran"


def test_a_different_key_enqueues_independently(broker: tuple[Queue, str]) -> None:
    queue, _ = broker
    first = enqueue_unique(queue, rq_report, "rq", "2026-11-24", key="rq-uniq:2026-11-24")
    again = enqueue_unique(queue, rq_report, "rq", "2026-11-24", key="rq-uniq:2026-11-24")
    other = enqueue_unique(queue, rq_report, "rq", "2026-11-25", key="rq-uniq:2026-11-25")
    assert again.id == first.id
    assert other.id != first.id
    assert queue.count == 2


@pytest.mark.parametrize("until", ["started", "finished"])
def test_an_enqueue_while_the_job_runs(
    broker: tuple[Queue, str], started: Processes, until: str
) -> None:
    """until="started": a second job is sent while the first runs; until="finished": the
    running job is returned until it ended, then the next enqueue sends one."""
    queue, url = broker
    key = f"rq-{until}:2026-11-24"

    def enqueue(hold: float) -> Job:
        return enqueue_unique(
            queue, rq_report, until, "2026-11-24", hold, key=key, until=until, lease_ttl=2
        )

    first = enqueue(5.0)
    started.start(worker_argv(f"serve-{until}", "serve"), RQ_URL=url)
    wait_for(lambda: rows(until, "2026-11-24"), what="the run")
    during = enqueue(0.0)
    if until == "started":
        assert during.id != first.id
        wait_for(lambda: len(rows(until, "2026-11-24")) == 2, what="the second run")
        return
    assert during.id == first.id
    assert during.get_status() == "started"
    time.sleep(2.5)  # past one marker TTL: the work horse renews it while the job runs
    assert enqueue(0.0).id == first.id
    wait_for(lambda: first.get_status(refresh=True) == "finished", what="the end")
    assert enqueue(0.0).id != first.id


def test_a_worker_killed_mid_job_frees_the_key_within_one_ttl(
    broker: tuple[Queue, str], started: Processes
) -> None:
    """until="finished": the worker and its work horse are SIGKILLed mid-job; RQ still says
    the job started, but the marker (a 2 s lease the horse renewed) expires: within one TTL
    an enqueue is accepted again."""
    queue, url = broker

    def enqueue() -> Job:
        return enqueue_unique(
            queue,
            rq_report,
            "killed",
            "2026-11-24",
            60.0,
            key="rq-killed",
            until="finished",
            lease_ttl=2,
        )

    first = enqueue()
    worker = started.start(worker_argv("killed", "serve"), RQ_URL=url)
    name = wait_for(lambda: rows("killed", "2026-11-24"), what="the run")[0]
    horse = int(name.rsplit("pid=", 1)[1])
    time.sleep(2.5)
    assert enqueue().id == first.id
    worker.kill()  # SIGKILL by PID: the worker, then its work horse
    worker.wait()
    os.kill(horse, signal.SIGKILL)
    killed = time.monotonic()
    wait_for(lambda: enqueue().id != first.id, timeout=10, what="an accepted enqueue")
    assert time.monotonic() - killed <= 2.0 + 1.0  # one TTL, and the polling on a busy host
    assert first.get_status(refresh=True) == "started"  # RQ never learnt it ended


def test_a_deleted_job_does_not_hold_the_key(broker: tuple[Queue, str]) -> None:
    queue, _ = broker
    first = enqueue_unique(queue, rq_report, "rq", "2026-11-24", key="rq-deleted")
    first.delete()
    assert enqueue_unique(queue, rq_report, "rq", "2026-11-24", key="rq-deleted").id != first.id


def test_bad_input_is_refused_before_anything_is_enqueued(broker: tuple[Queue, str]) -> None:
    queue, _ = broker
    bad: list[tuple[type[Exception], str, dict[str, Any], Any]] = [
        (ValueError, "until must be", {"key": "k", "until": "done"}, queue),
        (TypeError, "key must be a str", {"key": 7}, queue),
        (TypeError, "needs an rq.Queue", {"key": "k"}, "jobs"),
        (ValueError, "queued_ttl of a unique task", {"key": "k", "queued_ttl": -1}, queue),
    ]
    for error, message, options, where in bad:
        with pytest.raises(error, match=message):
            enqueue_unique(where, rq_report, "rq", "2026-11-24", **options)
    with pytest.raises(TypeError, match="needs a function"):
        enqueue_unique(queue, 42, key="k")  # type: ignore[arg-type]
    assert queue.count == 0


def test_an_unknown_alias_fails_before_anything_is_sent(broker: tuple[Queue, str]) -> None:
    queue, _ = broker
    with pytest.raises(ImproperlyConfigured, match="REDLOCK has no alias 'no-such-alias'"):
        enqueue_unique(queue, rq_report, "rq", "2026-11-24", key="k", using="no-such-alias")
    assert queue.count == 0


@pytest.mark.parametrize("until", ["started", "finished"])
def test_a_job_scheduled_for_a_retry_holds_the_key(
    until: str, broker: tuple[Queue, str], started: Processes
) -> None:
    """Found by an outside attack: with retry=Retry(...), run_unique freed the key after the
    failed attempt, so an enqueue while the retry was scheduled sent a second job. A job RQ
    will retry is marked queued again; once its retries are spent the key is free."""
    queue, url = broker
    key = f"rq-retry-{until}"

    def enqueue() -> Job:
        return enqueue_unique(
            queue, rq_fail, "retry", until, key=key, until=until, retry=Retry(max=1, interval=600)
        )

    first = enqueue()
    run_burst(started, url)
    assert rows("retry", until)
    assert first.get_status(refresh=True) == "scheduled"
    assert enqueue().id == first.id
    first.retries_left = 0  # its retry spent: the next failure frees the key
    first.save()
    queue.enqueue_job(first)  # run it now rather than in 600 s
    run_burst(started, url)
    assert first.get_status(refresh=True) == "failed"
    assert enqueue().id != first.id


def test_options_that_cannot_work_are_refused_before_sending(broker: tuple[Queue, str]) -> None:
    """Found by an outside attack: a JSON-serializing queue failed inside RQ's encoder at every
    call; pipeline= sent one job per call; func "", "nodots" or "  " were accepted; RQ's
    explicit args=/kwargs= failed with a bare AssertionError; a key of 505-512 characters was
    refused with a message counting the enqueue mutex's suffix. Each is a clear error now,
    with nothing sent."""
    queue, _ = broker
    json_queue = Queue("jobs", connection=queue.connection, serializer=JSONSerializer)
    with pytest.raises(TypeError, match="serializer"):
        enqueue_unique(json_queue, rq_report, "rq", "d", key="k-json")
    with queue.connection.pipeline() as pipe, pytest.raises(TypeError, match="pipeline="):
        enqueue_unique(queue, rq_report, "rq", "d", key="k-pipe", pipeline=pipe)
    for func in ["", "nodots", "  ", "a..b", "a. b"]:
        with pytest.raises(TypeError, match="dotted path"):
            enqueue_unique(queue, func, key="k-func")
    for explicit in ({"args": ("rq", "d")}, {"kwargs": {"label": "rq", "day": "d"}}):
        with pytest.raises(TypeError, match="explicit"):
            enqueue_unique(queue, rq_report, key="k-explicit", **explicit)
    with pytest.raises(ValueError, match="key is 505 characters long; the limit is 504"):
        enqueue_unique(queue, rq_report, "rq", "d", key="k" * 505)
    assert queue.count == json_queue.count == 0
    assert enqueue_unique(queue, rq_report, "rq", "d", key="k" * 504).id
