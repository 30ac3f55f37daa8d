"""Idempotent requests against real servers: concurrent POSTs with one ``Idempotency-Key`` place
exactly one order, on gunicorn (3 worker processes, the sync view) and on uvicorn (ASGI, the
async view)."""

from __future__ import annotations

import importlib.util
import json
import os
import socket
import sys
import threading
import uuid
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings
from django.db import connection

from tests.support.server_process import ROOT, server_aliases, server_process
from tests.support.server_process import post_json as _post
from tests.test_demo_buy_endpoint import inventory, live_servers

__all__ = ["inventory", "live_servers"]  # fixtures used here


def test_concurrent_posts_with_one_key_place_one_order(
    live_servers: list[str], inventory: Any
) -> None:
    """24 clients send the same order with one key at once, to several worker processes, in
    rounds: one order row; every answer is the first run's 201, its replay, or 409."""
    _one_order(f"{live_servers[0]}/inventory/order/", inventory)


@pytest.fixture
def asgi_server(transactional_db: None, tmp_path: Path) -> Any:
    """uvicorn (one process, one event loop) on this test's database and Redis nodes."""
    if importlib.util.find_spec("uvicorn") is None:
        pytest.skip("uvicorn is not installed (pip install -e '.[dev]')")
    if connection.vendor == "sqlite" and connection.is_in_memory_db():  # type: ignore[attr-defined]
        pytest.skip("the server process needs an on-disk test database")
    database = dict(connection.settings_dict)
    if connection.vendor == "sqlite":
        database["NAME"] = str(Path(database["NAME"]).resolve())
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "tests.support.live_server_settings",
        "REDLOCK_TEST_DATABASE": json.dumps(database, default=str),
        "REDLOCK_TEST_ALIASES": server_aliases(settings.REDLOCK),
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
    }
    command = [
        sys.executable, "-m", "uvicorn", "testproject.asgi:application",
        "--host", "127.0.0.1", "--port", str(port), "--log-level", "warning",
    ]  # fmt: skip
    base = f"http://127.0.0.1:{port}"
    with server_process(command, env, f"{base}/admin/login/", tmp_path / "uvicorn.log"):
        yield base


def test_concurrent_posts_to_an_async_view_under_asgi_place_one_order(
    asgi_server: str, inventory: Any
) -> None:
    """The same with the async view under uvicorn: one event loop interleaves the requests."""
    _one_order(f"{asgi_server}/inventory/order-async/", inventory)


def _one_order(url_base: str, inventory: Any) -> None:
    product = inventory.Product.objects.create(name="once", stock=1)
    key, body = str(uuid.uuid4()), b'{"quantity": 3}'
    url = f"{url_base}{product.pk}/"
    clients, rounds = 24, 3
    start = threading.Barrier(clients)

    def client(_: int) -> list[tuple[int, dict[str, Any] | None, dict[str, str]]]:
        answers = []
        for _ in range(rounds):
            start.wait(10)
            answers.append(_post(url, key, body))
        return answers

    with ThreadPoolExecutor(clients) as pool:
        results = [answer for answers in pool.map(client, range(clients)) for answer in answers]
    statuses = Counter(status for status, _, _ in results)
    firsts = [r for r in results if r[0] == 201 and "Idempotent-Replayed" not in r[2]]
    replays = [r for r in results if r[0] == 201 and r[2].get("Idempotent-Replayed") == "true"]
    print(
        f"\nidempotent orders: {len(results)} requests: first run={len(firsts)} "
        f"replayed={len(replays)} 409={statuses[409]} other={dict(statuses)}"
    )
    assert set(statuses) <= {201, 409}, statuses
    assert len(firsts) == 1, firsts
    assert all(body == firsts[0][1] for _, body, _ in replays)
    assert inventory.Order.objects.filter(product=product).count() == 1
    assert inventory.Order.objects.get(product=product).quantity == 3
    # once it is done, a retry from anywhere is the replay; another body is 422
    status, replayed, headers = _post(url, key, body)
    assert (status, replayed, headers.get("Idempotent-Replayed")) == (201, firsts[0][1], "true")
    assert _post(url, key, b'{"quantity": 4}')[0] == 422
    assert inventory.Order.objects.filter(product=product).count() == 1
