"""``health``: the endpoint a load balancer polls (``GET``; 200 healthy, 503 not)."""

from __future__ import annotations

from django.http import HttpRequest, JsonResponse
from django.utils.cache import add_never_cache_headers
from django.views.decorators.http import require_safe

from ...locking.registry import locks
from .report import statuses


@require_safe
def health(request: HttpRequest) -> JsonResponse:
    """200 when a quorum of every alias's nodes (``?alias=NAME``: that alias's) can vote,
    else 503; the body says which nodes cannot, by index (no addresses)."""
    alias = request.GET.get("alias")
    if alias is not None and alias not in list(locks):
        return JsonResponse({"error": f"unknown alias {alias!r}"}, status=404)
    report = statuses(None if alias is None else [alias])
    healthy = all(status.healthy for status in report)
    body = {"healthy": healthy, "aliases": [status.as_dict() for status in report]}
    response = JsonResponse(body, status=200 if healthy else 503)
    add_never_cache_headers(response)
    return response
