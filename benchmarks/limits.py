"""What ``limits()`` of two semaphores costs against two ``semaphore()`` permits taken one
after the other (the nesting it replaces), same run, interleaved rounds, on 1 and 3 nodes.

    .venv/bin/python benchmarks/limits.py [--pairs 2000] [--rounds 5]

One thread, no contention: each pair is an acquire and a release of the whole set. Starts its
own redis-server processes on free loopback ports and stops them at the end.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.primitives import configure_redlock, median_rates, pair_options  # noqa: E402

LIMITS = {"bench:global": 20, "bench:tenant:7": 2}


class _Nested:
    """Two permits taken one after the other, released together (what limits() replaces)."""

    def __init__(self, manager: object) -> None:
        take = manager.acquire  # type: ignore[attr-defined]
        self.leases = [take(name, timeout=0, permits=n) for name, n in LIMITS.items()]

    def release(self) -> None:
        for lease in reversed(self.leases):
            lease.release()


def main() -> None:
    args = pair_options(2000)

    from django_redlock.testing import RedisNodes

    with RedisNodes.start(4) as nodes:
        configure_redlock(
            {
                "one": {"NODES": [nodes[0].url]},
                "three": {"NODES": [n.url for n in list(nodes)[1:]]},
            }
        )
        from django_redlock import locks

        rows = []
        for alias in ("one", "three"):
            manager = locks[alias]
            cases: dict[str, Callable[[], object]] = {
                "two semaphore() nested": lambda m=manager: _Nested(m),
                "limits() of two": lambda m=manager: m.acquire_limits(LIMITS, timeout=0),
            }
            medians = median_rates(cases, args.pairs, args.rounds)
            base = medians["two semaphore() nested"]
            for label, rate in medians.items():
                rows.append((alias, label, rate, rate / base))

    print(f"{'nodes':<7}{'case (median of rounds)':<26}{'pairs/s':>10}{'vs nested':>11}")
    for alias, label, rate, ratio in rows:
        print(f"{alias:<7}{label:<26}{rate:>10,.0f}{ratio:>10.2f}x")


if __name__ == "__main__":
    main()
