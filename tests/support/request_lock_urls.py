"""Test-only URLconf for the per-request lock tests (``tests/request_locks/test_middleware.py``,
``tests/request_locks/test_request_checks.py``): views that record, raise, stream, await."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any
from urllib.parse import unquote

from django.http import HttpRequest, HttpResponse, JsonResponse, StreamingHttpResponse
from django.urls import path, re_path, register_converter

from django_redlock import locks
from django_redlock.decorators import request_lock
from django_redlock.locking import context

SEEN: dict[str, Any] = {}
"""What the last view saw: ``lease`` (request.lease), ``token`` (the active-lease token)."""


def _record(request: HttpRequest) -> JsonResponse:
    lease = getattr(request, "lease", None)
    SEEN["lease"] = lease
    SEEN["token"] = context.current_token()
    return JsonResponse({"name": lease.name if lease else None, "token": SEEN["token"]})


@request_lock("item:{item_id}", ttl=5)
def item(request: HttpRequest, item_id: int) -> JsonResponse:
    return _record(request)


@request_lock("item:{item_id}", ttl=5)
async def aitem(request: HttpRequest, item_id: int) -> JsonResponse:
    await asyncio.sleep(0)
    return _record(request)


@request_lock("checkout:{user.pk}")
def checkout(request: HttpRequest) -> JsonResponse:
    return _record(request)


@request_lock("item:{item_id}")
def boom(request: HttpRequest, item_id: int) -> HttpResponse:
    _record(request)
    raise RuntimeError("the view failed")


@request_lock("item:{item_id}")
async def aboom(request: HttpRequest, item_id: int) -> HttpResponse:
    _record(request)
    raise RuntimeError("the view failed")


@request_lock("item:{item_id}")
def stream(request: HttpRequest, item_id: int) -> StreamingHttpResponse:
    _record(request)

    def chunks() -> Iterator[bytes]:
        yield b"a"
        yield b"b"

    return StreamingHttpResponse(chunks())


@request_lock("item:{item_id}")
async def astream(request: HttpRequest, item_id: int) -> StreamingHttpResponse:
    _record(request)

    async def chunks() -> AsyncIterator[bytes]:
        yield b"a"
        yield b"b"

    return StreamingHttpResponse(chunks())


@request_lock("outer:{item_id}")
@request_lock("inner:{item_id}")
def nested(request: HttpRequest, item_id: int) -> JsonResponse:
    return _record(request)


@request_lock("item:{item_id}")
def wrong_field(request: HttpRequest, item: int) -> JsonResponse:
    return _record(request)


def recording_views(template: str) -> tuple[Callable[..., Any], Callable[..., Any]]:
    """A sync and an async view locked by ``template`` that record what they saw."""

    def view(request: HttpRequest, **kwargs: Any) -> JsonResponse:
        return _record(request)

    async def aview(request: HttpRequest, **kwargs: Any) -> JsonResponse:
        await asyncio.sleep(0)
        return _record(request)

    return request_lock(template, ttl=5)(view), request_lock(template, ttl=5)(aview)


# one field only, and a user field after a separator: any URL value must still give a valid,
# distinct name (tests/request_locks/test_middleware.py, key templates)
bare, abare = recording_views("{slug}")
doc, adoc = recording_views("doc:{slug}:{user.username}")


class RawConverter:
    """Percent-decodes its segment with ``surrogateescape``: invalid UTF-8 becomes lone
    surrogates, as an app unquoting a value itself would get."""

    regex = "[^/]+"

    def to_python(self, value: str) -> str:
        return unquote(value, errors="surrogateescape")

    def to_url(self, value: str) -> str:
        return value


register_converter(RawConverter, "raw")


def plain(request: HttpRequest, **kwargs: Any) -> JsonResponse:
    """Undecorated: locked only by REDLOCK_REQUEST_LOCKS rules."""
    return _record(request)


async def aplain(request: HttpRequest, **kwargs: Any) -> JsonResponse:
    return _record(request)


def inner_busy(request: HttpRequest, name: str) -> HttpResponse:
    """Takes a lock of its own that the test holds: LockNotAcquired escapes the view."""
    with locks["default"].lock(name, timeout=0):
        return HttpResponse("unreachable")


@request_lock("limited:{item_id}", ttl=5, limit=2)
def limited(request: HttpRequest, item_id: int) -> JsonResponse:
    return _record(request)


@request_lock("limited:{item_id}", ttl=5, limit=2)
async def alimited(request: HttpRequest, item_id: int) -> JsonResponse:
    await asyncio.sleep(0)
    return _record(request)


urlpatterns = [
    path("limited/<int:item_id>/", limited, name="limited"),
    path("alimited/<int:item_id>/", alimited, name="alimited"),
    path("item/<int:item_id>/", item, name="item"),
    path("aitem/<int:item_id>/", aitem, name="aitem"),
    path("checkout/", checkout, name="checkout"),
    path("boom/<int:item_id>/", boom, name="boom"),
    path("aboom/<int:item_id>/", aboom, name="aboom"),
    path("stream/<int:item_id>/", stream, name="stream"),
    path("astream/<int:item_id>/", astream, name="astream"),
    path("nested/<int:item_id>/", nested, name="nested"),
    path("wrong/<int:item>/", wrong_field, name="wrong-field"),
    path("orders/<int:order_id>/pay/", plain, name="order-pay"),
    path("aorders/<int:order_id>/pay/", aplain, name="aorder-pay"),
    path("carts/<slug:cart>/", plain, name="cart"),
    path("inner-busy/<str:name>/", inner_busy, name="inner-busy"),
    path("bare/<str:slug>/", bare, name="bare"),
    path("abare/<str:slug>/", abare, name="abare"),
    path("rawbare/<raw:slug>/", bare, name="rawbare"),
    path("arawbare/<raw:slug>/", abare, name="arawbare"),
    path("doc/<str:slug>/", doc, name="doc"),
    path("adoc/<str:slug>/", adoc, name="adoc"),
    re_path(r"^rule/(?P<number>[^/]*)/$", plain, name="rule"),
    re_path(r"^arule/(?P<number>[^/]*)/$", aplain, name="arule"),
]
