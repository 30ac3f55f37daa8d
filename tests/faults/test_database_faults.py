"""Faults on the database side of a locked block: the PostgreSQL connection killed mid-block,
SQLite's single writer lock under 8 writer processes, and the block itself raising (an
exception, an ``IntegrityError``). Nothing half-written may stay in the database, no error may
pass silently, and the lock is released on the way out, not left to expire.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
from django.db import DatabaseError, connection, transaction

from django_redlock.locking.manager import LockManager
from django_redlock.testing import RedisNodes
from tests.faults.conftest import Shop, is_postgres, keys_of
from tests.support.shop_workload import (
    conservation_anomalies,
    errors_of,
    purchase_log_anomalies,
    token_anomalies,
)

Nodes = Callable[..., RedisNodes]
Alias = Callable[..., LockManager]

# -- the database connection killed mid-block (PostgreSQL) ---------------------------------


@pytest.mark.django_db(transaction=True)
def test_pg_backend_terminated_mid_block_writes_nothing(
    redis_node_factory: Nodes, redlock_alias: Alias
) -> None:
    """PostgreSQL only (stopping the shared server is not allowed, so the worker's own backend
    is terminated with ``pg_terminate_backend`` from another connection, after the claim and
    the stock update but before the order insert and the commit): the block raises a database
    error, the lock is released, and neither the stock change nor the order is in the
    database. Control: the same block without the kill commits both."""
    if not is_postgres():
        pytest.skip("pg_terminate_backend is PostgreSQL")
    import psycopg

    from testproject.inventory.models import Order, Product

    nodes = redis_node_factory(1)
    manager = redlock_alias(nodes, TTL=30.0)
    product = Product.objects.create(name="pg", stock=5)
    params = connection.get_connection_params()
    params.pop("cursor_factory", None)
    params.pop("context", None)
    killer = psycopg.connect(**params, autocommit=True)

    def buy(kill: bool) -> None:
        with manager.lock(f"product:{product.pk}", timeout=0), transaction.atomic():
            row = Product.objects.claim(pk=product.pk)
            row.stock -= 1
            row.save()
            if kill:
                pid = connection.cursor().connection.info.backend_pid
                killed = killer.execute("SELECT pg_terminate_backend(%s)", [pid]).fetchone()
                assert killed == (True,)
            Order.objects.create(product_id=product.pk, quantity=1)

    try:
        buy(kill=False)  # control
        assert Product.objects.get(pk=product.pk).stock == 4
        with pytest.raises(DatabaseError):
            buy(kill=True)
        connection.close()  # the terminated connection; Django reconnects
        assert Product.objects.get(pk=product.pk).stock == 4
        assert Order.objects.filter(product_id=product.pk).count() == 1
        assert keys_of(manager, nodes) == []  # released on the way out, not left to expire
    finally:
        killer.close()


# -- SQLite with 8 writers -----------------------------------------------------------------


def test_sqlite_eight_writers_lose_nothing(
    shop: Shop, redis_node_factory: Nodes, report: Callable[..., None]
) -> None:
    """SQLite only: the shop workload with 8 writer processes on one SQLite file. SQLite
    serialises writers; a ``database is locked`` must surface as an error the worker records
    (a ``fail``), never as a silent loss: stock is conserved, every acknowledged sale is in
    the purchase log, tokens are in order, and no raw library error escapes."""
    if is_postgres():
        pytest.skip("the SQLite writer lock is what this scenario is about")
    nodes = redis_node_factory(1)
    run = shop.run(shop.settings(nodes), stock=5, oracle="lax", think=(0.0, 0.005))
    locked = [e for e in run.history.of("fail") if "locked" in e.get("error", "")]
    report("sqlite 8 writers", run, database_locked=len(locked))
    assert errors_of(run.history) == []
    assert conservation_anomalies(run.initial, run.history) == []
    assert purchase_log_anomalies(run.initial) == []
    assert token_anomalies(run.history) == []
    assert sum(1 for e in run.history.of("ok") if e.get("sold")) > 0
    assert len({s["pid"] for s in run.summaries}) == 8  # eight separate writer processes


# -- an exception inside the block ---------------------------------------------------------


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("failure", ["exception", "integrity-error"])
def test_exception_in_block_rolls_back_and_releases(
    redis_node_factory: Nodes, redlock_alias: Alias, failure: str
) -> None:
    """An exception inside ``with lock: with atomic():`` after the claim, the stock update and
    the order insert: the transaction rolls back (stock and orders as before), the exception
    propagates unchanged (not replaced by LockLost), and the lock is released at once (TTL
    30 s, the key is gone and the next acquire succeeds with a larger token)."""
    from django.db import IntegrityError

    from testproject.inventory.models import Order, Product

    nodes = redis_node_factory(3)
    manager = redlock_alias(nodes, TTL=30.0)
    product = Product.objects.create(name="boom", stock=5)
    expected = RuntimeError if failure == "exception" else IntegrityError
    with pytest.raises(expected), manager.lock("boom", timeout=0) as lease, transaction.atomic():
        row = Product.objects.claim(pk=product.pk)
        row.stock -= 1
        row.save()
        Order.objects.create(product_id=product.pk, quantity=1)
        if failure == "exception":
            raise RuntimeError("payment declined")
        Order.objects.create(product_id=10**9, quantity=1)  # no such product
        if connection.vendor == "sqlite":  # FK checks are deferred to the commit
            connection.check_constraints()
    assert lease.released and keys_of(manager, nodes) == []
    after = Product.objects.get(pk=product.pk)
    assert (after.stock, after.fence_token) == (5, 0)
    assert not Order.objects.filter(product_id=product.pk).exists()
    again = manager.acquire("boom", timeout=0)
    assert again.token > lease.token and again.release() is True
