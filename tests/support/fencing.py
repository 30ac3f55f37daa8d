"""Shared pieces of the FencedModel tests: the PostgreSQL oracle and spawn-process workers.

The workers run in fresh interpreters (``multiprocessing`` "spawn"): each one configures Django
with ``tests.settings`` pointed at the *test* database and the session's Redis nodes, so the
races they produce are real ones between separate processes and connections.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from typing import Any

import pytest
from django.conf import settings
from django.db import connection

ORACLE_FUNCTION = "redlock_test_fence_never_lowers"
ORACLE_TABLES = ("inventory_product", "inventory_order")


def is_postgres() -> bool:
    return connection.vendor == "postgresql"


@pytest.fixture
def fence_oracle(db: None) -> Iterator[bool]:
    """On PostgreSQL, a trigger that raises if any UPDATE lowers ``fence_token``."""
    if not is_postgres():
        yield False
        return
    with connection.cursor() as cursor:
        cursor.execute(
            f"""
            CREATE OR REPLACE FUNCTION {ORACLE_FUNCTION}() RETURNS trigger AS $$
            BEGIN
                IF NEW.fence_token < OLD.fence_token THEN
                    RAISE EXCEPTION 'fence oracle: %.fence_token lowered from % to %',
                        TG_TABLE_NAME, OLD.fence_token, NEW.fence_token;
                END IF;
                RETURN NEW;
            END $$ LANGUAGE plpgsql
            """
        )
        for table in ORACLE_TABLES:
            cursor.execute(f"DROP TRIGGER IF EXISTS fence_oracle ON {table}")
            cursor.execute(
                f"CREATE TRIGGER fence_oracle BEFORE UPDATE ON {table} "
                f"FOR EACH ROW EXECUTE FUNCTION {ORACLE_FUNCTION}()"
            )
    yield True
    with connection.cursor() as cursor:
        for table in ORACLE_TABLES:
            cursor.execute(f"DROP TRIGGER IF EXISTS fence_oracle ON {table}")
        cursor.execute(f"DROP FUNCTION IF EXISTS {ORACLE_FUNCTION}()")


def worker_config() -> dict[str, Any]:
    """What a spawned worker needs to reach this test's database and Redis nodes."""
    return {"db_name": connection.settings_dict["NAME"], "redlock": dict(settings.REDLOCK)}


def _setup(config: dict[str, Any]) -> None:
    os.environ["DJANGO_SETTINGS_MODULE"] = "tests.settings"
    from django.conf import settings as child_settings

    child_settings.DATABASES["default"]["NAME"] = config["db_name"]
    child_settings.REDLOCK = config["redlock"]
    import django

    django.setup()


def buy_worker(
    config: dict[str, Any], pk: int, attempts: int, use_lock: bool, barrier: Any, results: Any
) -> None:
    """Try to buy one unit ``attempts`` times; report (sold, rejected, errors)."""
    _setup(config)
    from django.db import transaction

    from django_redlock import locks
    from testproject.inventory.models import Order, Product

    sold = rejected = 0
    errors: list[str] = []
    barrier.wait(30)
    for _ in range(attempts):
        try:
            if use_lock:
                lease = locks["multi"].lock(f"product:{pk}", ttl=5, timeout=30)
                with lease, transaction.atomic():
                    product = Product.objects.claim(pk=pk)
                    if product.stock < 1:
                        rejected += 1
                        continue
                    product.stock -= 1
                    product.save()
                    Order.objects.create(product=product, quantity=1)
                    sold += 1
            else:
                product = Product.objects.get(pk=pk)
                if product.stock < 1:
                    rejected += 1
                    continue
                time.sleep(0.005)  # the app's work between read and write (payment, ...)
                product.stock -= 1
                product.save()
                Order.objects.create(product=product, quantity=1)
                sold += 1
        except Exception as exc:  # reported to the parent, which fails the test
            errors.append(f"{type(exc).__name__}: {exc}")
    results.put((sold, rejected, errors))


def zombie_worker(
    config: dict[str, Any], pk: int, name: str, ttl: float, go: Any, results: Any
) -> None:
    """Take the lock, read the row, stall past the TTL until told to go, then try to write."""
    _setup(config)
    from django_redlock import locks
    from django_redlock.exceptions import LockLost, StaleTokenError
    from testproject.inventory.models import Product

    outcome: dict[str, Any] = {}
    try:
        with locks["default"].lock(name, ttl=ttl, timeout=5) as lease:
            product = Product.objects.get(pk=pk)
            outcome["token"] = lease.token
            results.put(("loaded", lease.token))
            go.wait(30)  # paused: a GC pause, SIGSTOP, a slow network...
            product.stock = 999
            try:
                product.save()
                outcome["saved"] = True
            except StaleTokenError as exc:
                outcome.update(rejected=str(exc), row_token=exc.row_token, rejected_token=exc.token)
    except LockLost:
        outcome["lock_lost"] = True
    results.put(("done", outcome))


def write_worker(config: dict[str, Any], pk: int, token: int, stock: int, results: Any) -> None:
    """Save ``stock`` with an explicit token on a fresh connection; report what happened."""
    _setup(config)
    from django_redlock.exceptions import StaleTokenError
    from testproject.inventory.models import Product

    product = Product.objects.get(pk=pk)
    product.stock = stock
    try:
        product.save(fence_token=token)
    except StaleTokenError as exc:
        results.put(("rejected", exc.row_token))
        return
    updated = Product.objects.fenced(token).filter(pk=pk).update(stock=stock)
    results.put(("saved", updated))


def reinsert_worker(config: dict[str, Any], name: str, code: str, go: Any, results: Any) -> None:
    """Take lease A of ``name``, wait until told to go (a newer lease is deleting the coupon
    meanwhile), then create the coupon ``code`` under A: report ``("inserting", None)`` just
    before the INSERT is sent, then the outcome."""
    _setup(config)
    from django.db import connection as worker_connection

    from django_redlock import locks
    from django_redlock.exceptions import StaleTokenError
    from tests.fencing_app.models import Coupon

    def announce(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        if sql.startswith("INSERT") and Coupon._meta.db_table in sql:
            results.put(("inserting", None))
        return execute(sql, params, many, context)

    lease = locks["default"].acquire(name, ttl=30, timeout=5)
    results.put(("leased", lease.token))
    go.wait(30)
    try:
        with worker_connection.execute_wrapper(announce):
            Coupon.objects.create(code=code, amount=99)
        outcome: tuple[str, Any] = ("created", None)
    except StaleTokenError as exc:
        outcome = ("refused", exc.deleted_token)
    except Exception as exc:  # reported to the parent, which fails the test
        outcome = ("error", f"{type(exc).__name__}: {exc}")
    results.put(("done", outcome))
