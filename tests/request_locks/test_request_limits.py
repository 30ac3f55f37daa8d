"""Request locks with a limit (docs/primitives.md): ``@request_lock(key, limit=N)`` and ``"LIMIT":
N``
rules take one of N permits of the key; over the limit the answer is 429 with Retry-After.
Real nodes, Django's test clients."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.test import AsyncClient, Client

from django_redlock import locks
from django_redlock.decorators import request_lock
from django_redlock.locking.lease import Lease
from django_redlock.request_locks.rules import RuleError, parse_rule
from tests.support.request_lock_urls import SEEN

pytestmark = pytest.mark.urls("tests.support.request_lock_urls")
MIDDLEWARE_PATH = "django_redlock.middleware.RequestLockMiddleware"


@pytest.fixture
def item_id() -> int:
    return uuid.uuid4().int % 10**9


@pytest.fixture
def permits() -> Iterator[Callable[..., Lease]]:
    """``take(name, n)``: hold one of ``n`` permits of ``name`` from another thread (as
    another request would), released at teardown."""
    held: list[Lease] = []
    with ThreadPoolExecutor(1) as other:

        def take(name: str, limit: int = 2) -> Lease:
            acquire = locks["default"].acquire
            lease = other.submit(acquire, name, ttl=3, timeout=0, permits=limit).result()
            held.append(lease)
            return lease

        yield take
        for lease in held:
            other.submit(lease.release).result()


def test_two_requests_fit_a_third_gets_429(client: Client, item_id: int, permits: Any) -> None:
    first = permits(f"limited:{item_id}")
    response = client.get(f"/limited/{item_id}/")  # the second permit
    assert response.status_code == 200
    lease = SEEN["lease"]
    assert lease.name == f"limited:{item_id}" and lease.token > first.token
    assert SEEN["token"] == lease.token and lease.released
    permits(f"limited:{item_id}")  # both permits taken now
    SEEN.clear()
    over = client.get(f"/limited/{item_id}/", HTTP_ACCEPT="application/json")
    assert over.status_code == 429
    assert int(over["Retry-After"]) >= 1
    assert over.json()["error"] == "too_many_requests"
    assert SEEN == {}  # the view did not run


def test_async_view_over_the_limit_gets_429(
    async_client: AsyncClient, item_id: int, permits: Any
) -> None:
    permits(f"limited:{item_id}")
    assert asyncio.run(async_client.get(f"/alimited/{item_id}/")).status_code == 200
    permits(f"limited:{item_id}")
    assert asyncio.run(async_client.get(f"/alimited/{item_id}/")).status_code == 429


def test_limit_rule_in_settings(client: Client, settings: Any, item_id: int, permits: Any) -> None:
    settings.MIDDLEWARE = [*settings.MIDDLEWARE, MIDDLEWARE_PATH]
    settings.REDLOCK_REQUEST_LOCKS = [
        {"URL_NAME": "order-pay", "KEY": "pay:{order_id}", "LIMIT": 3, "TTL": 5}
    ]
    for _ in range(2):
        permits(f"pay:{item_id}", 3)
    assert client.post(f"/orders/{item_id}/pay/").status_code == 200
    permits(f"pay:{item_id}", 3)
    assert client.post(f"/orders/{item_id}/pay/").status_code == 429


@pytest.mark.parametrize("limit", [0, -1, True, "2", 2.0, 1025])
def test_bad_limit_fails_at_decoration_and_in_rules(limit: Any) -> None:
    with pytest.raises(ImproperlyConfigured, match="limit must be"):
        request_lock("x:{item_id}", limit=limit)
    with pytest.raises(RuleError, match="limit must be") as caught:
        parse_rule(0, {"URL_NAME": "order-pay", "KEY": "x:{order_id}", "LIMIT": limit})
    assert caught.value.check_id == "E018"
