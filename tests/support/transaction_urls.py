"""URLconf of tests/locking/test_transactions.py: request-locked views that write a row, one of them
behind an outer transaction that commits late (to widen the release-before-commit window)."""

from __future__ import annotations

import time
from typing import Any

from django.db import transaction
from django.http import HttpRequest, HttpResponse
from django.urls import path

from django_redlock.decorators import request_lock
from testproject.inventory.models import Product

#: set by the test: called after the view wrote the row (e.g. tell another process to go)
AFTER_WRITE: list[Any] = []
#: how long the outer transaction of the slow view stays open after the view returned
COMMIT_DELAY = 0.5


@request_lock("tx:{pk}", timeout=5)
def write_row(request: HttpRequest, pk: int) -> HttpResponse:
    Product.objects.filter(pk=pk).update(stock=5)
    for hook in AFTER_WRITE:
        hook()
    return HttpResponse("written")


@request_lock("tx:{pk}", timeout=5, until_commit=False)
def write_row_released_at_once(request: HttpRequest, pk: int) -> HttpResponse:
    return write_row.__wrapped__(request, pk=pk)  # type: ignore[attr-defined, no-any-return]


def write_row_commit_late(request: HttpRequest, pk: int) -> HttpResponse:
    """The request-locked view inside a transaction that commits COMMIT_DELAY seconds later."""
    with transaction.atomic():
        response = write_row(request, pk=pk)
        time.sleep(COMMIT_DELAY)
    return response


urlpatterns = [
    path("tx/<int:pk>/", write_row),
    path("tx/<int:pk>/at-once/", write_row_released_at_once),
    path("tx/<int:pk>/late/", write_row_commit_late),
]
