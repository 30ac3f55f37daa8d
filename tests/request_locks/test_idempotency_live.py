"""Idempotent requests against a real multi-process server (gunicorn, 3 workers): concurrent
POSTs with one ``Idempotency-Key`` place exactly one order."""

from __future__ import annotations

import json
import threading
import urllib.error
import urllib.request
import uuid
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from tests.test_demo_buy_endpoint import inventory, live_servers

__all__ = ["inventory", "live_servers"]  # fixtures used here


def _post(url: str, key: str, body: bytes) -> tuple[int, dict[str, Any] | None, dict[str, str]]:
    request = urllib.request.Request(
        url,
        data=body,
        method="POST",
        headers={
            "Accept": "application/json",
            "Content-Type": "application/json",
            "Idempotency-Key": key,
        },
    )
    try:
        with urllib.request.urlopen(request, timeout=15) as response:
            return response.status, json.loads(response.read()), dict(response.headers)
    except urllib.error.HTTPError as exc:
        try:
            parsed = json.loads(exc.read())
        except ValueError:
            parsed = None
        return exc.code, parsed, dict(exc.headers)


def test_concurrent_posts_with_one_key_place_one_order(
    live_servers: list[str], inventory: Any
) -> None:
    """24 clients send the same order with one key at once, to several worker processes, in
    rounds: one order row; every answer is the first run's 201, its replay, or 409."""
    product = inventory.Product.objects.create(name="once", stock=1)
    key, body = str(uuid.uuid4()), b'{"quantity": 3}'
    url = f"{live_servers[0]}/inventory/order/{product.pk}/"
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
