"""A timeout for asyncio connects that counts only the time the event loop could run.

A handshake's timeout guards against a node that does not answer. When the event loop itself
stands still (a sync call in an async view, a collector pass over a large heap, a cold import,
hundreds of tasks connecting at once), the node's replies wait in the socket, unread; a plain
timer fires as soon as the loop turns again, before the replies are read, and calls a healthy
node down. :func:`within_loop_time` counts time in short steps and counts a step the loop ran
late by no more than the step itself, so a stall is not charged to the node. A wall-clock
limit (:func:`wall_limit`) still ends a connect whose loop never recovers.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import TypeVar

T = TypeVar("T")

#: Steps per timeout: how finely the loop's own stalls are told apart from the node's time.
STEPS = 4
#: A connect may take this many times its timeout in wall-clock time, when its loop stalls.
WALL_FACTOR = 10


def wall_limit(seconds: float) -> float:
    """How long a connect with timeout ``seconds`` may take in wall-clock time."""
    return seconds * WALL_FACTOR


async def within_loop_time(awaitable: Awaitable[T], seconds: float) -> T:
    """Await ``awaitable``; raise :class:`TimeoutError` once ``seconds`` of the time the
    event loop could run have passed (or :func:`wall_limit` of wall-clock time)."""
    loop = asyncio.get_running_loop()
    step = seconds / STEPS
    started = last = loop.time()
    counted = 0.0
    async with asyncio.timeout(None) as scope:
        handle: asyncio.TimerHandle | None = None

        def tick() -> None:
            nonlocal counted, last, handle
            now = loop.time()
            counted += min(now - last, 2 * step)  # longer: the loop stood still meanwhile
            last = now
            if counted >= seconds or now - started >= wall_limit(seconds):
                scope.reschedule(now)
                handle = None
            else:
                handle = loop.call_later(min(step, seconds - counted), tick)

        handle = loop.call_later(step, tick)
        try:
            return await awaitable
        finally:
            if handle is not None:
                handle.cancel()
