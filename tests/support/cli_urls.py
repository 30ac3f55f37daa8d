"""Test-only URLconf for ``tests/operations/test_cli_terminal.py``: a request-locked view that runs
``manage.py redlock`` while its lock (named from the URL) is held and answers with the output."""

from __future__ import annotations

from io import StringIO

from django.core.management import call_command
from django.http import HttpRequest, JsonResponse
from django.urls import path

from django_redlock.decorators import request_lock


def _redlock(*args: str) -> str:
    out = StringIO()
    call_command("redlock", *args, stdout=out, stderr=StringIO())
    return out.getvalue()


@request_lock("order:{order_id}", ttl=30)
def order(request: HttpRequest, order_id: str) -> JsonResponse:
    """While ``order:<order_id>`` is held: ``list``, ``show`` and ``list --json`` of it."""
    name: str = request.lease.name  # type: ignore[attr-defined]
    return JsonResponse(
        {
            "name": name,
            "list": _redlock("list", "--using", "default", "--prefix", name),
            "show": _redlock("show", name),
            "json": _redlock("list", "--using", "default", "--prefix", name, "--json"),
        }
    )


urlpatterns = [path("order/<str:order_id>/", order, name="cli-order")]
