"""``unique_task`` over django-tasks' ``@task()`` (the backport of Django 6's django.tasks),
with real ``db_worker`` processes against this session's test database and real redis-server
lock nodes: duplicates enqueued at once from threads and processes, ``until="started"`` and
``until="finished"`` while a worker runs the task, a worker SIGKILLed mid-task, a rolled back
enqueue, and bad input."""

from __future__ import annotations

import asyncio
import enum
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.db import connection, transaction
from django_tasks_db.models import DBTaskResult

from django_redlock import locks
from django_redlock.contrib import tasks
from django_redlock.contrib.tasks import unique_task
from django_redlock.jobs.unique import MUTEX_SUFFIX, START_SLACK
from django_redlock.testing import RedisNode
from testproject.inventory.models import Product
from tests.jobs.start_line import StartLine, waiters
from tests.jobs.test_django_tasks import run_workers
from tests.jobs.unique_jobs import (
    plain_report,
    report_first,
    report_in_outage,
    report_pair,
    report_until_finished,
    report_until_started,
    report_with_context,
)
from tests.jobs.unique_support import Processes, gather_ids, processes, python, wait_for

pytestmark = pytest.mark.django_db(transaction=True)

WORKER = [sys.executable, "-m", "django", "db_worker", "--no-startup-delay", "--interval", "0.05"]
ENQUEUE_AT = """
import sys, django
django.setup()
from tests.jobs.unique_jobs import {job} as job
from tests.jobs.start_line import wait_for_go
wait_for_go(sys.argv[1])
print("id=" + str(job.enqueue(*sys.argv[2:]).id))
"""


@pytest.fixture
def started(tmp_path: Path) -> Any:
    with processes(tmp_path) as running:
        yield running


def rows(label: str, day: str) -> list[str]:
    return list(
        Product.objects.filter(name__startswith=f"{label} {day} ").values_list("name", flat=True)
    )


def ids_from_threads_and_processes(
    job: Any, day: str, threads: int, procs: int, started: Processes
) -> list[str]:
    """``threads`` threads of this process and ``procs`` other processes enqueue ``job(day)``
    at the same instant (a wall-clock moment all of them sleep until, set once every process
    has set Django up)."""
    line = StartLine(started.log_dir / "go")
    script = python(ENQUEUE_AT.format(job=job.func.__name__))
    others = [started.start([*script, str(line.path), day]) for _ in range(procs)]
    at = line.go(others, started)
    ids: list[str] = []

    def enqueue() -> None:
        try:
            time.sleep(max(0.0, at - time.time()))
            ids.append(str(job.enqueue(day).id))
        finally:
            connection.close()

    pool = [threading.Thread(target=enqueue) for _ in range(threads)]
    ids.extend(gather_ids(pool, others, started))
    return ids


# until="finished" in the long profile: the enqueue side is the same for both; its own
# semantics are test_until_finished_refuses_while_it_runs's
@pytest.mark.parametrize(
    "job", [report_until_started, pytest.param(report_until_finished, marks=pytest.mark.slow)]
)
def test_five_enqueues_while_queued_send_one_task(job: Any, started: Processes) -> None:
    """Three threads and two processes enqueue one key at once: one task is sent, every
    enqueue returns its TaskResult id, and a worker runs it once."""
    ids = ids_from_threads_and_processes(job, "2026-11-24", threads=3, procs=2, started=started)
    assert len(ids) == 5
    assert len(set(ids)) == 1, ids
    assert DBTaskResult.objects.count() == 1
    run_workers(1)
    label = "until-started" if job is report_until_started else "until-finished"
    assert len(rows(label, "2026-11-24")) == 1
    assert job.get_result(ids[0]).status == "SUCCESSFUL"


def test_a_different_key_enqueues_independently() -> None:
    first = report_until_started.enqueue("2026-11-24")
    again = report_until_started.enqueue("2026-11-24")
    other = report_until_started.enqueue("2026-11-25")
    assert again.id == first.id
    assert other.id != first.id
    assert DBTaskResult.objects.count() == 2
    run_workers(1)
    assert len(rows("until-started", "2026-11-24")) == 1
    assert len(rows("until-started", "2026-11-25")) == 1


def test_until_started_allows_an_enqueue_while_it_runs(started: Processes) -> None:
    """until="started": once a worker started the task, the key is free: a second task is
    sent and runs after the first."""
    first = report_until_started.enqueue("2026-11-24", 2.0)
    assert report_until_started.enqueue("2026-11-24", 2.0).id == first.id  # queued: refused
    worker = started.start([*WORKER, "--worker-id", "w-started"])
    wait_for(lambda: rows("until-started", "2026-11-24"), what="the first run")
    second = report_until_started.enqueue("2026-11-24", 0.0)
    assert second.id != first.id
    wait_for(lambda: len(rows("until-started", "2026-11-24")) == 2, what="the second run")
    assert worker.poll() is None


def test_until_finished_refuses_while_it_runs(started: Processes) -> None:
    """until="finished": while a worker runs the task the enqueue returns it (RUNNING); once
    the run ended, the next enqueue sends a new task."""
    first = report_until_finished.enqueue("2026-11-24", 5.0)
    started.start([*WORKER, "--worker-id", "w-finished"])
    wait_for(lambda: rows("until-finished", "2026-11-24"), what="the run")
    during = report_until_finished.enqueue("2026-11-24", 0.0)
    assert during.id == first.id
    assert during.status == "RUNNING"
    time.sleep(2.5)  # past one marker TTL (2 s): the worker renews it while the task runs
    assert report_until_finished.enqueue("2026-11-24", 0.0).id == first.id
    wait_for(lambda: report_until_finished.get_result(first.id).is_finished, what="the end")
    after = report_until_finished.enqueue("2026-11-24", 0.0)
    assert after.id != first.id
    assert DBTaskResult.objects.count() == 2


def test_a_worker_killed_mid_task_frees_the_key_within_one_ttl(started: Processes) -> None:
    """until="finished": the worker running the task is SIGKILLed; its task stays RUNNING in
    the database forever, but the marker (a 2 s lease it renewed) expires: within one TTL an
    enqueue is accepted again."""
    first = report_until_finished.enqueue("2026-11-24", 60.0)
    worker = started.start([*WORKER, "--worker-id", "w-killed"])
    name = wait_for(lambda: rows("until-finished", "2026-11-24"), what="the run")[0]
    assert name.endswith(f"pid={worker.pid}")
    time.sleep(2.5)  # the worker renewed the marker past its first TTL
    assert report_until_finished.enqueue("2026-11-24").id == first.id
    worker.kill()  # SIGKILL, by PID
    worker.wait()
    killed = time.monotonic()
    accepted = wait_for(
        lambda: report_until_finished.enqueue("2026-11-24").id != first.id,
        timeout=10,
        what="an accepted enqueue",
    )
    assert accepted
    assert time.monotonic() - killed <= 2.0 + 1.0  # one TTL, and the polling on a busy host
    assert report_until_finished.get_result(first.id).status == "RUNNING"  # never finished
    assert DBTaskResult.objects.count() == 2


def test_a_queued_marker_of_a_task_that_never_wrote_its_running_marker_frees() -> None:
    """The queue says RUNNING (started long ago) but the marker still says queued: its worker
    died between claiming the task and writing the running marker. It frees the key once
    the start is older than one marker TTL."""
    first = report_until_finished.enqueue("2026-11-24")
    row = DBTaskResult.objects.get(id=first.id)
    from django.utils import timezone

    row.status = "RUNNING"
    row.started_at = timezone.now()
    row.save()
    assert report_until_finished.enqueue("2026-11-24").id == first.id  # just started
    row.started_at = timezone.now() - timezone.timedelta(seconds=2 + START_SLACK + 1)
    row.save()
    assert report_until_finished.enqueue("2026-11-24").id != first.id


def test_an_enqueue_rolled_back_does_not_hold_the_key() -> None:
    """Enqueued inside a transaction that rolls back: the task row never existed, its marker
    names a missing id, and the next enqueue sends a task."""

    class Rollback(Exception):
        pass

    with pytest.raises(Rollback), transaction.atomic():
        lost = report_until_started.enqueue("2026-11-24")
        assert report_until_started.enqueue("2026-11-24").id == lost.id  # same transaction
        raise Rollback
    assert DBTaskResult.objects.count() == 0
    sent = report_until_started.enqueue("2026-11-24")
    assert sent.id != lost.id
    assert DBTaskResult.objects.filter(id=sent.id).exists()


def test_a_finished_or_deleted_task_does_not_hold_the_key() -> None:
    first = report_until_started.enqueue("2026-11-24")
    DBTaskResult.objects.filter(id=first.id).delete()
    second = report_until_started.enqueue("2026-11-24")
    assert second.id != first.id
    run_workers(1)
    assert report_until_started.enqueue("2026-11-24").id != second.id


def test_bad_input_is_refused_before_anything_is_enqueued() -> None:
    with pytest.raises(ValueError, match="until must be 'started'"):
        unique_task("k:{day}", until="done")
    with pytest.raises(ValueError, match="has no parameter 'month'"):
        unique_task("k:{month}")(plain_report)
    with pytest.raises(ValueError, match="has no positional parameter"):
        unique_task("k:{1}")(plain_report)
    with pytest.raises(TypeError, match="goes over a task of Django's task framework"):
        unique_task("k:{day}")(plain_report.func)
    with pytest.raises(TypeError, match="unique task already"):
        unique_task("k:{day}")(report_until_started)
    with pytest.raises(ValueError, match="queued_ttl of a unique task"):
        unique_task("k:{day}", queued_ttl=0)
    with pytest.raises(TypeError, match="key template"):
        unique_task(None)  # type: ignore[arg-type]

    with pytest.raises(TypeError, match="not 3"):
        unique_task("k:{day}", using=3)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        report_until_started.enqueue()  # no day: the key cannot be filled
    with pytest.raises(TypeError):
        report_until_started.enqueue("2026-11-24", wrong=1)
    assert DBTaskResult.objects.count() == 0


def test_the_unique_task_is_still_the_task() -> None:
    """using() keeps the rule, call() runs the function, get_result() finds its results."""
    assert report_until_started.call("2026-11-20") == "ran"
    other = report_until_started.using(priority=5)
    first = other.enqueue("2026-11-21")
    assert other.enqueue("2026-11-21").id == first.id
    assert report_until_started.get_result(first.id).id == first.id


def test_the_key_is_filled_from_the_arguments_as_the_worker_gets_them(started: Processes) -> None:
    """A tuple argument comes back to the worker as a list (JSON): the key the enqueue fills
    is the worker's, so the running marker the worker writes is the one the enqueue reads,
    also once the run is older than one marker TTL."""
    first = report_pair.enqueue(("a", "b"), 6.0)
    started.start([*WORKER, "--worker-id", "w-pair"])
    wait_for(lambda: rows("pair", "a-b"), what="the run")
    time.sleep(2 + START_SLACK + 0.8)
    assert report_pair.enqueue(("a", "b")).id == first.id
    assert report_pair.enqueue(["a", "b"]).id == first.id


def test_an_enqueue_waits_for_the_transaction_of_the_one_before(started: Processes) -> None:
    """An enqueue inside a transaction holds the key's enqueue mutex until the commit: another
    process enqueuing the key meanwhile waits, then sees the committed task and returns it
    (were the mutex released at once, it would not see the uncommitted row and send a
    second task)."""
    script = python(ENQUEUE_AT.format(job="report_until_started"))
    line = StartLine(started.log_dir / "go")
    with transaction.atomic():
        first = report_until_started.enqueue("2026-11-24")
        other = started.start([*script, str(line.path), "2026-11-24"])
        line.go([other], started, delay=0.0)
        mutex = "uniq-started:2026-11-24" + MUTEX_SUFFIX
        wait_for(lambda: waiters(mutex) > 0, what="the other process waiting for the mutex")
        assert other.poll() is None, started.log_of(other)
    assert other.wait(60) == 0, started.log_of(other)
    assert f"id={first.id}" in started.log_of(other)
    assert DBTaskResult.objects.count() == 1


def test_a_task_that_takes_its_context_and_aenqueue() -> None:
    """The template of a task that takes its context names the enqueue's arguments; aenqueue
    is unique as enqueue is; the worker runs the task once with its context."""
    first = report_with_context.enqueue("2026-11-24")
    again = asyncio.run(report_with_context.aenqueue(day="2026-11-24"))
    assert again.id == first.id
    assert DBTaskResult.objects.count() == 1
    run_workers(1)
    assert rows("context-1", "2026-11-24")
    assert report_with_context.enqueue("2026-11-24").id != first.id


@pytest.fixture
def outage_node(redis_node_factory: Any) -> Iterator[RedisNode]:
    """The alias ``unique-outage`` on a node of its own."""
    node = redis_node_factory(1)[0]
    alias = {"NODES": [node.url], "KEY_PREFIX": "outage:", "NODE_TIMEOUT": 0.2}
    settings.REDLOCK = {**settings.REDLOCK, "unique-outage": alias}
    try:
        yield node
    finally:
        settings.REDLOCK = {k: v for k, v in settings.REDLOCK.items() if k != "unique-outage"}
        locks.reset()


def test_a_task_runs_when_its_marker_cannot_be_changed(outage_node: RedisNode) -> None:
    """The lock nodes are down when the worker starts and ends the task: the task runs and
    succeeds all the same (the marker is not the task's business; it expires on its own)."""
    first = report_in_outage.enqueue("2026-11-24")
    outage_node.stop()
    run_workers(1)
    assert rows("outage", "2026-11-24")
    assert report_in_outage.get_result(first.id).status == "SUCCESSFUL"


class Kind(str, enum.Enum):  # noqa: UP042 (the mixin users write, as the attack did)
    DAILY = "daily"


@pytest.mark.parametrize(
    "days", [b"day1", {True: 1, None: 2}, Kind.DAILY, ("a", Kind.DAILY)], ids=repr
)
def test_the_marker_is_at_the_key_the_worker_fills(days: Any) -> None:
    """Found by an outside attack: bytes, Enum members and bool/None dict keys come back to
    the worker changed (decoded, as their value, as "true"/"null"); the enqueue wrote its
    marker at another key, and with until="finished" sent a duplicate while the first ran."""
    sent = report_pair.enqueue(days)
    stored = report_pair.get_result(sent.id)
    worker_key = tasks.worker_key(stored)  # what the worker's signal handlers fill
    marker = report_pair.unique.rule.notes(worker_key).read(worker_key)
    assert marker is not None and marker.id == str(sent.id), worker_key
    assert report_pair.enqueue(days).id == sent.id


def test_a_serving_worker_survives_a_key_it_cannot_fill(started: Processes) -> None:
    """Found by an outside attack: a task whose key the worker could not fill (here sent
    around unique_task, straight to the backend, with an argument '{days[0]}' cannot index)
    failed at task_started without running, and at task_finished the error ended the
    serving db_worker. The worker side never raises: the task runs, the worker serves on."""
    job = report_first
    odd = job.get_backend().enqueue(job, [5], {})  # an int: "{days[0]}" cannot be filled
    worker = started.start([*WORKER, "--worker-id", "w-serve"])
    wait_for(lambda: job.get_result(odd.id).is_finished, what="the odd task")
    assert job.get_result(odd.id).status == "SUCCESSFUL"
    after = report_until_started.enqueue("2026-11-24")
    wait_for(lambda: report_until_started.get_result(after.id).is_finished, what="the next")
    assert worker.poll() is None, started.log_of(worker)


def test_a_sent_task_is_returned_when_its_marker_cannot_be_written(
    outage_node: RedisNode,
) -> None:
    """Found by an outside attack: the lock node stopped right after the backend inserted the
    task row; the enqueue raised NodesUnavailable although the task was sent, so the caller's
    retry sent a second one. The sent task's TaskResult is returned (the lost marker logged)."""
    from django_tasks.signals import task_enqueued

    def stop_the_node(**_: Any) -> None:
        outage_node.stop()

    task_enqueued.connect(stop_the_node, dispatch_uid="test-stop-the-node")
    try:
        sent = report_in_outage.enqueue("2026-11-24")
    finally:
        task_enqueued.disconnect(dispatch_uid="test-stop-the-node")
    assert DBTaskResult.objects.filter(id=sent.id).count() == DBTaskResult.objects.count() == 1


IMMEDIATE = {
    "default": {"BACKEND": "django_tasks_db.DatabaseBackend"},
    "immediate": {"BACKEND": "django_tasks.backends.immediate.ImmediateBackend"},
    "dummy": {"BACKEND": "django_tasks.backends.dummy.DummyBackend"},
    "no-results": {"BACKEND": "tests.jobs.unique_jobs.NoResultsBackend"},
}


@pytest.mark.parametrize("job", [report_until_started, report_until_finished])
def test_the_immediate_backend_runs_every_enqueue(job: Any) -> None:
    """Found by an outside attack: ImmediateBackend runs the task inside the enqueue, then the
    enqueue wrote a queued marker; every later enqueue raised NotImplementedError (the
    backend cannot get results) for queued_ttl. Nothing is queued, so nothing is marked:
    each enqueue runs the task."""
    from django.test import override_settings

    with override_settings(TASKS=IMMEDIATE):
        immediate = job.using(backend="immediate")
        first = immediate.enqueue("2026-11-24")
        second = immediate.enqueue("2026-11-24")
        assert first.status == second.status == "SUCCESSFUL"
        assert first.id != second.id
        label = "until-started" if job is report_until_started else "until-finished"
        assert len(rows(label, "2026-11-24")) == 2
        queued = job.enqueue("2026-11-24")  # the database backend's task holds the key
        assert immediate.enqueue("2026-11-24").status == "SUCCESSFUL"
        assert job.enqueue("2026-11-24").id == queued.id
        assert job.using(backend="dummy").enqueue("2026-11-25").status == "READY"
        with pytest.raises(ImproperlyConfigured, match="can find a task by its id"):
            job.using(backend="no-results").enqueue("2026-11-26")


def test_a_template_of_a_reserved_name_is_refused_when_applied() -> None:
    """Found by an outside attack: a template starting with "__" was accepted by unique_task,
    then refused at every enqueue."""
    with pytest.raises(ValueError, match="reserved"):
        unique_task("__k:{day}")
