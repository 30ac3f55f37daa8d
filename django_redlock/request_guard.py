"""Moved to django_redlock.request_locks; kept so old imports work."""

from __future__ import annotations

from .conf import DEFAULT_BUSY_STATUS
from .request_locks.holding import AcquireErrors
from .request_locks.holding import ahold_for_request as aguard
from .request_locks.holding import hold_for_request as guard
from .request_locks.keys import USER_FIELD, KeyTemplate
from .request_locks.responses import (
    ViewErrors,
    busy_status,
    lock_error_response,
    retry_after_seconds,
)
from .request_locks.rules import LockSpec

__all__ = [
    "DEFAULT_BUSY_STATUS",
    "USER_FIELD",
    "AcquireErrors",
    "KeyTemplate",
    "LockSpec",
    "ViewErrors",
    "aguard",
    "busy_status",
    "guard",
    "lock_error_response",
    "retry_after_seconds",
]
