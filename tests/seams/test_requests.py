"""Attack probes: request locks under ATOMIC_REQUESTS calling services that lock again."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
from django.db import connection
from django.test import Client

from testproject.inventory.models import Product
from tests.seams import urls as attack_urls
from tests.seams.helpers import free_elsewhere, keys_left


@pytest.fixture
def atomic_requests() -> Iterator[None]:
    settings_dict = connection.settings_dict
    old = settings_dict["ATOMIC_REQUESTS"]
    settings_dict["ATOMIC_REQUESTS"] = True
    attack_urls.SEEN.clear()
    yield
    settings_dict["ATOMIC_REQUESTS"] = old
    attack_urls.SEEN.clear()


@pytest.mark.django_db(transaction=True)
@pytest.mark.urls("tests.seams.urls")
def test_service_locks_reenter_the_request_lock(atomic_requests: None) -> None:
    """@request_lock("order:{pk}") under ATOMIC_REQUESTS; the view calls a service that
    locks order:{pk} twice: both re-enter the request's lease (same token), both fenced
    writes go through, and nothing is left locked after the response."""
    product = Product.objects.create(name="p", stock=10)
    response = Client().get(f"/pay/{product.pk}/")
    assert response.status_code == 200, response.content
    seen = attack_urls.SEEN[0]
    assert seen["first"] == seen["request"] == seen["second"]
    row = Product.objects.get(pk=product.pk)
    assert row.stock == 8 and row.fence_token == seen["request"]
    assert free_elsewhere(f"order:{product.pk}")
    assert keys_left(f"order:{product.pk}") == []


@pytest.mark.django_db(transaction=True)
@pytest.mark.urls("tests.seams.urls")
def test_service_lock_many_inside_the_request_lock(atomic_requests: None) -> None:
    """The view holds order:{pk}; a service takes lock_many([order:pk, order:other]) (re-enters
    order:pk, takes order:other) and writes both rows the documented way (claim with each
    name's token, save()); then a service locks order:pk again: same token as the request,
    its write goes through (before: StaleTokenError, 500, since save() inside the set
    stamped row pk with order:other's larger token); nothing locked after the response."""
    a = Product.objects.create(name="a", stock=10)
    b = Product.objects.create(name="b", stock=10)
    response = Client().get(f"/cart/{a.pk}/{b.pk}/")
    assert response.status_code == 200, response.content
    seen = attack_urls.SEEN[0]
    tokens = json.loads(str(seen["cart"]))
    assert tokens[f"order:{a.pk}"] == seen["request"] == seen["again"]
    assert Product.objects.get(pk=a.pk).stock == 8
    assert Product.objects.get(pk=b.pk).stock == 9
    for pk in (a.pk, b.pk):
        assert free_elsewhere(f"order:{pk}")
        assert keys_left(f"order:{pk}") == []


@pytest.mark.django_db(transaction=True)
@pytest.mark.urls("tests.seams.urls")
def test_view_failing_after_the_service_rolls_back_and_releases(atomic_requests: None) -> None:
    """The view raises after the service wrote: the request's transaction rolls back (the
    row is unchanged) and the lock is released at once, nothing left on the node."""
    product = Product.objects.create(name="f", stock=10)
    client = Client(raise_request_exception=False)
    response = client.get(f"/fail/{product.pk}/")
    assert response.status_code == 500
    assert Product.objects.get(pk=product.pk).stock == 10
    assert free_elsewhere(f"order:{product.pk}")
    assert keys_left(f"order:{product.pk}") == []
