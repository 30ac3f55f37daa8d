"""``LockedTask(lock_limits=...)``: a run takes a permit of each semaphore (templates filled
from the task's arguments), all or nothing; a full one makes the run busy (``lock_on_busy``).
Run eagerly (``apply()``) and called directly, on the session's real nodes."""

from __future__ import annotations

import random
import re
import string
from typing import Any

import pytest
from celery import Celery
from django.test import override_settings

from django_redlock import locks
from django_redlock.contrib.celery import LockedTask
from django_redlock.exceptions import LockNotAcquired
from django_redlock.locking import ordering
from django_redlock.locking.ordering import shared


def _app() -> Celery:
    app = Celery("limits", set_as_current=False)
    app.finalize()
    return app


def _task(**options: Any) -> Any:
    seen: list[str] = []

    def call_api(tenant: str) -> str:
        # inside the run: the tenant's only permit is this run's
        with pytest.raises(LockNotAcquired):
            locks["default"].acquire(f"api:tenant:{tenant}", timeout=0, permits=1)
        seen.append(tenant)
        return tenant

    task = _app().task(
        base=LockedTask,
        shared=False,
        lock_limits={"api:{tenant}:global": 3, "api:tenant:{tenant}": 1},
        **options,
    )(call_api)
    return task, seen


def test_a_run_holds_a_permit_of_each_and_no_lock(unique_name: str) -> None:
    """Without lock_name the task takes only the permits: two runs of other tenants could go
    side by side; the permits are given back after the run."""
    task, seen = _task()
    assert task.apply((unique_name,)).get() == unique_name
    assert task(unique_name) == unique_name  # called directly, too
    assert seen == [unique_name, unique_name]
    locks["default"].acquire(f"api:tenant:{unique_name}", timeout=0, permits=1).release()


@pytest.mark.parametrize(("on_busy", "raises"), [("skip", False), ("raise", True)])
def test_a_full_semaphore_is_a_busy_run(unique_name: str, on_busy: str, raises: bool) -> None:
    """The tenant's semaphore is full: the run is busy as for a busy lock (skip: None, raise:
    LockNotAcquired naming the semaphore), the body never runs, the global permit is not
    kept."""
    task, seen = _task(lock_on_busy=on_busy)
    full = locks["default"].acquire(f"api:tenant:{unique_name}", ttl=5, timeout=0, permits=1)
    try:
        if raises:
            with pytest.raises(LockNotAcquired, match=re.escape(f"api:tenant:{unique_name}")):
                task.apply((unique_name,)).get()
        else:
            assert task.apply((unique_name,)).get() is None
        held = [
            locks["default"].acquire(f"api:{unique_name}:global", timeout=0, permits=3)
            for _ in range(3)
        ]  # every global permit is free: the busy run kept none
        for lease in held:
            lease.release()
    finally:
        full.release()
    assert seen == []


def test_with_a_lock_name_the_run_takes_the_lock_and_the_permits(unique_name: str) -> None:
    task, _seen = _task(lock_name="report:{tenant}", lock_on_busy="raise")
    lock = locks["default"].acquire(f"report:{unique_name}", ttl=5, timeout=0)
    with pytest.raises(LockNotAcquired, match=re.escape(f"report:{unique_name}")):
        task.apply((unique_name,)).get()
    lock.release()
    assert task.apply((unique_name,)).get() == unique_name


@pytest.mark.parametrize(
    ("limits", "error", "message"),
    [
        ({}, TypeError, "lock_limits must be a non-empty dict"),
        (["a"], TypeError, "lock_limits must be a non-empty dict"),
        ({"a": 0}, ValueError, r"lock_limits\['a'\]: permits must be from 1"),
        ({"a": "2"}, TypeError, "permits must be an int"),
        ({"a:{nope}": 2}, ValueError, "has no parameter 'nope'"),
    ],
)
def test_bad_lock_limits_fail_when_the_task_is_made(
    limits: Any, error: type[Exception], message: str
) -> None:
    def job(tenant: str) -> None: ...

    with pytest.raises(error, match=message):
        _app().task(base=LockedTask, shared=False, lock_limits=limits)(job)


@pytest.mark.parametrize("lock_name", [None, "report:{tenant}"])
def test_a_redelivered_run_waits_for_the_dead_runs_permit(
    unique_name: str, lock_name: str | None
) -> None:
    """The run that died held the tenant's only permit, which nobody renews: its redelivered
    message waits for that permit to expire and runs (as for a dead run's lock), instead of
    being skipped as busy (a lost job). A first delivery is still skipped at once."""
    ran: list[str] = []

    def job(tenant: str) -> str:
        ran.append(tenant)
        return tenant

    options = {} if lock_name is None else {"lock_name": lock_name}
    task = _app().task(
        base=LockedTask, shared=False, lock_ttl=1.0, lock_limits={"t:{tenant}": 1}, **options
    )(job)
    manager = locks["default"]
    manager.acquire(f"t:{unique_name}", ttl=1.0, timeout=0, permits=1)  # the dead run's
    task.push_request(id="redelivered-1", delivery_info={"redelivered": True})
    try:
        assert task(unique_name) == unique_name
    finally:
        task.pop_request()
    assert ran == [unique_name]
    lease = manager.acquire(f"t:{unique_name}", ttl=5.0, timeout=0, permits=1)
    task.push_request(id="first-delivery", delivery_info={"redelivered": False})
    try:
        assert task(unique_name) is None  # not redelivered: skipped at once
    finally:
        task.pop_request()
        lease.release()
    assert ran == [unique_name]


def test_the_order_checker_shapes_the_permits_by_their_templates(unique_name: str) -> None:
    """REDLOCK_CHECK_ORDER on: the permits' shapes are their templates (like lock_name's), not
    one shape per filled value."""
    task, _seen = _task(lock_name="report:{tenant}")
    slug = "".join(random.choices(string.ascii_lowercase, k=10))
    with override_settings(REDLOCK_CHECK_ORDER=True):
        shared.clear(locks["default"].engine)
        ordering.reset()
        try:
            assert task.apply((slug,)).get() == slug
            edges = set(ordering.RECORDER.edges)
        finally:
            shared.clear(locks["default"].engine)
            ordering.reset()
    report = ("default", "report:{tenant}")
    assert (report, ("default", "api:tenant:{tenant}")) in edges
    assert (report, ("default", "api:{tenant}:global")) in edges
    # the body's own acquire (a name, not a template) is the only shape with the slug
    assert not [edge for edge in edges if slug in edge[0][1]]
    assert ((report, ("default", f"api:tenant:{slug}"))) in edges
