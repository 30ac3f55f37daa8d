"""The timed acquire+release loops (sync and asyncio) and the sample they fill."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

SyncPair = tuple[Callable[[], Any], Callable[[Any], object]]
AsyncPair = tuple[Callable[[], Awaitable[Any]], Callable[[Any], Awaitable[object]]]


@dataclass
class Sample:
    """One measuring round of acquire+release pairs."""

    pairs: int = 0
    failures: int = 0
    elapsed: float = 0.0
    acquire_s: list[float] = field(default_factory=list)

    @property
    def rate(self) -> float:
        return self.pairs / self.elapsed if self.elapsed > 0 else 0.0


def pair_loop(pair: SyncPair, seconds: float, limit: int | None = None) -> Sample:
    """Acquire+release back to back for ``seconds`` (or ``limit`` pairs)."""
    acquire, release = pair
    sample = Sample()
    clock = time.perf_counter
    started = clock()
    end = started + seconds
    while True:
        t0 = clock()
        handle = acquire()
        t1 = clock()
        if handle:
            release(handle)
            sample.pairs += 1
            sample.acquire_s.append(t1 - t0)
        else:
            sample.failures += 1
        if clock() >= end or (limit is not None and sample.pairs >= limit):
            break
    sample.elapsed = clock() - started
    return sample


async def apair_loop(pair: AsyncPair, seconds: float, limit: int | None = None) -> Sample:
    """Asyncio twin of :func:`pair_loop`."""
    acquire, release = pair
    sample = Sample()
    clock = time.perf_counter
    started = clock()
    end = started + seconds
    while True:
        t0 = clock()
        handle = await acquire()
        t1 = clock()
        if handle:
            await release(handle)
            sample.pairs += 1
            sample.acquire_s.append(t1 - t0)
        else:
            sample.failures += 1
        if clock() >= end or (limit is not None and sample.pairs >= limit):
            break
    sample.elapsed = clock() - started
    return sample
