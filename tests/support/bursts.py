"""Callers that start at one moment: ``rounds`` rounds of ``threads`` threads, each round's
threads released together by a barrier."""

from __future__ import annotations

import threading
from collections.abc import Callable


def at_one_moment(take: Callable[[int, int], None], threads: int = 12, rounds: int = 10) -> None:
    """``take(round, i)`` in ``threads`` threads per round, all of a round at once; returns
    when every round's threads have finished."""
    for round_ in range(rounds):
        barrier = threading.Barrier(threads)

        def one(i: int, round_: int = round_, barrier: threading.Barrier = barrier) -> None:
            barrier.wait(10)
            take(round_, i)

        started = [threading.Thread(target=one, args=(i,)) for i in range(threads)]
        for thread in started:
            thread.start()
        for thread in started:
            thread.join(20)
