"""The demo's endpoints: ``buy`` (one sale per request, guarded by a per-request lock) and
``pay`` (one charge per Idempotency-Key, ``manage.py pay``)."""

from __future__ import annotations

import json
import time

from django.db import transaction
from django.http import Http404, HttpRequest, JsonResponse
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
@request_lock("payment:{payment_id}", idempotency=True)
def pay(request: HttpRequest, payment_id: str) -> JsonResponse:
    """Charge ``{"amount_cents": n}`` for ``payment_id`` at the demo's payment provider, which
    takes ``{"latency": s}`` seconds to answer: 201 ``{"charge": id}``. With an
    ``Idempotency-Key`` header a retry of the same payment is answered from the stored
    response (``Idempotent-Replayed: true``), or 409 while the first one still runs."""
    try:
        body = json.loads(request.body)
        amount, latency = int(body["amount_cents"]), float(body.get("latency", 0))
    except (KeyError, TypeError, ValueError):
        return JsonResponse({"error": 'send {"amount_cents": n, "latency": s}'}, status=400)
    if not (0 < amount < 10**8 and 0 <= latency <= 5):
        return JsonResponse({"error": "amount_cents or latency out of range"}, status=400)
    time.sleep(latency)  # the provider is slow: the client may give up before the answer
    charge = Charge.objects.create(payment=payment_id, amount_cents=amount)
    return JsonResponse({"charge": charge.pk, "payment": payment_id}, status=201)
