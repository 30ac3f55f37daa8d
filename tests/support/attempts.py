"""One acquisition attempt made from another thread (another caller, never a re-entry)."""

from __future__ import annotations

import threading

from django_redlock import locks
from django_redlock.exceptions import LockError, LockNotAcquired


def free_elsewhere(name: str, alias: str = "default") -> bool:
    """True if a caller in another thread can take ``name`` right now (one attempt; a name
    taken as another kind counts as not free)."""
    outcome: list[bool] = []

    def attempt() -> None:
        try:
            locks[alias].acquire(name, timeout=0).release()
            outcome.append(True)
        except (LockNotAcquired, LockError):
            outcome.append(False)

    thread = threading.Thread(target=attempt)
    thread.start()
    thread.join(30)
    assert outcome, "the attempt from another thread hung"
    return outcome[0]
