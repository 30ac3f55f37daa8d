"""Waiting for a waiter: what replaces "sleep a little, the other thread must be waiting by
now" in tests that measure or observe a wait.

A caller that waits for a busy name registers on the nodes with its failed attempt and keeps
that registration alive until it wins or gives up (each later attempt renews it). So once
:func:`until_waiting` returns, that caller's call had begun, and it waits for the name from then
on: a release after that point wakes it, and a wait measured by its call includes everything
that happened after that point.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from django_redlock import inspection


def waiters(alias: str, name: str) -> int:
    """How many callers are registered as waiting for ``name`` of ``alias`` now (0 when no
    node holds the name)."""
    info, _ = inspection.get_lock(alias, name)
    return 0 if info is None else info.waiters


def until_waiting(alias: str, name: str, count: int = 1, seconds: float = 20.0) -> None:
    """Return once at least ``count`` callers wait for ``name``; AssertionError after
    ``seconds`` (spawned processes may take seconds to get there)."""
    until(lambda: waiters(alias, name) >= count, seconds, f"{count} waiter(s) for {name!r}")


def until(test: Callable[[], bool], seconds: float = 20.0, what: str = "condition") -> None:
    """Poll ``test`` until it is true; AssertionError naming ``what`` after ``seconds``."""
    deadline = time.monotonic() + seconds
    while not test():
        assert time.monotonic() < deadline, f"{what}: not met within {seconds} s"
        time.sleep(0.005)


def release_once_waited_for(
    alias: str, name: str, lease: Any, seconds: float, count: int = 1
) -> threading.Thread:
    """A started thread that releases ``lease`` (``release()``) ``seconds`` after ``count``
    callers were seen waiting for ``name``: each of their calls began before that, so each
    waits at least ``seconds``. Join it after the calls."""

    def run() -> None:
        try:
            until_waiting(alias, name, count)
            time.sleep(seconds)
        finally:  # released in any case: an assertion above must not leave the waiter stuck
            lease.release()

    thread = threading.Thread(target=run)
    thread.start()
    return thread
