"""Moved to django_redlock.request_locks.checks; kept so old imports work."""

from __future__ import annotations

from .request_locks.checks import (
    AUTH_MIDDLEWARE,
    CHECK_IDS,
    MIDDLEWARE_PATH,
    check_request_locks,
    iter_url_patterns,
)

__all__ = [
    "AUTH_MIDDLEWARE",
    "CHECK_IDS",
    "MIDDLEWARE_PATH",
    "check_request_locks",
    "iter_url_patterns",
]
