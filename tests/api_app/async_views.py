"""Plain Django views (session auth) for ASGI disconnects: a slow effect, async and sync."""

from __future__ import annotations

import asyncio
import time

from asgiref.sync import sync_to_async
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views.decorators.csrf import csrf_exempt

from django_redlock.decorators import request_lock

from .models import Payment


@csrf_exempt
@request_lock("asgi-pay:{order}", idempotency=True)
async def async_pay(request: HttpRequest, order: str) -> JsonResponse:
    """Sleeps ``pause`` seconds, then pays: a client that gives up sooner has gone by then."""
    await asyncio.sleep(float(request.GET.get("pause", 0)))
    payment = await sync_to_async(Payment.objects.create)(order=order, via="asgi_async")
    await asyncio.sleep(float(request.GET.get("after", 0)))
    return JsonResponse({"order": order, "payment": payment.pk}, status=201)


@csrf_exempt
@request_lock("asgi-pay-sync:{order}", idempotency=True)
def sync_pay(request: HttpRequest, order: str) -> JsonResponse:
    time.sleep(float(request.GET.get("pause", 0)))
    payment = Payment.objects.create(order=order, via="asgi_sync")
    time.sleep(float(request.GET.get("after", 0)))
    return JsonResponse({"order": order, "payment": payment.pk}, status=201)


def ready(request: HttpRequest) -> HttpResponse:
    return HttpResponse("ok")
