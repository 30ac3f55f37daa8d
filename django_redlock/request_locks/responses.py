"""The responses of a request whose lock could not be held: 409 (busy), 429 (over a limit) or
503, with Retry-After."""

from __future__ import annotations

import json
import math
from http import HTTPStatus

from django.core.exceptions import ImproperlyConfigured
from django.http import HttpRequest, HttpResponse

from ..conf import DEFAULT_BUSY_STATUS, busy_status_setting
from ..exceptions import LockError, LockLost, LockNotAcquired, NodesUnavailable, StaleTokenError

ViewErrors = (LockNotAcquired, NodesUnavailable, LockLost, StaleTokenError)
"""The lock errors that become a response instead of a 500 (also when a view raises them)."""


def busy_status() -> int:
    """``REDLOCK_BUSY_STATUS`` (default 409); an invalid value falls back to 409 (see E016)."""
    try:
        return busy_status_setting()
    except ImproperlyConfigured:
        return DEFAULT_BUSY_STATUS


def retry_after_seconds(exc: BaseException) -> int:
    """Whole seconds for ``Retry-After``: the holder's remaining TTL rounded up, at least 1."""
    seconds = getattr(exc, "retry_after", None)
    if isinstance(seconds, int | float) and math.isfinite(seconds) and seconds > 0:
        return max(1, math.ceil(seconds))
    return 1


def _wants_json(request: HttpRequest) -> bool:
    preferred = getattr(request, "get_preferred_type", None)  # Django >= 5.2
    if preferred is not None:
        return bool(preferred(["application/json", "text/html"]) != "text/html")
    accept = request.headers.get("Accept", "")
    return "json" in accept or not request.accepts("text/html")


#: The status of a request over a ``LIMIT`` (``limit=``) rule's number of permits.
LIMIT_STATUS = 429


def lock_error_response(
    request: HttpRequest, exc: LockError, *, limited: bool = False
) -> HttpResponse:
    """The 409 (busy, configurable), 429 (``limited``: every permit of a limit is taken) or
    503 (nodes unavailable) response for ``exc``.

    The body is JSON or a small HTML page, whichever the ``Accept`` header prefers; it never
    includes the lock name, which may embed user data.
    """
    retry = retry_after_seconds(exc)
    if isinstance(exc, NodesUnavailable | LockLost):
        status, code = 503, "lock_unavailable"
        message = "The lock service is unavailable. Please retry later."
    elif limited:
        status, code = LIMIT_STATUS, "too_many_requests"
        message = "Too many requests are using this resource at once. Please retry later."
    else:
        status, code = busy_status(), "lock_busy"
        message = "This resource is being changed by another request. Please retry later."
    response = error_response(request, status, code, message, retry_after=retry)
    response.redlock_lock_error = True  # type: ignore[attr-defined]  # never kept as an answer
    return response


def error_response(
    request: HttpRequest, status: int, code: str, message: str, retry_after: int | None = None
) -> HttpResponse:
    """A small error response: JSON ``{"error": code, "detail": message}`` (with
    ``"retry_after"`` when given, also sent as ``Retry-After``) or an HTML page, whichever the
    ``Accept`` header prefers. ``message`` is fixed text, never request data."""
    try:
        reason = HTTPStatus(status).phrase
    except ValueError:
        reason = "Error"
    if _wants_json(request):
        fields: dict[str, object] = {"error": code, "detail": message}
        if retry_after is not None:
            fields["retry_after"] = retry_after
        response = HttpResponse(json.dumps(fields), status=status, content_type="application/json")
    else:
        page = _page(status, reason, message)
        response = HttpResponse(page, status=status, content_type="text/html; charset=utf-8")
    if retry_after is not None:
        response["Retry-After"] = str(retry_after)
    return response


def _page(status: int, reason: str, message: str) -> str:
    return (
        f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">'
        f"<title>{status} {reason}</title></head><body><h1>{status} {reason}</h1>"
        f"<p>{message}</p></body></html>"
    )
