"""The demo's endpoints: ``buy`` (one sale per request, guarded by a per-request lock),
``order`` (an order placed once per ``Idempotency-Key``), ``pay`` (one charge per
``Idempotency-Key``, ``manage.py pay``) and ``stock`` (a costly report, at most two at once)."""

from __future__ import annotations

import json
import time

from django.db import transaction
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseNotAllowed, JsonResponse
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_POST

from django_redlock.decorators import request_lock
from django_redlock.exceptions import StaleTokenError

from .models import Charge, Order, Product


@csrf_exempt  # a JSON API endpoint for the demo's load generators, not a browser form
@require_POST
@request_lock("product:{product_id}")
def buy(request: HttpRequest, product_id: int) -> JsonResponse:
    """Sell one unit of ``product_id``: 200 ``{"sold": bool, "stock": n}``; 409 while another
    request holds ``product:<id>``; 503 when the lock nodes are unavailable."""
    try:
        product = Product.objects.claim(pk=product_id)  # stamped with request.lease's token
    except Product.DoesNotExist:
        raise Http404(f"No product {product_id}.") from None
    except StaleTokenError:  # a newer lease already wrote the row: this one was too slow
        response = JsonResponse({"sold": False, "error": "stale_lease"}, status=409)
        response["Retry-After"] = "1"
        return response
    sold = product.stock > 0
    if sold:
        with transaction.atomic():
            product.stock -= 1
            product.save()
            Order.objects.create(product=product, quantity=1)
    return JsonResponse({"sold": sold, "stock": product.stock})


@csrf_exempt
@require_POST
@request_lock("order:{product_id}", idempotency=True)
def order(request: HttpRequest, product_id: int) -> HttpResponse:
    """Place an order of ``product_id`` (body ``{"quantity": n}``): 201 ``{"order": id}``. With
    an ``Idempotency-Key`` header it is placed once: a retry gets the same answer (with
    ``Idempotent-Replayed: true``), a duplicate sent while it runs gets 409."""
    quantity = _quantity(request)
    if quantity is None:
        return _bad_quantity()
    if not Product.objects.filter(pk=product_id).exists():
        raise Http404(f"No product {product_id}.")
    placed = Order.objects.create(product_id=product_id, quantity=quantity)
    return JsonResponse({"order": placed.pk, "quantity": quantity}, status=201)


@request_lock("order:{product_id}", idempotency=True)
async def order_async(request: HttpRequest, product_id: int) -> HttpResponse:
    """:func:`order` as an async view (the same lock and keys)."""
    if request.method != "POST":
        return HttpResponseNotAllowed(["POST"])
    quantity = _quantity(request)
    if quantity is None:
        return _bad_quantity()
    if not await Product.objects.filter(pk=product_id).aexists():
        raise Http404(f"No product {product_id}.")
    placed = Order(product_id=product_id, quantity=quantity)
    await placed.asave()
    return JsonResponse({"order": placed.pk, "quantity": quantity}, status=201)


order_async.csrf_exempt = True  # type: ignore[attr-defined]  # csrf_exempt() wraps sync on 4.2


def _quantity(request: HttpRequest) -> int | None:
    """The body's ``quantity``: a whole number >= 1 (default 1), or None."""
    try:
        quantity = int(json.loads(request.body or b"{}").get("quantity", 1))
    except (ValueError, TypeError, AttributeError):
        return None
    return quantity if quantity >= 1 else None


def _bad_quantity() -> JsonResponse:
    return JsonResponse({"error": "quantity must be a whole number >= 1"}, status=400)


@csrf_exempt
@require_POST
@request_lock("payment:{payment_id}", idempotency=True)
def pay(request: HttpRequest, payment_id: str) -> JsonResponse:
    """Charge ``{"amount_cents": n}`` for ``payment_id`` at the demo's payment provider, which
    takes ``X-Provider-Latency`` seconds (a header: the demo's knob, not part of the request)
    to answer: 201 ``{"charge": id}``. With an ``Idempotency-Key`` header a retry of
    the same payment is answered from the stored response (``Idempotent-Replayed: true``), or
    409 while the first one still runs."""
    try:
        amount = int(json.loads(request.body)["amount_cents"])
        latency = float(request.headers.get("X-Provider-Latency", "0"))
    except (KeyError, TypeError, ValueError):
        return JsonResponse({"error": 'send {"amount_cents": n}'}, status=400)
    if not (0 < amount < 10**8 and 0 <= latency <= 5):
        return JsonResponse({"error": "amount_cents or latency out of range"}, status=400)
    time.sleep(latency)  # the client may give up before the answer
    charge = Charge.objects.create(payment=payment_id, amount_cents=amount)
    return JsonResponse({"charge": charge.pk, "payment": payment_id}, status=201)


@request_lock("stock-report", limit=2)
def stock(request: HttpRequest) -> JsonResponse:
    """The stock of every product: a costly report, so at most two run at once (one of two
    permits of ``stock-report``); a third request at the same time gets 429 + Retry-After."""
    return JsonResponse({"stock": {p.name: p.stock for p in Product.objects.all()}})
