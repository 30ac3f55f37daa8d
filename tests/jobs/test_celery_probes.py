"""Probes of LockedTask with a real prefork Celery worker (docs/jobs.md): redeliveries of runs
whose process died, lock_enqueue_once with revoke/terminate and odd ``expires``, link=, chains
with a LockedTask in the middle, and eager nesting."""

from __future__ import annotations

import os
import signal
import time
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from celery import Celery, chain

from django_redlock import locks
from django_redlock.contrib.celery import LockedTask
from django_redlock.exceptions import LockNotAcquired
from testproject.inventory.models import Product
from tests.jobs import celery_app
from tests.jobs.celery_probe_app import (
    app,
    must_min_hold,
    must_reenter_longer,
    once_long,
    plain_first,
    record_callback,
    skip_mid,
)
from tests.jobs.test_celery import WAIT, Worker, wait_dead, wait_record
from tests.seams.helpers import keys_left

in_database = pytest.mark.django_db(transaction=True)


@pytest.fixture
def tag(request: pytest.FixtureRequest) -> str:
    return f"{request.node.name[:24]}-{uuid.uuid4().hex[:8]}"


def go(tag: str) -> None:
    with celery_app.record_store() as store:
        store.set(f"{tag}:go", "1")


@in_database
def test_redelivery_after_body_reentered_with_longer_ttl_is_not_lost(
    worker: Worker, tag: str
) -> None:
    """acks_late + reject_on_worker_lost, lock_on_busy="skip", lock_ttl=1: the body re-enters
    its own name with ttl=8 (documented re-entry: the lease is extended to 8 s), then its pool
    process is SIGKILLed. The redelivered run must not be acknowledged as a skip: the job
    must write its end row exactly once (it was never run to the end)."""
    result = must_reenter_longer.delay(tag, 1, inner_ttl=8.0)
    [(pid, _token, redelivered)] = wait_record(f"{tag}:pid")
    assert redelivered is False
    time.sleep(0.3)  # the inner block has entered and extended the lease
    os.kill(pid, signal.SIGKILL)
    wait_dead(pid)
    go(tag)
    outcome = result.get(timeout=WAIT)
    assert outcome == f"finished {tag}", (
        f"redelivered run returned {outcome!r}; end rows: "
        f"{Product.objects.filter(name=f'{tag} end').count()}"
    )
    assert Product.objects.filter(name=f"{tag} end").count() == 1


@in_database
def test_redelivery_of_an_args_template_job_runs_once(worker: Worker, tag: str) -> None:
    """A lock_name filled from two arguments (one passed by keyword): the redelivered message
    fills the same name, waits out the dead run's lease (no longer renewed) and runs once."""
    result = must_reenter_longer.apply_async((tag,), {"part": 7})
    [(pid, first_token, _)] = wait_record(f"{tag}:pid")
    os.kill(pid, signal.SIGKILL)
    wait_dead(pid)
    go(tag)
    assert result.get(timeout=WAIT) == f"finished {tag}"
    runs = wait_record(f"{tag}:pid", 2)
    assert runs[1][2] is True and runs[1][1] > first_token
    assert Product.objects.filter(name=f"{tag} end").count() == 1
    assert not keys_left(f"probe-must:{tag}:7")


@in_database
def test_redelivery_with_min_hold_longer_than_ttl_runs(worker: Worker, tag: str) -> None:
    """lock_min_hold=6 > lock_ttl=1: a run SIGKILLed mid-body never finished, so its lease
    is an ordinary one (at most one TTL): the redelivery waits for it and runs to the end;
    then the finished run keeps the name for min_hold (a copy is skipped)."""
    result = must_min_hold.delay(tag)
    [(pid, _, _)] = wait_record(f"{tag}:pid")
    os.kill(pid, signal.SIGKILL)
    wait_dead(pid)
    go(tag)
    assert result.get(timeout=WAIT) == f"finished {tag}"
    assert Product.objects.filter(name=f"{tag} end").count() == 1
    with pytest.raises(LockNotAcquired):
        locks["default"].acquire(f"probe-minhold:{tag}", timeout=0)


@in_database
def test_enqueue_once_terminated_running_task_lets_the_next_send_run(
    worker: Worker, tag: str
) -> None:
    """lock_enqueue_once + lock_on_busy="retry": a running task revoked with terminate=True
    (its pool process gets SIGTERM) had released its marker when it started, so the next send
    goes, and it runs once the dead run's lease (lock_ttl=1) lapses; nothing stays locked."""
    first = once_long.apply_async((tag, 30.0))
    [(first_id, pid)] = wait_record(f"{tag}:started")
    assert first_id == first.id
    app.control.revoke(first.id, terminate=True)
    wait_dead(pid)
    again = None
    deadline = time.monotonic() + 10
    while again is None:
        again = once_long.apply_async((tag, 0.0))
        assert time.monotonic() < deadline, "every send after the terminate was suppressed"
        time.sleep(0.05)
    assert again.get(timeout=WAIT) == "ran"
    starts = wait_record(f"{tag}:started", 2)
    assert [s[0] for s in starts] == [first.id, again.id]
    assert Product.objects.filter(name=f"once {tag}").count() == 1
    time.sleep(0.3)
    assert not keys_left(f"probe-once:{tag}")


@pytest.mark.parametrize(
    "expires",
    [
        pytest.param(-5.0, id="negative-seconds"),
        pytest.param(0.001, id="one-millisecond"),
        pytest.param("past-datetime", id="past-datetime"),
    ],
)
@in_database
def test_enqueue_once_with_expires_in_the_past(worker: Worker, tag: str, expires: Any) -> None:
    """lock_enqueue_once and an ``expires`` already past (a negative number, a past datetime)
    or shorter than the drift allowance: sending is not an internal ValueError about a lease
    TTL; the message is either sent (and discarded as expired) or not, and no marker blocks
    the next send."""
    when = datetime.now(UTC) - timedelta(seconds=5) if expires == "past-datetime" else expires
    try:
        sent = once_long.apply_async((tag, 0.0), expires=when)
    except ValueError as exc:
        pytest.fail(f"apply_async(expires={expires!r}) raised ValueError: {exc}")
    if sent is not None:
        deadline = time.monotonic() + 10
        while sent.state not in ("REVOKED", "SUCCESS"):
            assert time.monotonic() < deadline, sent.state
            time.sleep(0.05)
    again = None
    deadline = time.monotonic() + 10
    while again is None:
        again = once_long.apply_async((tag, 0.0))
        assert time.monotonic() < deadline, "the expired message's marker blocks new sends"
        time.sleep(0.05)
    assert again.get(timeout=WAIT) == "ran"


@in_database
def test_enqueue_once_with_link_callbacks(worker: Worker, tag: str) -> None:
    """link= and link_error= are not a group, chord or chain: a lock_enqueue_once send with
    callbacks is not refused, runs, and its callback gets the value; a second send while the
    first is queued is suppressed (None) and its callback never runs."""
    first = once_long.apply_async(
        (tag, 0.0),
        countdown=0.5,
        link=record_callback.s(tag),
        link_error=record_callback.si("error", tag),
    )
    assert first is not None
    second = once_long.apply_async((tag, 0.0), link=record_callback.s(tag))
    assert second is None
    assert first.get(timeout=WAIT) == "ran"
    assert wait_record(f"{tag}:callback") == ["ran"]
    time.sleep(0.5)
    assert wait_record(f"{tag}:callback") == ["ran"]


@in_database
def test_chain_with_a_skipping_locked_task_in_the_middle(worker: Worker, tag: str) -> None:
    """chain(plain, LockedTask(skip), plain): with the name held the middle run is skipped and
    the chain goes on with None; with the name free it runs."""
    lease = locks["default"].acquire(f"probe-skip:{tag}", ttl=20)
    try:
        busy = chain(plain_first.s(tag), skip_mid.s(), plain_first.s()).apply_async()
        assert busy.get(timeout=WAIT) is None
    finally:
        lease.release()
    free = chain(plain_first.s(tag), skip_mid.s(), plain_first.s()).apply_async()
    assert free.get(timeout=WAIT) == "ran"
    assert Product.objects.filter(name=f"skip {tag}").count() == 1


# -- eager mode, no worker ---------------------------------------------------------------------
@pytest.mark.parametrize("on_busy", ["skip", "raise", "retry"])
def test_eager_nested_locked_task_of_the_same_name(on_busy: str, unique_name: str) -> None:
    """task_always_eager: a LockedTask whose body calls (delay(), eager) another LockedTask of
    the same lock name. docs/production.md: "a block of n in a Celery task (LockedTask) |
    lock(n) inside the body | re-entry of the task's lease". Records what the inner call does;
    either way the outer run finishes and nothing stays locked."""
    eager = Celery(f"eager-nested-{on_busy}", set_as_current=False)
    eager.conf.task_always_eager = True
    eager.finalize()
    seen: list[Any] = []

    def inner(key: str) -> str:
        return "inner ran"

    inner_task = eager.task(
        base=LockedTask, shared=False, name="inner", lock_name="n:{key}", lock_on_busy=on_busy
    )(inner)

    def outer(key: str) -> str:
        try:
            seen.append(inner_task.delay(key).get(disable_sync_subtasks=False))
        except Exception as exc:
            seen.append(type(exc).__name__)
        return "outer ran"

    outer_task = eager.task(base=LockedTask, shared=False, name="outer", lock_name="n:{key}")(outer)
    assert outer_task.delay(unique_name).get() == "outer ran"
    locks["default"].acquire(f"n:{unique_name}", ttl=1, timeout=0).release()
    expected = {"skip": None, "raise": "LockNotAcquired", "retry": "LockNotAcquired"}
    print(on_busy, seen)
    assert seen in ([expected[on_busy]], ["inner ran"])
