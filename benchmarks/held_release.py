"""What one release costs while the process holds many other leases: a table.

For each count of leases held (each taken with ``acquire()``, so each is an active lease of
this thread), times ``--pairs`` acquire + release pairs of one more name, and the release
alone, on 1 node. The cost of a release must not grow with the leases held.

    .venv/bin/python benchmarks/held_release.py [--held 200,2000,20000] [--pairs 2000]

Starts its own redis-server processes on free loopback ports and stops them at the end.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def measure(manager: object, held: int, pairs: int, rounds: int) -> tuple[float, float]:
    """Median over ``rounds`` of (us per acquire+release pair, us per release) while ``held``
    other leases are held (acquired in one go, released afterwards)."""
    acquire = manager.acquire  # type: ignore[attr-defined]
    holding = [acquire(f"held:{held}:{i}", ttl=600, timeout=0) for i in range(held)]
    pair_us: list[float] = []
    release_us: list[float] = []
    for r in range(rounds):
        spent_release = 0.0
        started = time.perf_counter()
        for i in range(pairs):
            lease = acquire(f"probe:{r}:{i}", ttl=30, timeout=0)
            before = time.perf_counter()
            lease.release()
            spent_release += time.perf_counter() - before
        pair_us.append((time.perf_counter() - started) / pairs * 1e6)
        release_us.append(spent_release / pairs * 1e6)
    for lease in holding:
        lease.release()
    return statistics.median(pair_us), statistics.median(release_us)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--held", default="200,2000,20000", help="comma-separated counts")
    parser.add_argument("--pairs", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    counts = [int(c) for c in args.held.split(",")]

    from benchmarks.common import quiet_logging, setup_django
    from django_redlock.testing import RedisNodes

    quiet_logging("django_redlock")
    with RedisNodes.start(1) as nodes:
        setup_django(nodes.urls[0], nodes.urls)
        from django_redlock import locks

        manager = locks["one"]
        manager.acquire("warm", timeout=0).release()
        rows = [(held, *measure(manager, held, args.pairs, args.rounds)) for held in counts]
    base_release = rows[0][2]
    print(f"1 node, {args.pairs} pairs x {args.rounds} rounds (medians)\n")
    print("| leases held | us per pair | us per release | release vs first row |")
    print("|---:|---:|---:|---:|")
    for held, pair, release in rows:
        ratio = release / base_release if base_release else float("nan")
        print(f"| {held:,} | {pair:.1f} | {release:.1f} | {ratio:.2f}x |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
