"""Transactions (docs/production.md): a lease that would be released inside an open
``atomic()`` block is released after the outermost transaction commits, at once when it rolls
back, and kept alive meanwhile; the next holder never reads rows its predecessor had not
committed. ``TestCase``'s own atomic blocks do not count."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from django.db import connection, transaction
from django.test import Client

from django_redlock import lock, signals
from testproject.inventory.models import Product
from tests.support import transaction_urls, transaction_workers
from tests.support.attempts import free_elsewhere
from tests.support.fencing import is_postgres, worker_config
from tests.support.processes import PROCESSES


def held_elsewhere(name: str) -> bool:
    """True if another thread cannot take ``name`` right now (one attempt)."""
    return not free_elsewhere(name)


@pytest.mark.django_db(transaction=True)
def test_block_in_a_transaction_releases_after_the_commit(unique_name: str) -> None:
    """Leaving the block inside atomic() keeps the name held until the commit."""
    with transaction.atomic():
        with lock(unique_name, timeout=0):
            pass
        assert held_elsewhere(unique_name)  # before: released at block exit, inside the tx
    assert not held_elsewhere(unique_name)


@pytest.mark.django_db(transaction=True)
def test_rollback_releases_at_once(unique_name: str) -> None:
    """A transaction that rolls back releases the lease as it ends (no commit will come)."""
    with pytest.raises(RuntimeError), transaction.atomic():
        with lock(unique_name, timeout=0):
            pass
        assert held_elsewhere(unique_name)
        raise RuntimeError("roll back")
    assert not held_elsewhere(unique_name)


@pytest.mark.django_db(transaction=True)
def test_savepoint_rollback_releases_at_once(unique_name: str) -> None:
    """A block that ended inside a savepoint that rolls back is released right then."""
    with transaction.atomic():
        with pytest.raises(RuntimeError), transaction.atomic():
            with lock(unique_name, timeout=0):
                pass
            raise RuntimeError("roll back the savepoint")
        assert not held_elsewhere(unique_name)


@pytest.mark.django_db(transaction=True)
def test_until_commit_false_releases_at_block_exit(unique_name: str) -> None:
    """until_commit=False: released where the block ends, transaction or not."""
    with transaction.atomic():
        with lock(unique_name, timeout=0, until_commit=False):
            pass
        assert not held_elsewhere(unique_name)


@pytest.mark.django_db(transaction=True)
def test_lease_is_kept_alive_until_the_commit(unique_name: str) -> None:
    """A transaction that outlasts the lease's TTL: the lease is renewed until the commit."""
    import time

    with transaction.atomic():
        with lock(unique_name, ttl=0.3, timeout=0) as lease:
            pass
        time.sleep(0.6)
        assert held_elsewhere(unique_name) and not lease.lost
    assert not held_elsewhere(unique_name)


@pytest.mark.django_db
def test_testcase_atomic_blocks_do_not_count(unique_name: str) -> None:
    """Inside pytest-django's TestCase-style transaction (never committed), a block releases
    at its exit, as it would without the test's atomic blocks."""
    assert connection.in_atomic_block
    with lock(unique_name, timeout=0):
        pass
    assert not held_elsewhere(unique_name)


@pytest.fixture
def atomic_requests() -> Iterator[None]:
    settings_dict = connection.settings_dict
    old = settings_dict["ATOMIC_REQUESTS"]
    settings_dict["ATOMIC_REQUESTS"] = True
    yield
    settings_dict["ATOMIC_REQUESTS"] = old
    transaction_urls.AFTER_WRITE.clear()


@pytest.mark.django_db(transaction=True)
@pytest.mark.urls("tests.support.transaction_urls")
@pytest.mark.parametrize(("path", "after_commit"), [("", True), ("at-once/", False)])
def test_request_lock_under_atomic_requests_releases_after_the_commit(
    atomic_requests: None, path: str, after_commit: bool
) -> None:
    """@request_lock under ATOMIC_REQUESTS: when the lease is released, the request's
    transaction has committed (the row is written); until_commit=False releases inside it."""
    product = Product.objects.create(name="tx", stock=10)
    seen: list[bool] = []

    def on_released(sender: Any, **kwargs: Any) -> None:
        seen.append(connection.in_atomic_block)

    signals.lock_released.connect(on_released)
    try:
        response = Client().get(f"/tx/{product.pk}/{path}")
    finally:
        signals.lock_released.disconnect(on_released)
    assert response.status_code == 200
    assert seen == [not after_commit]
    assert Product.objects.get(pk=product.pk).stock == 5


@pytest.mark.skipif(not is_postgres(), reason="READ COMMITTED across processes: PostgreSQL")
@pytest.mark.django_db(transaction=True)
@pytest.mark.urls("tests.support.transaction_urls")
def test_next_holder_in_another_process_reads_committed_rows(atomic_requests: None) -> None:
    """Process B waits for the request lock of a row that process A's request is writing;
    A's transaction commits 0.5 s after the view returned. B must get the lock only after the
    commit and read the new stock (before the fix: it got the lock at the view's end and read
    the old stock)."""
    product = Product.objects.create(name="tx", stock=10)
    go, results = PROCESSES.Event(), PROCESSES.Queue()
    holder = PROCESSES.Process(
        target=transaction_workers.next_holder,
        args=(worker_config(), product.pk, go, results),
    )
    holder.start()
    transaction_urls.AFTER_WRITE.append(go.set)
    try:
        assert Client().get(f"/tx/{product.pk}/late/").status_code == 200
        kind, value = results.get(timeout=30)
    finally:
        holder.join(10)
        if holder.is_alive():
            holder.terminate()
    assert (kind, value) == ("stock", 5)
