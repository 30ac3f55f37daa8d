"""Names a release in this process just reserved for a woken waiter.

A release that finds waiters keeps its name for ``HANDOFF_MS`` for the one it wakes (see
:mod:`.kinds`). For that moment a first attempt by another caller of this process would only
fail, so that caller queues at once, behind the waiter, instead.
"""

from __future__ import annotations

import time

from .kinds import HANDOFF_MS
from .state import LeaseRecord

#: At most this many recent reservations are remembered per alias (then forgotten at once).
KEPT = 1024


class Reservations:
    """The names this process's releases reserved for a woken waiter, until when."""

    def __init__(self) -> None:
        self._until: dict[str, float] = {}

    def note(self, lease: LeaseRecord) -> None:
        """``lease``'s release reserved its name for a woken waiter."""
        if len(self._until) >= KEPT:
            self._until.clear()
        self._until[lease.name] = time.monotonic() + HANDOFF_MS / 1000

    def reserved(self, name: str) -> bool:
        """True while a release here has just reserved ``name`` (forgotten once asked)."""
        until = self._until.pop(name, None)
        return until is not None and until > time.monotonic()
