"""``RequestLockMiddleware``: per-request locks declared in ``REDLOCK_REQUEST_LOCKS``.

The rules are parsed and matched in :mod:`django_redlock.request_locks.rules` (see there for the
format). The middleware also turns lock errors raised by any view (``LockNotAcquired``,
``NodesUnavailable``, ``LockLost``, ``StaleTokenError``) into 409/503 responses instead of 500s.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from asgiref.sync import iscoroutinefunction, markcoroutinefunction
from django.http import HttpRequest, HttpResponse
from django.http.response import HttpResponseBase

from .request_locks import outcome
from .request_locks.holding import ahold_for_request, hold_for_request
from .request_locks.responses import ViewErrors, lock_error_response
from .request_locks.rules import LockSpec, match_rule, parse_rule, request_rules

__all__ = ["RequestLockMiddleware", "parse_rule", "request_rules"]

Response = HttpResponseBase | Awaitable[HttpResponseBase]
Hold = Callable[[LockSpec, HttpRequest, Mapping[str, Any], Callable[[], Any]], Response]


class RequestLockMiddleware:
    """Hold the lock of the first matching ``REDLOCK_REQUEST_LOCKS`` rule around the request.

    Place it after ``AuthenticationMiddleware`` when a key uses ``{user...}``. Works under WSGI
    and ASGI: in async mode ``__call__`` returns the awaitable of :func:`ahold_for_request`.
    """

    sync_capable = True
    async_capable = True

    def __init__(
        self,
        get_response: Callable[[HttpRequest], HttpResponseBase]
        | Callable[[HttpRequest], Awaitable[HttpResponseBase]],
    ) -> None:
        self.get_response: Callable[[HttpRequest], Response] = get_response
        self.async_mode = iscoroutinefunction(get_response)
        self._hold: Hold = ahold_for_request if self.async_mode else hold_for_request
        if self.async_mode:
            markcoroutinefunction(self)
        request_rules()  # invalid rules fail at startup, not on the first matching request

    def __call__(self, request: HttpRequest) -> Response:
        found = match_rule(request)
        if found is None:
            return self.get_response(request)
        spec, kwargs = found
        outcome.pending(request)
        return self._hold(spec, request, kwargs, lambda: self.get_response(request))

    def process_view(self, request: HttpRequest, *args: Any) -> None:
        """Note that the view runs: a rule's idempotent response is kept only then."""
        outcome.reached(request)

    def process_exception(self, request: HttpRequest, exception: Exception) -> HttpResponse | None:
        """A lock error raised by a view becomes a 409/503 response, never a 500."""
        outcome.raised(request)
        if isinstance(exception, ViewErrors):
            return lock_error_response(request, exception)
        return None
