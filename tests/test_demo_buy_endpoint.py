"""The demo's buy endpoint (``POST /inventory/buy/<id>/``, guarded by ``@request_lock``): through
the test client, and under concurrent requests to a real multi-process server."""

from __future__ import annotations

import importlib.util
import json
import os
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings
from django.db import connection
from django.test import Client

from django_redlock import locks
from tests.support.server_process import server_aliases

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def inventory(db: None) -> Any:
    """The demo's models, skipping until ``testproject/inventory/models.py`` and its table exist."""
    models = pytest.importorskip("testproject.inventory.models")
    if models.Product._meta.db_table not in connection.introspection.table_names():
        pytest.skip("the inventory tables are not migrated yet")
    return models


def test_buy_sells_until_out_of_stock(client: Client, inventory: Any) -> None:
    """Each POST sells one unit and records an Order, stamped with the request's fencing token;
    once the stock is 0 the answer is 200 {"sold": false}."""
    product = inventory.Product.objects.create(name="lamp", stock=2)
    url = f"/inventory/buy/{product.pk}/"
    answers = [client.post(url).json() for _ in range(3)]
    assert answers == [
        {"sold": True, "stock": 1},
        {"sold": True, "stock": 0},
        {"sold": False, "stock": 0},
    ]
    assert inventory.Order.objects.filter(product=product).count() == 2
    product.refresh_from_db()
    assert product.stock == 0 and product.fence_token > 0


def test_buy_while_locked_is_409(client: Client, inventory: Any) -> None:
    """While another holder has product:<id>, a purchase is 409 + Retry-After and sells nothing."""
    product = inventory.Product.objects.create(name="chair", stock=1)
    lease = locks["default"].acquire(f"product:{product.pk}", ttl=3, timeout=0)
    try:
        response = client.post(f"/inventory/buy/{product.pk}/", HTTP_ACCEPT="application/json")
    finally:
        lease.release()
    assert response.status_code == 409
    assert int(response["Retry-After"]) >= 1
    product.refresh_from_db()
    assert product.stock == 1


def test_buy_needs_post_and_an_existing_product(client: Client, inventory: Any) -> None:
    """GET is 405 (no lock taken); an unknown product is 404."""
    assert client.get("/inventory/buy/1/").status_code == 405
    assert client.post("/inventory/buy/987654321/").status_code == 404


# -- a real multi-process server -----------------------------------------------------------
def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _post(url: str) -> tuple[int, dict[str, Any] | None, str | None]:
    request = urllib.request.Request(
        url, data=b"", method="POST", headers={"Accept": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=15) as response:
            return response.status, json.loads(response.read()), response.headers["X-Worker-Pid"]
    except urllib.error.HTTPError as exc:
        body = exc.read()
        try:
            parsed = json.loads(body)
        except ValueError:
            parsed = None
        return exc.code, parsed, exc.headers.get("X-Worker-Pid")


def _wait_ready(base: str, procs: list[subprocess.Popen[bytes]], logs: Path) -> None:
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        if any(proc.poll() is not None for proc in procs):
            break
        try:
            urllib.request.urlopen(f"{base}/inventory/buy/0/", timeout=1)
        except urllib.error.HTTPError as exc:
            if exc.code == 405:
                return
        except OSError:
            pass
        time.sleep(0.1)
    text = "\n".join(p.read_text()[-2000:] for p in logs.glob("*.log"))
    raise AssertionError(f"test server at {base} did not start:\n{text}")


@pytest.fixture
def live_servers(transactional_db: None, tmp_path: Path) -> Iterator[list[str]]:
    """gunicorn with 3 worker processes (if installed), else two ``runserver`` processes; all
    on this test's database and Redis nodes. Yields their base URLs; stopped by PID."""
    if connection.vendor == "sqlite" and connection.is_in_memory_db():  # type: ignore[attr-defined]
        pytest.skip("the server processes need an on-disk test database")
    database = dict(connection.settings_dict)
    if connection.vendor == "sqlite":
        database["NAME"] = str(Path(database["NAME"]).resolve())
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "tests.support.live_server_settings",
        "REDLOCK_TEST_DATABASE": json.dumps(database, default=str),
        "REDLOCK_TEST_ALIASES": server_aliases(settings.REDLOCK),
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
    }
    if importlib.util.find_spec("gunicorn") is not None:
        ports = [_free_port()]
        commands = [
            [sys.executable, "-m", "gunicorn", "tests.support.preload_wsgi:application",
             "--workers", "3", "--bind", f"127.0.0.1:{ports[0]}", "--preload",
             "--log-level", "warning"],
        ]  # fmt: skip
    else:
        ports = [_free_port(), _free_port()]
        commands = [
            [sys.executable, "manage.py", "runserver", "--noreload", "--skip-checks",
             f"127.0.0.1:{port}"]
            for port in ports
        ]  # fmt: skip
    procs: list[subprocess.Popen[bytes]] = []
    try:
        for index, command in enumerate(commands):
            with (tmp_path / f"server{index}.log").open("wb") as log:  # the child keeps its fd
                procs.append(
                    subprocess.Popen(
                        command, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT
                    )
                )
        bases = [f"http://127.0.0.1:{port}" for port in ports]
        for base in bases:
            _wait_ready(base, procs, tmp_path)
        yield bases
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def test_concurrent_buys_on_a_multi_process_server(live_servers: list[str], inventory: Any) -> None:
    """16 clients keep buying 10 units from several server processes until one is told it is
    sold out: exactly 10 sold, each stock value handed out once (no oversell, never negative),
    the losers of each race get 409, nobody gets a 500."""
    initial, clients, cap = 10, 16, 2000
    product = inventory.Product.objects.create(name="last tickets", stock=initial)
    results: list[tuple[int, dict[str, Any] | None, str | None]] = []
    sold_out = threading.Event()

    def customer(index: int) -> None:
        url = f"{live_servers[index % len(live_servers)]}/inventory/buy/{product.pk}/"
        while not sold_out.is_set() and len(results) < cap:
            result = _post(url)
            results.append(result)  # list.append is atomic
            status, body, _ = result
            if status == 200 and body is not None and not body["sold"]:
                sold_out.set()
            elif status == 409:
                time.sleep(0.005)  # a real client would honour Retry-After; keep the race hot

    with ThreadPoolExecutor(max_workers=clients) as pool:
        # Warm-up burst on a product that does not exist (404s): a cold process opens its Redis
        # connections under the first burst, and connecting counts against NODE_TIMEOUT (the
        # servers get SERVER_NODE_TIMEOUT; the 50 ms default is missed on 2 busy cores: 503s).
        warm = [f"{live_servers[i % len(live_servers)]}/inventory/buy/0/" for i in range(32)]
        list(pool.map(_post, warm))
        started = time.monotonic()
        list(pool.map(customer, range(clients)))
    elapsed = time.monotonic() - started
    statuses = Counter(status for status, _, _ in results)
    sold = [body["stock"] for status, body, _ in results if status == 200 and body and body["sold"]]
    pids = {pid for _, _, pid in results if pid}
    print(
        f"\nbuy endpoint: {len(results)} requests in {elapsed:.2f}s over {len(pids)} processes: "
        f"200={statuses[200]} (sold {len(sold)}) 409={statuses[409]} 500={statuses[500]} "
        f"other={sum(n for s, n in statuses.items() if s not in (200, 409, 500))}"
    )
    assert set(statuses) <= {200, 409}, statuses
    assert sold_out.is_set(), f"not sold out after {cap} requests"
    assert statuses[409] > 0, "no contention happened; the test proved nothing"
    assert sorted(sold) == list(range(initial)), sold
    assert len(pids) >= 2, "only one server process answered"
    product.refresh_from_db()
    assert product.stock == 0
    assert inventory.Order.objects.filter(product=product).count() == initial
