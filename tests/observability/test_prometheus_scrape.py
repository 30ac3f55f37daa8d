"""The demo served by gunicorn (3 workers, prometheus-client's multiprocess mode) with
django-prometheus and django_redlock.contrib.prometheus: after a contended workload from several
client processes, one real HTTP scrape of ``/metrics``, parsed with prometheus-client's own
parser, counts exactly what the requests did (docs/observability.md)."""

from __future__ import annotations

import json
import os
import socket
import sys
import time
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings
from django.db import connection
from prometheus_client.parser import text_string_to_metric_families

from django_redlock import locks
from django_redlock.contrib.nodes import public_label
from tests.support.metrics_workload import shopper_process
from tests.support.processes import PROCESSES
from tests.support.server_process import server_process

ROOT = Path(__file__).resolve().parents[2]
WORKERS = 3


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def scrape(base: str) -> dict[str, list[Any]]:
    """``/metrics`` parsed: family name -> its samples."""
    with urllib.request.urlopen(f"{base}/metrics", timeout=10) as response:
        text = response.read().decode()
    return {f.name: list(f.samples) for f in text_string_to_metric_families(text)}


def total(families: dict[str, list[Any]], family: str, sample: str, **labels: str) -> float:
    """The sum of ``sample``'s values whose labels include ``labels``."""
    return sum(
        s.value
        for s in families.get(family, [])
        if s.name == sample and all(s.labels.get(k) == v for k, v in labels.items())
    )


@pytest.fixture
def metrics_server(transactional_db: None, tmp_path: Path) -> Iterator[str]:
    """gunicorn, 3 workers, ``--preload``, multiprocess metrics in ``tmp_path``; stopped by PID."""
    if connection.vendor == "sqlite" and connection.is_in_memory_db():  # type: ignore[attr-defined]
        pytest.skip("the server processes need an on-disk test database")
    database = dict(connection.settings_dict)
    if connection.vendor == "sqlite":
        database["NAME"] = str(Path(database["NAME"]).resolve())
    prom_dir = tmp_path / "prometheus"
    prom_dir.mkdir()
    port = _free_port()
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "tests.support.metrics_settings",
        "REDLOCK_TEST_DATABASE": json.dumps(database, default=str),
        "REDLOCK_TEST_ALIASES": json.dumps(settings.REDLOCK),
        "PROMETHEUS_MULTIPROC_DIR": str(prom_dir),
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
    }
    command = [
        sys.executable, "-m", "gunicorn", "testproject.wsgi:application",
        "--config", "python:tests.support.gunicorn_metrics", "--workers", str(WORKERS),
        "--bind", f"127.0.0.1:{port}", "--preload", "--log-level", "warning",
    ]  # fmt: skip
    base = f"http://127.0.0.1:{port}"
    with server_process(command, env, f"{base}/metrics", tmp_path / "gunicorn.log"):
        yield base


def test_a_scrape_counts_what_a_contended_workload_did(metrics_server: str) -> None:
    """4 client processes x 4 threads x 12 POSTs on one product of 20 units: every request
    that took the lock (200, the view's own 409 ``stale_lease``) is one ``acquired`` observation
    and one hold, every ``lock_busy`` 409 one ``busy``, every 503 one ``unavailable``; nothing
    lost, nobody waiting at the end, the node up; no label holds a lock name."""
    from testproject.inventory.models import Product

    product = Product.objects.create(name="metrics demo", stock=20)
    url = f"{metrics_server}/inventory/buy/{product.pk}/"
    with PROCESSES.Pool(4) as pool:
        answers = [a for batch in pool.starmap(shopper_process, [(url, 4, 12)] * 4) for a in batch]
    outcomes = Counter(
        "acquired"
        if status == 200 or (status == 409 and error == "stale_lease")
        else "busy"
        if status == 409
        else "unavailable"
        if status == 503
        else f"unexpected {status}"
        for status, error in answers
    )
    assert len(answers) == 192 and set(outcomes) <= {"acquired", "busy", "unavailable"}, outcomes
    assert outcomes["busy"] > 0, "no contention happened; the test proved nothing"

    node = public_label(locks["default"].config.nodes[0])
    deadline = time.monotonic() + 10
    while True:  # the workers' refreshers set the node gauge within their first round
        families = scrape(metrics_server)
        if total(families, "redlock_node_up", "redlock_node_up", alias="default", node=node):
            break
        assert time.monotonic() < deadline, families.get("redlock_node_up")
        time.sleep(0.2)

    family, count = "redlock_acquire_seconds", "redlock_acquire_seconds_count"
    for outcome in ("acquired", "busy", "unavailable"):
        seen = total(families, family, count, alias="default", outcome=outcome)
        assert seen == outcomes[outcome], (outcome, seen, outcomes)
    holds = total(families, "redlock_hold_seconds", "redlock_hold_seconds_count", alias="default")
    assert holds == outcomes["acquired"]
    assert total(families, "redlock_lost", "redlock_lost_total", alias="default") == 0
    assert total(families, "redlock_waiters", "redlock_waiters", alias="default") == 0
    redlock = {name: samples for name, samples in families.items() if name.startswith("redlock")}
    assert set(redlock) == {
        "redlock_acquire_seconds",
        "redlock_hold_seconds",
        "redlock_lost",
        "redlock_waiters",
        "redlock_node_up",
        "redlock_node_rtt_seconds",
    }
    for samples in redlock.values():
        assert not any("product" in v for s in samples for v in s.labels.values())
    product.refresh_from_db()
    assert product.stock == 0 or outcomes["acquired"] < 20
