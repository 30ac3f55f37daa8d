"""FencedModel races between real processes ("spawn"), each with its own DB connection.

The workers live in ``tests/support/fencing.py`` and connect to this session's *test* database
(hence ``transaction=True``: their writes must be visible across connections).
"""

from __future__ import annotations

import queue
import time
from typing import Any

import pytest
from django.db import connection, transaction

from django_redlock import locks
from django_redlock.exceptions import StaleTokenError
from testproject.inventory.models import Order, Product
from tests.fencing_app.models import Coupon
from tests.support import fencing
from tests.support.fencing import fence_oracle, is_postgres, worker_config
from tests.support.processes import PROCESSES

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("fence_oracle")]
__all__ = ["fence_oracle"]

WORKERS = 5
ATTEMPTS = 6


def _collect(results: Any, count: int, processes: list[Any], timeout: float = 45) -> list[Any]:
    deadline = time.monotonic() + timeout
    out = []
    try:
        for _ in range(count):
            out.append(results.get(timeout=max(0.1, deadline - time.monotonic())))
    finally:
        for process in processes:
            process.join(timeout=max(0.1, deadline - time.monotonic()))
            if process.is_alive():
                process.terminate()
                process.join(5)
    return out


def _run_shop(use_lock: bool) -> dict[str, Any]:
    product = Product.objects.create(name="last items", stock=10)
    barrier, results = PROCESSES.Barrier(WORKERS), PROCESSES.Queue()
    config = worker_config()
    processes = [
        PROCESSES.Process(
            target=fencing.buy_worker,
            args=(config, product.pk, ATTEMPTS, use_lock, barrier, results),
        )
        for _ in range(WORKERS)
    ]
    for process in processes:
        process.start()
    reports = _collect(results, WORKERS, processes)
    product.refresh_from_db()
    return {
        "sold": sum(r[0] for r in reports),
        "rejected": sum(r[1] for r in reports),
        "errors": [e for r in reports for e in r[2]],
        "orders": Order.objects.filter(product=product).count(),
        "stock": product.stock,
    }


def test_oversell_is_impossible_with_lock_and_claim(capsys: pytest.CaptureFixture[str]):
    """Stock 10, 5 processes x 6 buys: exactly 10 orders, stock 0, the rest rejected."""
    outcome = _run_shop(use_lock=True)
    with capsys.disabled():
        print(f"\n[oversell, with locks] {outcome}")
    assert outcome["errors"] == []
    assert outcome["orders"] == outcome["sold"] == 10
    assert outcome["stock"] == 0
    assert outcome["rejected"] == WORKERS * ATTEMPTS - 10


def test_same_workload_without_lock_oversells(capsys: pytest.CaptureFixture[str]):
    """Proof that the test above can fail: without the lock the shop oversells.

    Asserted on PostgreSQL (real concurrent writers); on SQLite, whose writers take one
    database-wide lock, the numbers are reported only.
    """
    outcome = _run_shop(use_lock=False)
    with capsys.disabled():
        print(f"\n[oversell, no locks] {outcome}")
    assert outcome["orders"] == outcome["sold"]
    if is_postgres():
        assert outcome["orders"] > 10, outcome


def test_zombie_process_write_is_rejected(unique_name: str):
    """A worker takes the lock, stalls past its TTL; a newer holder writes; the late write fails."""
    product = Product.objects.create(name="zombie", stock=10)
    go, results = PROCESSES.Event(), PROCESSES.Queue()
    worker = PROCESSES.Process(
        target=fencing.zombie_worker,
        args=(worker_config(), product.pk, unique_name, 0.5, go, results),
    )
    worker.start()
    try:
        kind, zombie_token = results.get(timeout=30)
        assert kind == "loaded"
        time.sleep(0.7)  # the zombie's lease runs out while it is paused
        with locks["default"].lock(unique_name, ttl=5, timeout=5) as lease:
            fresh = Product.objects.claim(pk=product.pk)
            fresh.stock = 7
            fresh.save()
        go.set()
        kind, outcome = results.get(timeout=30)
    finally:
        go.set()
        worker.join(10)
    assert lease.token > zombie_token
    assert outcome["row_token"] == lease.token and outcome["rejected_token"] == zombie_token
    assert "newer lease" in outcome["rejected"]
    assert outcome.get("lock_lost") is True  # and leaving the block told it so
    product.refresh_from_db()
    assert (product.stock, product.fence_token) == (7, lease.token)


def test_token_rejects_older_tokens_across_processes(unique_name: str):
    """Written under T in one process: T-1 is refused in another process and in this one."""
    older = locks["default"].acquire(f"{unique_name}:a", ttl=5)
    older.release()
    newer = locks["default"].acquire(f"{unique_name}:b", ttl=5)
    newer.release()
    product = Product.objects.create(name="fenced", stock=10)
    outcomes = []
    for token, stock in ((newer.token, 5), (older.token, 1)):
        results = PROCESSES.Queue()
        worker = PROCESSES.Process(
            target=fencing.write_worker,
            args=(worker_config(), product.pk, token, stock, results),
        )
        worker.start()
        outcomes.append(_collect(results, 1, [worker])[0])
    assert outcomes == [("saved", 1), ("rejected", newer.token)]
    stale = Product.objects.get(pk=product.pk)
    stale.stock = 0
    with pytest.raises(StaleTokenError):
        stale.save(fence_token=older.token)
    assert Product.objects.fenced(older.token).filter(pk=product.pk).update(stock=0) == 0
    product.refresh_from_db()
    assert (product.stock, product.fence_token) == (5, newer.token)


def _wait_for_a_lock_waiter(timeout: float = 30) -> None:
    """Return once another backend of this database waits for a lock (PostgreSQL)."""
    deadline = time.monotonic() + timeout
    with connection.cursor() as cursor:
        while time.monotonic() < deadline:
            cursor.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                "AND pid <> pg_backend_pid() AND wait_event_type = 'Lock'"
            )
            if cursor.fetchone()[0]:
                return
            time.sleep(0.01)
    raise AssertionError("no backend started waiting for a lock")


def test_stale_insert_waiting_on_an_uncommitted_delete_is_refused(unique_name: str):
    """Across processes: a stale lease's create() sent while a newer lease's delete
    of the same key is still uncommitted waits for it (PostgreSQL: the unique index; SQLite:
    the database lock) and is then refused. A check made before the INSERT would have missed
    the tombstone and let the row back in."""
    Coupon.objects.create(code="race-1", amount=10)
    go, results = PROCESSES.Event(), PROCESSES.Queue()
    worker = PROCESSES.Process(
        target=fencing.reinsert_worker,
        args=(worker_config(), unique_name, "race-1", go, results),
    )
    worker.start()
    try:
        kind, stale_token = results.get(timeout=30)
        assert kind == "leased"
        locks["default"].force_release(unique_name)  # A loses the name without knowing it
        with locks["default"].lock(unique_name) as newer, transaction.atomic():
            Coupon.objects.get(code="race-1").delete()
            go.set()
            assert results.get(timeout=30) == ("inserting", None)
            if is_postgres():
                _wait_for_a_lock_waiter()  # the INSERT is sent and waits for this transaction
        kind, outcome = results.get(timeout=30)
    finally:
        go.set()
        worker.join(10)
    assert newer.token > stale_token
    assert outcome == ("refused", newer.token)
    assert not Coupon.objects.filter(code="race-1").exists()


def test_results_queue_is_drained() -> None:
    """``_collect`` gives up (and stops the workers) instead of hanging the suite."""
    results = PROCESSES.Queue()
    with pytest.raises(queue.Empty):
        _collect(results, 1, [], timeout=0.2)
