"""What a semaphore permit costs against a lock (issue 15): prints a table.

Acquire + release pairs, one thread, on 1 and on 5 nodes (same run, interleaved rounds):
``acquire(name)`` + ``release()`` against ``acquire(name, permits=3)`` + ``release()``.

    .venv/bin/python benchmarks/primitives.py [--pairs 3000] [--rounds 5]

Starts its own redis-server processes on free loopback ports and stops them at the end.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def pairs_per_second(take: Callable[[], object], pairs: int) -> float:
    started = time.perf_counter()
    for _ in range(pairs):
        take().release()  # type: ignore[attr-defined]
    return pairs / (time.perf_counter() - started)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--pairs", type=int, default=3000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()

    from django_redlock.testing import RedisNodes

    with RedisNodes.start(6) as nodes:
        import django
        from django.conf import settings

        settings.configure(
            INSTALLED_APPS=["django_redlock"],
            REDLOCK={
                "one": {"NODES": [nodes[0].url]},
                "five": {"NODES": [n.url for n in list(nodes)[1:]]},
            },
        )
        django.setup()
        from django_redlock import locks

        rows = []
        for alias in ("one", "five"):
            manager = locks[alias]
            cases: dict[str, Callable[[], object]] = {
                "lock": lambda m=manager: m.acquire("bench:lock", timeout=0),
                "semaphore (3 permits)": lambda m=manager: m.acquire(
                    "bench:sem", timeout=0, permits=3
                ),
            }
            for take in cases.values():
                pairs_per_second(take, 300)  # warm up
            results: dict[str, list[float]] = {label: [] for label in cases}
            for _ in range(args.rounds):
                for label, take in cases.items():
                    results[label].append(pairs_per_second(take, args.pairs))
            lock_rate = statistics.median(results["lock"])
            for label, rates in results.items():
                rate = statistics.median(rates)
                rows.append((alias, label, rate, rate / lock_rate))

    print(f"{'nodes':<6}{'case (median of rounds)':<26}{'pairs/s':>10}{'vs lock':>9}")
    for alias, label, rate, ratio in rows:
        print(f"{alias:<6}{label:<26}{rate:>10,.0f}{ratio:>8.2f}x")


if __name__ == "__main__":
    main()
