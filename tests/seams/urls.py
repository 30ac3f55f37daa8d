"""URLconf of the attack probes: request-locked views calling services that lock again."""

from __future__ import annotations

import json

from django.http import HttpRequest, HttpResponse, JsonResponse
from django.urls import path

from django_redlock import locks
from django_redlock.decorators import request_lock
from testproject.inventory.models import Product

SEEN: list[dict[str, object]] = []


def sell(pk: int) -> int:
    """A service that locks the product itself (as it would when called from elsewhere)."""
    with locks["default"].lock(f"order:{pk}", timeout=2) as lease:
        product = Product.objects.claim(pk=pk)
        product.stock -= 1
        product.save()
        return lease.token


def sell_cart(pk: int, other_pk: int) -> dict[str, int]:
    """A service that locks two products at once."""
    names = [f"order:{pk}", f"order:{other_pk}"]
    with locks["default"].lock_many(names, timeout=2) as held:
        for name, token in held.tokens.items():
            product = Product.objects.claim(pk=int(name.split(":")[1]), token=token)
            product.stock -= 1
            product.save()
        return dict(held.tokens)


@request_lock("order:{pk}", timeout=2)
def pay(request: HttpRequest, pk: int) -> HttpResponse:
    first = sell(pk)
    second = sell(pk)
    SEEN.append({"request": request.lease.token, "first": first, "second": second})  # type: ignore[attr-defined]
    return JsonResponse({"ok": True})


@request_lock("order:{pk}", timeout=2)
def pay_cart(request: HttpRequest, pk: int, other: int) -> HttpResponse:
    tokens = sell_cart(pk, other)
    again = sell(pk)
    SEEN.append(
        {"request": request.lease.token, "cart": json.dumps(tokens), "again": again}  # type: ignore[attr-defined]
    )
    return JsonResponse({"ok": True})


@request_lock("order:{pk}", timeout=2)
def pay_then_fail(request: HttpRequest, pk: int) -> HttpResponse:
    sell(pk)
    raise RuntimeError("after the service")


urlpatterns = [
    path("pay/<int:pk>/", pay),
    path("cart/<int:pk>/<int:other>/", pay_cart),
    path("fail/<int:pk>/", pay_then_fail),
]
