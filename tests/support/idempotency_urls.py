"""Test-only URLconf for ``tests/request_locks/test_idempotency.py``: idempotent views that
count their runs, answer a chosen status or size, raise, stream, block, roll back."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator

from django.db import transaction
from django.http import HttpRequest, HttpResponse, JsonResponse, StreamingHttpResponse
from django.urls import path

from django_redlock.decorators import request_lock

RUNS: dict[str, int] = {}
"""How many times each view body ran, by view name."""
GATE = threading.Event()
"""The blocking view waits for this (set by the test)."""
ENTERED = threading.Event()
"""Set by the blocking view once it runs (holding its lock)."""


def _ran(name: str) -> int:
    RUNS[name] = RUNS.get(name, 0) + 1
    return RUNS[name]


def _answer(request: HttpRequest, name: str) -> HttpResponse:
    run = _ran(name)
    status = int(request.GET.get("status", 201))
    size = int(request.GET.get("size", 0))
    if size:
        return HttpResponse(b"x" * size, status=status, content_type="application/octet-stream")
    response = JsonResponse(
        {"run": run, "body": request.body.decode(), "user": str(request.user.pk)}, status=status
    )
    response["X-Order"] = f"order-{run}"
    response.set_cookie("session_hint", f"cookie-{run}")
    return response


@request_lock("idem:{item_id}", ttl=5, idempotency=True)
def idem(request: HttpRequest, item_id: int) -> HttpResponse:
    return _answer(request, "idem")


@request_lock("idem:{item_id}", ttl=5, idempotency=True)
async def aidem(request: HttpRequest, item_id: int) -> HttpResponse:
    await asyncio.sleep(0)
    run = _ran("aidem")
    response = JsonResponse({"run": run}, status=201)
    response.set_cookie("session_hint", f"cookie-{run}")
    return response


@request_lock("idem:{item_id}", ttl=5, idempotency=True)
def boom(request: HttpRequest, item_id: int) -> HttpResponse:
    _ran("boom")
    raise RuntimeError("the view failed")


@request_lock("idem:{item_id}", ttl=5, idempotency=True)
def blocking(request: HttpRequest, item_id: int) -> HttpResponse:
    ENTERED.set()
    GATE.wait(10)
    return JsonResponse({"run": _ran("blocking")}, status=201)


@request_lock("idem:{item_id}", ttl=5, idempotency=True)
def stream(request: HttpRequest, item_id: int) -> StreamingHttpResponse:
    _ran("stream")

    def chunks() -> Iterator[bytes]:
        yield b"part"

    return StreamingHttpResponse(chunks())


@transaction.atomic
@request_lock("idem:{item_id}", ttl=5, idempotency=True)
def rolled_back(request: HttpRequest, item_id: int) -> HttpResponse:
    run = _ran("rolled_back")
    if request.GET.get("rollback"):
        transaction.set_rollback(True)
    return JsonResponse({"run": run}, status=201)


@request_lock("idem:{item_id}", ttl=0.3, idempotency=True)
def slow(request: HttpRequest, item_id: int) -> HttpResponse:
    """Outlives its lease (0.3 s)."""
    time.sleep(0.5)
    return JsonResponse({"run": _ran("slow")}, status=201)


def ruled(request: HttpRequest, item_id: int) -> HttpResponse:
    """Not decorated: a REDLOCK_REQUEST_LOCKS rule with IDEMPOTENCY makes it idempotent."""
    return JsonResponse({"run": _ran("ruled")}, status=201)


urlpatterns = [
    path("idem/<int:item_id>/", idem, name="idem"),
    path("aidem/<int:item_id>/", aidem, name="aidem"),
    path("boom/<int:item_id>/", boom, name="boom"),
    path("blocking/<int:item_id>/", blocking, name="blocking"),
    path("stream/<int:item_id>/", stream, name="stream"),
    path("rolled-back/<int:item_id>/", rolled_back, name="rolled-back"),
    path("ruled/<int:item_id>/", ruled, name="ruled"),
    path("slow/<int:item_id>/", slow, name="slow"),
]
