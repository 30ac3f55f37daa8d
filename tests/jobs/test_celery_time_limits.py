"""A real Celery worker's soft time limit (``SoftTimeLimitExceeded``, raised by a signal
handler in the pool process) landing in a task that waits for a busy name, at every moment
of the wait and of the hold: no name is left locked (docs/jobs.md, "Time limits and the
lock TTL")."""

from __future__ import annotations

import random
import threading
import time
import uuid
from collections import Counter

import pytest

from django_redlock import locks
from django_redlock.exceptions import LockNotAcquired
from tests.jobs.celery_app import wait_under_a_time_limit
from tests.jobs.test_celery import WAIT, Worker

NAMES = 4


def _send_under_time_limits(tasks: int, seed: int) -> tuple[Counter[str], list[str]]:
    """``tasks`` tasks over NAMES names of the one-node and the three-node alias, each with a
    soft time limit of 20-400 ms, while a thread of this process takes each name and lets it
    go every 0-150 ms (so that grants come at any moment of a task's limit). Returns how the
    tasks ended and the names (alias:name) still locked afterwards."""
    rng = random.Random(seed)
    run = uuid.uuid4().hex[:8]
    names = [(using, f"soft:{run}:{i}") for using in ("default", "multi") for i in range(NAMES)]
    stop = threading.Event()

    def contend(using: str, name: str, seed: int) -> None:
        pace = random.Random(seed)
        while not stop.is_set():
            try:
                lease = locks[using].acquire(name, ttl=30, timeout=1)
            except LockNotAcquired:
                continue
            time.sleep(pace.uniform(0.0, 0.15))
            lease.release()
            time.sleep(pace.uniform(0.0, 0.05))

    threads = [
        threading.Thread(target=contend, args=(using, name, i), daemon=True)
        for i, (using, name) in enumerate(names)
    ]
    for thread in threads:
        thread.start()
    try:
        results = []
        for i in range(tasks):
            using, name = names[i % len(names)]
            hold = rng.uniform(0.0, 0.1)
            limit = rng.uniform(0.02, 0.4)
            results.append(
                wait_under_a_time_limit.apply_async(
                    (name, using, hold), soft_time_limit=limit, time_limit=limit + 10
                )
            )
        outcomes: Counter[str] = Counter()
        for result in results:
            value = result.get(timeout=WAIT, propagate=False)
            outcomes[value if isinstance(value, str) else type(value).__name__] += 1
    finally:
        stop.set()
        for thread in threads:
            thread.join(10)
    left = []
    for using, name in names:
        try:
            locks[using].acquire(name, timeout=0).release()
        except LockNotAcquired:
            left.append(f"{using}:{name}")
    return outcomes, left


def _check(tasks: int, seed: int) -> None:
    outcomes, left = _send_under_time_limits(tasks, seed)
    print(f"{tasks} tasks: {dict(outcomes)}; names left locked: {left}")
    assert sum(outcomes.values()) == tasks
    assert outcomes["SoftTimeLimitExceeded"] > 0 and outcomes["ran"] > 0, outcomes
    assert set(outcomes) <= {"ran", "SoftTimeLimitExceeded"}, outcomes
    assert left == []


def test_soft_time_limits_leave_no_name_locked(worker: Worker) -> None:
    """40 tasks (the long profile sends 200)."""
    _check(40, seed=1)


@pytest.mark.slow
def test_soft_time_limits_leave_no_name_locked_200_tasks(worker: Worker) -> None:
    """Covered in the default profile by test_soft_time_limits_leave_no_name_locked."""
    _check(200, seed=2)
