"""Request locks with ``limits=`` (``@request_lock(..., limits={...})``, ``"LIMITS"`` in a
rule): the request also takes a permit of each semaphore (names filled from the URL like the
key), all or nothing; one full: 429 with Retry-After; nodes down: 503. Real nodes, Django's
test clients."""

from __future__ import annotations

import asyncio
import random
import string
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.test import AsyncClient, Client, override_settings

from django_redlock import locks
from django_redlock.decorators import request_lock
from django_redlock.locking import ordering
from django_redlock.locking.lease import Lease
from django_redlock.locking.ordering import shared
from django_redlock.request_locks.rules import RuleError, parse_rule
from tests.support.limits_urls import SEEN

pytestmark = pytest.mark.urls("tests.support.limits_urls")
MIDDLEWARE_PATH = "django_redlock.middleware.RequestLockMiddleware"


@pytest.fixture
def tenant() -> str:
    return uuid.uuid4().hex[:12]


@pytest.fixture
def permits() -> Iterator[Callable[..., Lease]]:
    """``take(name, n)``: hold one of ``n`` permits of ``name`` from another thread (as
    another request would), released at teardown."""
    held: list[Lease] = []
    with ThreadPoolExecutor(1) as other:

        def take(name: str, limit: int) -> Lease:
            acquire = locks["default"].acquire
            lease = other.submit(acquire, name, ttl=3, timeout=0, permits=limit).result()
            held.append(lease)
            return lease

        yield take
        for lease in held:
            other.submit(lease.release).result()


def _free(tenant: str) -> None:
    """Every permit of the request's semaphores is free again (the request let them go)."""
    manager = locks["default"]
    manager.acquire(f"api:tenant:{tenant}", timeout=0, permits=1).release()


def test_a_request_holds_the_key_and_a_permit_of_each(client: Client, tenant: str) -> None:
    response = client.get(f"/api/{tenant}/1/")
    assert response.status_code == 200
    lease = SEEN["lease"]
    assert lease.name == f"call:{tenant}:1"  # request.lease is the key's
    assert SEEN["token"] == lease.token  # and it guards the view's writes
    _free(tenant)


def test_a_full_tenant_semaphore_answers_429_and_keeps_nothing(
    client: Client, tenant: str, permits: Any
) -> None:
    permits(f"api:tenant:{tenant}", 1)
    SEEN.clear()
    over = client.get(f"/api/{tenant}/1/", HTTP_ACCEPT="application/json")
    assert over.status_code == 429
    assert int(over["Retry-After"]) >= 1
    assert over.json()["error"] == "too_many_requests"
    assert SEEN == {}  # the view did not run
    locks["default"].acquire(f"call:{tenant}:1", timeout=0).release()  # the key was let go


def test_the_global_semaphore_counts_every_tenant(
    client: Client, tenant: str, permits: Any
) -> None:
    """Three permits of api:global taken elsewhere: a request of any tenant gets 429."""
    global_name = "api:global"
    taken = [permits(global_name, 3) for _ in range(3)]
    assert client.get(f"/api/{tenant}/1/").status_code == 429
    taken[0].release()
    assert client.get(f"/api/{tenant}/1/").status_code == 200
    _free(tenant)


def test_async_view(async_client: AsyncClient, tenant: str, permits: Any) -> None:
    assert asyncio.run(async_client.get(f"/aapi/{tenant}/1/")).status_code == 200
    permits(f"api:tenant:{tenant}", 1)
    assert asyncio.run(async_client.get(f"/aapi/{tenant}/2/")).status_code == 429


def test_nodes_down_answer_503(client: Client, settings: Any, tenant: str) -> None:
    settings.REDLOCK = {
        **settings.REDLOCK,
        "down": {"NODES": ["redis://127.0.0.1:1/0"], "NODE_TIMEOUT": 0.05},
    }
    response = client.get(f"/down/{tenant}/1/")
    assert response.status_code == 503
    assert int(response["Retry-After"]) >= 1


def test_limits_rule_in_settings(client: Client, settings: Any, tenant: str, permits: Any) -> None:
    settings.MIDDLEWARE = [*settings.MIDDLEWARE, MIDDLEWARE_PATH]
    settings.REDLOCK_REQUEST_LOCKS = [
        {
            "URL_NAME": "rule",
            "KEY": "rule:{tenant}:{call}",
            "METHODS": ["GET"],
            "LIMITS": {"api:tenant:{tenant}": 1},
        }
    ]
    assert client.get(f"/rule/{tenant}/1/").status_code == 200
    permits(f"api:tenant:{tenant}", 1)
    assert client.get(f"/rule/{tenant}/2/").status_code == 429


def test_a_limits_field_the_url_lacks_takes_nothing(
    client: Client, settings: Any, tenant: str
) -> None:
    """A LIMITS template whose field the URL does not pass fails (ImproperlyConfigured)
    before the key's lock is taken: the key is free for the next request at once."""
    settings.MIDDLEWARE = [*settings.MIDDLEWARE, MIDDLEWARE_PATH]
    settings.REDLOCK_REQUEST_LOCKS = [
        {
            "URL_NAME": "rule",
            "KEY": "rule:{tenant}:{call}",
            "METHODS": ["GET"],
            "LIMITS": {"api:tenant:{missing}": 1},
        }
    ]
    with pytest.raises(ImproperlyConfigured, match="missing"):
        client.get(f"/rule/{tenant}/1/")
    locks["default"].acquire(f"rule:{tenant}:1", timeout=0).release()


@pytest.mark.parametrize(
    ("limits", "message"),
    [
        ({}, "limits must be a non-empty dict"),
        (["a"], "limits must be a non-empty dict"),
        ({"a": 0}, r"limits\['a'\]: permits must be from 1"),
        ({"a": "2"}, "permits must be an int"),
        ({"a:{0": 2}, "not a valid"),
    ],
)
def test_bad_limits_fail_at_decoration_and_in_rules(limits: Any, message: str) -> None:
    with pytest.raises(ImproperlyConfigured, match=message):
        request_lock("x:{item_id}", limits=limits)
    with pytest.raises(RuleError, match=message) as caught:
        parse_rule(0, {"URL_NAME": "rule", "KEY": "x:{tenant}", "LIMITS": limits})
    assert caught.value.check_id == "E018"


def test_the_order_checker_shapes_the_semaphores_by_their_templates(client: Client) -> None:
    """With REDLOCK_CHECK_ORDER on, each semaphore's shape is its template, like the key's:
    a tenant slug (not masked) must not make a shape per tenant (the checker would never
    match two tenants' orders, and would fill its edge limit)."""
    slug = "".join(random.choices(string.ascii_lowercase, k=10))
    with override_settings(REDLOCK_CHECK_ORDER=True):
        shared.clear(locks["default"].engine)
        ordering.reset()
        try:
            assert client.get(f"/api/{slug}/1/").status_code == 200
            edges = set(ordering.RECORDER.edges)
        finally:
            shared.clear(locks["default"].engine)
            ordering.reset()
    key = ("default", "call:{tenant}:{n}")
    assert (key, ("default", "api:tenant:{tenant}")) in edges
    assert (key, ("default", "api:global")) in edges
    assert not [edge for edge in edges if slug in edge[1][1]]
