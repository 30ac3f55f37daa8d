"""Views of tests/request_locks/test_request_multi_limits.py: request locks with ``limits=``."""

from __future__ import annotations

from typing import Any

from django.http import HttpRequest, JsonResponse
from django.urls import path

from django_redlock.decorators import request_lock
from django_redlock.locking import context

SEEN: dict[str, Any] = {}
LIMITS = {"api:global": 3, "api:tenant:{tenant}": 1}


def _record(request: HttpRequest) -> JsonResponse:
    lease = getattr(request, "lease", None)
    SEEN["lease"] = lease
    SEEN["token"] = context.current_token()
    return JsonResponse({"token": SEEN["token"]})


@request_lock("call:{tenant}:{call}", ttl=5, limits=LIMITS)
def call_api(request: HttpRequest, tenant: str, call: int) -> JsonResponse:
    return _record(request)


@request_lock("call:{tenant}:{call}", ttl=5, limits=LIMITS)
async def acall_api(request: HttpRequest, tenant: str, call: int) -> JsonResponse:
    return _record(request)


@request_lock("call:{tenant}:{call}", using="down", ttl=5, limits=LIMITS)
def down(request: HttpRequest, tenant: str, call: int) -> JsonResponse:
    return _record(request)


def plain(request: HttpRequest, **kwargs: Any) -> JsonResponse:
    return _record(request)


urlpatterns = [
    path("api/<str:tenant>/<int:call>/", call_api, name="call-api"),
    path("aapi/<str:tenant>/<int:call>/", acall_api, name="acall-api"),
    path("down/<str:tenant>/<int:call>/", down, name="down"),
    path("rule/<str:tenant>/<int:call>/", plain, name="rule"),
]
