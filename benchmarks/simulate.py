"""What a lock block costs under ``django_redlock.testing.simulate()`` against the same block
on a real node, same run, interleaved rounds: how much faster a user's unit test of its
locking code gets without Redis (and that the simulation is no slower than the real thing).

    .venv/bin/python benchmarks/simulate.py [--pairs 3000] [--rounds 5]

One thread, no contention: each pair is an acquire and a release (of a plain lock, then of a
``limits()`` set of two semaphores). The real node's rounds run first, then the simulated
ones: a simulation covers the whole process. Starts its own redis-server on a free loopback
port and stops it at the end.
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.primitives import configure_redlock, median_rates, pair_options  # noqa: E402

LIMITS = {"bench:global": 20, "bench:tenant:7": 2}


def main() -> None:
    args = pair_options(3000)

    from django_redlock.testing import RedisNodes

    with RedisNodes.start(1) as nodes:
        configure_redlock({"default": {"NODES": [nodes[0].url]}})
        from django_redlock import locks
        from django_redlock.testing import simulate

        manager = locks["default"]
        rows = []
        for what, take in (
            ("lock", lambda: manager.acquire("bench:order:1", timeout=0)),
            ("limits() of two", lambda: manager.acquire_limits(LIMITS, timeout=0)),
        ):
            # a simulation covers the whole process, so its rounds cannot interleave with the
            # real node's: the real node's rounds first, then the same under simulate()
            medians = median_rates({"real node": take}, args.pairs, args.rounds)
            with simulate():
                medians.update(median_rates({"simulated": take}, args.pairs, args.rounds))
            for label, rate in medians.items():
                rows.append((what, label, rate, rate / medians["real node"]))

    print(f"{'acquire + release':<20}{'case (median of rounds)':<26}{'pairs/s':>10}{'vs real':>10}")
    for what, label, rate, ratio in rows:
        print(f"{what:<20}{label:<26}{rate:>10,.0f}{ratio:>9.2f}x")


if __name__ == "__main__":
    main()
