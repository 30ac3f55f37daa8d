"""A spawned process of tests/locking/test_transactions.py: the next holder of a request lock."""

from __future__ import annotations

from typing import Any

from tests.support.fencing import _setup


def next_holder(config: dict[str, Any], pk: int, go: Any, results: Any) -> None:
    """Wait for ``go``, take the request lock of row ``pk`` (waiting for its holder), and
    report the stock it reads while holding it."""
    _setup(config)
    from django_redlock import locks
    from testproject.inventory.models import Product

    try:
        go.wait(10)
        with locks["default"].lock(f"tx:{pk}", timeout=10):
            results.put(("stock", Product.objects.get(pk=pk).stock))
    except Exception as exc:  # reported to the test, which fails with it
        results.put(("error", repr(exc)))
