"""The tests a user would write for the demo's views and jobs with ``redlock_simulate``: no
Redis node is used. The aliases point at traps (listeners that count connections and never
answer), so every test here fails without the simulation (503s, time-outs) and a connection
fails it at teardown."""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from django.core.management import call_command
from django.test import AsyncClient, Client

from django_redlock import lock, locks
from django_redlock.exceptions import LockLost
from django_redlock.pytest_plugin import SimulateFixture
from testproject.inventory.models import Order, Product
from tests.support.offline import Trap, connected, offline_aliases

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def traps() -> Iterator[list[Trap]]:
    with offline_aliases() as traps:
        yield traps
        assert connected(traps) == 0, "a simulated lock reached a node"


@pytest.fixture
def product() -> Product:
    return Product.objects.create(name="lamp", stock=3)


def test_buy_sells_one(client: Client, product: Product, redlock_simulate: SimulateFixture) -> None:
    """A free product:<id> lock: the sale goes through, the row gets the lease's token."""
    redlock_simulate()
    response = client.post(f"/inventory/buy/{product.pk}/")
    assert response.status_code == 200 and response.json() == {"sold": True, "stock": 2}
    product.refresh_from_db()
    assert product.fence_token > 0


def test_buy_while_another_holds_the_product_is_409(
    client: Client, product: Product, redlock_simulate: SimulateFixture
) -> None:
    """Another server holds product:<id>: 409 with Retry-After, nothing sold."""
    redlock_simulate(busy=[f"product:{product.pk}"])
    response = client.post(f"/inventory/buy/{product.pk}/")
    assert response.status_code == 409 and response["Retry-After"]
    assert Order.objects.count() == 0


def test_buy_without_lock_nodes_is_503(
    client: Client, product: Product, redlock_simulate: SimulateFixture
) -> None:
    """No quorum of lock nodes answers: 503, nothing sold."""
    redlock_simulate(unavailable=True)
    assert client.post(f"/inventory/buy/{product.pk}/").status_code == 503
    assert Order.objects.count() == 0


def test_stock_report_over_its_limit_is_429(
    client: Client, product: Product, redlock_simulate: SimulateFixture
) -> None:
    """Both permits of stock-report are taken elsewhere: 429 + Retry-After; one free: 200."""
    redlock_simulate(busy=["stock-report"])
    response = client.get("/inventory/stock/")
    assert response.status_code == 429 and response["Retry-After"]
    redlock_simulate()
    assert client.get("/inventory/stock/").json() == {"stock": {"lamp": 3}}


def test_order_is_placed_once_per_idempotency_key(
    client: Client, product: Product, redlock_simulate: SimulateFixture
) -> None:
    """The retry of an order with the same Idempotency-Key is answered from the kept
    response (kept in memory by the simulation): one order."""
    redlock_simulate()
    url, headers = f"/inventory/order/{product.pk}/", {"Idempotency-Key": "k-1"}
    first = client.post(url, b'{"quantity": 2}', "application/json", headers=headers)
    again = client.post(url, b'{"quantity": 2}', "application/json", headers=headers)
    assert first.status_code == again.status_code == 201
    assert again["Idempotent-Replayed"] == "true" and again.json() == first.json()
    assert Order.objects.count() == 1


@pytest.mark.django_db(transaction=True)  # the async view reads from another thread
def test_async_order_view(product: Product, redlock_simulate: SimulateFixture) -> None:
    """The async view under the simulation: 201, then 409 while the order lock is busy."""
    redlock_simulate()

    async def scenario() -> list[int]:
        client = AsyncClient()
        url = f"/inventory/order-async/{product.pk}/"
        placed = await client.post(url, b"{}", "application/json")
        redlock_simulate(busy=["order:*"])
        busy = await client.post(url, b"{}", "application/json")
        return [placed.status_code, busy.status_code]

    assert asyncio.run(scenario()) == [201, 409]


def test_skip_path_of_a_decorated_job(redlock_simulate: SimulateFixture) -> None:
    """``@lock(..., on_busy="skip")``: a busy name returns None without running the job."""
    runs: list[str] = []

    @lock("report:{day}", on_busy="skip")
    def build_report(day: str) -> str:
        runs.append(day)
        return "built"

    redlock_simulate(busy=["report:*"])
    assert build_report("mon") is None and runs == []
    redlock_simulate()
    assert build_report("mon") == "built" and runs == ["mon"]


def test_lease_lost_mid_sale_raises_lock_lost(
    product: Product, redlock_simulate: SimulateFixture
) -> None:
    """``lost_after``: a sale slower than its lease ends in LockLost, which the caller sees."""
    redlock_simulate(lost_after=0.05)
    with pytest.raises(LockLost), locks["default"].lock(f"product:{product.pk}", ttl=5):
        time.sleep(0.1)


def test_locked_celery_task_skips_when_busy(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, redlock_simulate: SimulateFixture
) -> None:
    """The demo's LockedTask (``nightly-report``, ``lock_on_busy="skip"``) called directly:
    skipped while another worker holds the name, run once it is free."""
    pytest.importorskip("celery")
    monkeypatch.setenv("DEMO_CELERY_BROKER", "memory://")
    from testproject import celery_demo

    redlock_simulate(busy=["nightly-report"])
    celery_demo.nightly_locked(str(tmp_path))
    assert list(tmp_path.glob("report-*")) == []
    redlock_simulate()
    celery_demo.nightly_locked(str(tmp_path))
    assert len(list(tmp_path.glob("report-*"))) == 1


JOB = "import pathlib, sys; pathlib.Path(sys.argv[1]).write_text('done')"


def test_redlock_run_in_process(tmp_path: Path, redlock_simulate: SimulateFixture) -> None:
    """``call_command("redlock", "run", ...)``: its forked holder inherits the simulation,
    so ``--skip-busy`` exits 0 without running the job while the name is busy elsewhere."""
    done = tmp_path / "done"
    command = ("redlock", "run", "nightly-report", "--skip-busy", "--", sys.executable, "-c")
    redlock_simulate(busy=["nightly-*"])
    call_command(*command, JOB, str(done))  # exit status 0: returns
    assert not done.exists()
    redlock_simulate()
    call_command(*command, JOB, str(done))
    assert done.read_text() == "done"


def test_redlock_list_shows_the_simulated_leases(redlock_simulate: SimulateFixture) -> None:
    """``manage.py redlock list`` under a simulation prints the leases held in memory."""
    from io import StringIO

    redlock_simulate()
    lease = locks["default"].acquire("nightly-report")
    out = StringIO()
    call_command("redlock", "list", stdout=out)
    assert "nightly-report" in out.getvalue() and "(simulated)" in out.getvalue()
    lease.release()


def test_redlock_run_subprocess_reads_redlock_simulate(tmp_path: Path, traps: list[Trap]) -> None:
    """A separate ``manage.py redlock run`` process runs under ``REDLOCK_SIMULATE`` (JSON of
    simulate's arguments): busy, it skips the job without reaching its (trap) node."""
    import os
    import subprocess

    done = tmp_path / "done"
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "testproject.settings",
        "REDLOCK_NODES": traps[0].url,
        "REDLOCK_SIMULATE": '{"busy": ["nightly-*"]}',
    }
    env.pop("DATABASE_URL", None)
    args = ["redlock", "run", "nightly-report", "--skip-busy", "--timeout", "5", "--"]
    result = subprocess.run(
        [sys.executable, "manage.py", *args, sys.executable, "-c", JOB, str(done)],
        cwd=Path(__file__).resolve().parent.parent,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert not done.exists()
