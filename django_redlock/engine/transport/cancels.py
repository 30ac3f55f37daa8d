"""Cancels a layer below dropped: a task still counts them (``Task.cancelling()``)."""

from __future__ import annotations

import asyncio


def counted() -> int:
    """How many cancels the current task counts (0 outside a task)."""
    task = asyncio.current_task()
    return task.cancelling() if task is not None else 0


def raise_dropped(before: int) -> None:
    """Raise ``CancelledError`` if the current task was cancelled since it counted ``before``
    cancels and the cancel did not reach it."""
    if counted() > before:
        raise asyncio.CancelledError
