"""Fixtures of the fault-injection suite.

Profiles: the short profile (default) runs each scenario for about two seconds. Tests marked
``slow`` run only with ``--long`` (tests/conftest.py), at the same lengths; the environment
variable ``REDLOCK_LONG=1`` also runs them and lengthens every scenario (minutes: longer runs
and more seeds), e.g. ``REDLOCK_LONG=1 pytest tests/faults -m slow``.
"""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from django.db import connection

from django_redlock import signals
from django_redlock.locking.manager import LockManager
from django_redlock.testing import RedisNodes
from tests.support.shop_workload import (
    SHOP_ALIAS,
    History,
    WorkerPool,
    conservation_anomalies,
    errors_of,
    lock_keys,
    overlap_anomalies,
    purchase_log_anomalies,
    token_anomalies,
    wait_no_lock_keys,
)
from tests.support.tcp_proxy import Proxy

LONG = os.environ.get("REDLOCK_LONG") == "1"
#: seconds one workload run lasts
DURATION = 20.0 if LONG else 2.0
#: seeds each seeded scenario runs with
SEEDS = list(range(1, 6)) if LONG else [1]
WORKERS = 8
TTL = 2.0

ORACLE_FUNCTION = "redlock_fault_oracle"
ORACLE_AUDIT = "redlock_fault_oracle_audit"
ORACLE_TABLE = "inventory_product"


def assert_data_oracles(run: Run) -> None:
    """No raw error, stock conserved, the purchase log in token order."""
    assert errors_of(run.history) == []
    assert conservation_anomalies(run.initial, run.history) == []
    assert purchase_log_anomalies(run.initial) == []


def assert_all_oracles(run: Run, nodes: RedisNodes, prefix: str, key_wait: float) -> None:
    """The data oracles, plus tokens in real-time order, no overlapping critical sections,
    something sold, and no lock key left ``key_wait`` seconds on while every node keeps its
    fence counter."""
    assert_data_oracles(run)
    history = run.history
    assert token_anomalies(history) == []
    assert overlap_anomalies(history) == []
    assert sum(1 for e in history.of("ok") if e.get("sold")) > 0  # throughput: not asserted
    clients = [node.client() for node in nodes]
    assert wait_no_lock_keys(clients, prefix, key_wait) == []
    assert all(c.hget(f"{prefix}__fence__", "token") for c in clients)


def is_postgres() -> bool:
    return connection.vendor == "postgresql"


def keys_of(manager: LockManager, nodes: RedisNodes) -> list[str]:
    return lock_keys([n.client() for n in nodes], manager.config.key_prefix)


@pytest.fixture(scope="session")
def worker_pool(django_db_setup: Any, django_db_blocker: Any) -> Iterator[WorkerPool]:
    """Eight spawned Django processes on this session's test database, reused by every run."""
    pool = WorkerPool(WORKERS, connection.settings_dict["NAME"])
    yield pool
    pool.close()


def install_oracle(strict: bool) -> None:
    """A trigger, written without django-redlock's code, that rejects bad fence tokens.

    PostgreSQL, ``strict``: every UPDATE of a product must *raise* ``fence_token``, except a
    second write in the same transaction that raised it (claim, then save). Non-strict (and
    SQLite): an UPDATE must never lower it.
    """
    with connection.cursor() as cursor:
        if is_postgres():
            cursor.execute(
                f"CREATE TABLE IF NOT EXISTS {ORACLE_AUDIT} "
                "(pk bigint PRIMARY KEY, token bigint NOT NULL, txid bigint NOT NULL)"
            )
            cursor.execute(f"TRUNCATE {ORACLE_AUDIT}")
            equal_ok = "FALSE" if strict else "TRUE"
            cursor.execute(
                f"""
                CREATE OR REPLACE FUNCTION {ORACLE_FUNCTION}() RETURNS trigger AS $$
                DECLARE raised_in bigint;
                BEGIN
                    IF NEW.fence_token > OLD.fence_token THEN
                        INSERT INTO {ORACLE_AUDIT} VALUES (NEW.id, NEW.fence_token, txid_current())
                        ON CONFLICT (pk) DO UPDATE SET token = EXCLUDED.token, txid = EXCLUDED.txid;
                        RETURN NEW;
                    END IF;
                    IF NEW.fence_token = OLD.fence_token THEN
                        SELECT txid INTO raised_in FROM {ORACLE_AUDIT} WHERE pk = NEW.id;
                        IF {equal_ok} OR raised_in = txid_current() THEN
                            RETURN NEW;
                        END IF;
                    END IF;
                    RAISE EXCEPTION 'fault oracle: product % written with token % (row has %)',
                        NEW.id, NEW.fence_token, OLD.fence_token;
                END $$ LANGUAGE plpgsql
                """
            )
            cursor.execute(f"DROP TRIGGER IF EXISTS fault_oracle ON {ORACLE_TABLE}")
            cursor.execute(
                f"CREATE TRIGGER fault_oracle BEFORE UPDATE ON {ORACLE_TABLE} "
                f"FOR EACH ROW EXECUTE FUNCTION {ORACLE_FUNCTION}()"
            )
        else:
            cursor.execute("DROP TRIGGER IF EXISTS fault_oracle")
            cursor.execute(
                f"CREATE TRIGGER fault_oracle BEFORE UPDATE ON {ORACLE_TABLE} "
                "WHEN NEW.fence_token < OLD.fence_token BEGIN "
                "SELECT RAISE(ABORT, 'fault oracle: fence_token lowered'); END"
            )


def remove_oracle() -> None:
    with connection.cursor() as cursor:
        if is_postgres():
            cursor.execute(f"DROP TRIGGER IF EXISTS fault_oracle ON {ORACLE_TABLE}")
            cursor.execute(f"DROP FUNCTION IF EXISTS {ORACLE_FUNCTION}()")
            cursor.execute(f"DROP TABLE IF EXISTS {ORACLE_AUDIT}")
        else:
            cursor.execute("DROP TRIGGER IF EXISTS fault_oracle")


@dataclass
class Run:
    """The outcome of one workload run."""

    history: History
    initial: dict[int, int]
    summaries: list[dict[str, Any]]
    seconds: float
    notes: dict[str, Any] = field(default_factory=dict)

    def report(self) -> dict[str, Any]:
        return {**self.history.summary(), "seconds": round(self.seconds, 2), **self.notes}


@dataclass
class Shop:
    """Runs the workload against a set of nodes; see ``tests/support/shop_workload.py``."""

    pool: WorkerPool
    tmp: Path
    prefix: str = field(default_factory=lambda: f"shop-{uuid.uuid4().hex[:6]}:")
    runs: list[Run] = field(default_factory=list)
    #: the products of the run under way (a fault injector may pick its target by them)
    pks: list[int] = field(default_factory=list)

    def settings(self, nodes: RedisNodes | list[str], **options: Any) -> dict[str, Any]:
        urls = nodes.urls if isinstance(nodes, RedisNodes) else list(nodes)
        config = {
            "NODES": urls,
            "TTL": TTL,
            "KEY_PREFIX": self.prefix,
            "NODE_TIMEOUT": 0.25,
            "RETRY_DELAY": 0.05,
        }
        config.update(options)
        return {SHOP_ALIAS: config}

    def run(
        self,
        redlock: dict[str, Any],
        *,
        mode: str = "fenced",
        items: int = 10,
        stock: int = 5,
        seed: int = 1,
        duration: float = DURATION,
        workers: int = WORKERS,
        think: tuple[float, float] = (0.0, 0.02),
        timeout: float = 2.0,
        ttl: float = TTL,
        zombie: dict[str, Any] | None = None,
        during: Callable[[WorkerPool], None] | None = None,
        oracle: bool | str = "strict",
    ) -> Run:
        """One run of the workload; returns the merged history (oracles are the caller's)."""
        from testproject.inventory.models import Product

        if oracle:
            install_oracle(strict=oracle == "strict")
        else:
            remove_oracle()
        products = [Product.objects.create(name=f"item {i}", stock=stock) for i in range(items)]
        pks = self.pks = [p.pk for p in products]
        initial = {pk: stock for pk in pks}
        if zombie is not None:
            zombie = {"pk": pks[0], **zombie}
        n = len(self.runs)
        paths = [self.tmp / f"run{n}-worker{i}.jsonl" for i in range(workers)]
        tasks = [
            {
                "redlock": redlock,
                "mode": mode,
                "seed": seed,
                "duration": duration,
                "pks": pks,
                "think": think,
                "timeout": timeout,
                "ttl": ttl,
                "history": str(paths[i]),
                "zombie": zombie if i == 0 else None,
            }
            for i in range(workers)
        ]
        started = time.monotonic()
        summaries = self.pool.run(tasks, during, timeout=duration + 90)
        run = Run(History.load(paths), initial, summaries, time.monotonic() - started)
        self.runs.append(run)
        return run


@pytest.fixture
def shop(worker_pool: WorkerPool, tmp_path: Path, transactional_db: None) -> Iterator[Shop]:
    """The workload on this test's (transactional) database; the oracle is removed after."""
    shop = Shop(worker_pool, tmp_path)
    yield shop
    remove_oracle()


@pytest.fixture
def report(
    request: pytest.FixtureRequest, capsys: pytest.CaptureFixture[str]
) -> Callable[..., None]:
    """Print one line per run (scenario, operations, outcome) even with output captured."""

    def emit(label: str, run: Run, **extra: Any) -> None:
        with capsys.disabled():
            print(f"\n[{request.node.name}] {label}: {run.report() | extra}")

    return emit


@pytest.fixture
def proxies() -> Iterator[Callable[[RedisNodes], list[Proxy]]]:
    """``proxies(nodes)``: one started TCP proxy per node (tests/support/tcp_proxy.py), closed after
    the test."""
    started: list[Proxy] = []

    def make(nodes: RedisNodes) -> list[Proxy]:
        made = [Proxy(node.port).start() for node in nodes]  # type: ignore[arg-type]
        started.extend(made)
        return made

    yield make
    for proxy in started:
        proxy.close()


@pytest.fixture
def lost_signals() -> Iterator[list[dict[str, Any]]]:
    received: list[dict[str, Any]] = []

    def on_lost(sender: Any, **kwargs: Any) -> None:
        received.append(kwargs)

    signals.lock_lost.connect(on_lost)
    yield received
    signals.lock_lost.disconnect(on_lost)
