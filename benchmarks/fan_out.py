"""The acquire and hand-off targets (docs/benchmarks.md), same run: prints two tables.

1. Acquire p50/p99 and acquire+release pairs/s on 1 node, on 5 nodes with ``FAN_OUT = "all"``
   and on 5 nodes with ``FAN_OUT = "quorum"`` (interleaved rounds, medians of rounds), with
   the ratio of each 5-node p50 to the 1-node p50 (target <= 1.3x); beside them raw redis-py
   on 1 node (``SET NX PX`` + ``EVALSHA`` compare-and-delete) and the multiplexed raw fan-out
   on 5 (each command written to the five connections, then the five replies read, in one
   thread: ``benchmarks/scale.py``), and each of ours' pairs/s against the raw of as many
   nodes (targets: >= 1.5x on 1 node, >= 1.3x on 5).
2. The contended hand-off on 1 node: 8 spawned processes loop acquire (waiting) -> tiny
   section -> release on one name (``benchmarks/handoff.py``): sections/s, share handed to
   another process, hand-off p50/p99 (targets: p50 <= 0.4 ms, p99 <= 1.5 ms).

    .venv/bin/python benchmarks/fan_out.py [--pairs 2000] [--rounds 5] [--seconds 4]

Starts its own redis-server processes on free loopback ports and stops them at the end.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def acquire_times(take: Callable[[], object], pairs: int) -> tuple[list[float], float]:
    """Per pair the acquire's latency (seconds), and pairs per second overall."""
    times = []
    started = time.perf_counter()
    for _ in range(pairs):
        before = time.perf_counter()
        held = take()
        times.append(time.perf_counter() - before)
        held.release()  # type: ignore[attr-defined]
    return times, pairs / (time.perf_counter() - started)


class _RawHeld:
    """A raw pair's acquire result with the ``release()`` that :func:`acquire_times` calls."""

    def __init__(self, pair: tuple[Callable[[], object], Callable[[object], object]]) -> None:
        self.release_of = pair[1]
        self.owner = pair[0]()
        assert self.owner is not None, "the raw lock was not free"

    def release(self) -> None:
        self.release_of(self.owner)


def quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--pairs", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=4.0, help="contended phase")
    args = parser.parse_args()

    from benchmarks.handoff import contended
    from benchmarks.scenarios import Plan
    from django_redlock.testing import RedisNodes

    with RedisNodes.start(5) as nodes:
        import django
        from django.conf import settings

        urls = nodes.urls
        redlock: dict[str, object] = {
            "one": {"NODES": urls[:1], "KEY_PREFIX": "one:"},
            "five-all": {"NODES": urls, "FAN_OUT": "all", "KEY_PREFIX": "all:"},
            "five-quorum": {"NODES": urls, "FAN_OUT": "quorum", "KEY_PREFIX": "quorum:"},
        }
        settings.configure(INSTALLED_APPS=["django_redlock"], REDLOCK=redlock)
        django.setup()
        from benchmarks.contenders import raw_pair
        from benchmarks.scale import raw_fanout_pair
        from django_redlock import locks

        takes: dict[str, Callable[[], object]] = {
            alias: (lambda m=locks[alias]: m.acquire("bench:fan-out", timeout=0))
            for alias in redlock
        }
        raw_one, raw_five = raw_pair(urls[0], "raw:one"), raw_fanout_pair(urls, "raw:five")
        takes["raw-1"] = lambda: _RawHeld(raw_one)
        takes["raw-fan-out-5"] = lambda: _RawHeld(raw_five)
        for take in takes.values():
            acquire_times(take, 300)  # warm up: connections, scripts, fence state
        p50: dict[str, list[float]] = {alias: [] for alias in takes}
        p99: dict[str, list[float]] = {alias: [] for alias in takes}
        rate: dict[str, list[float]] = {alias: [] for alias in takes}
        for _ in range(args.rounds):
            for alias, take in takes.items():
                times, pairs_per_s = acquire_times(take, args.pairs)
                p50[alias].append(quantile(times, 0.5))
                p99[alias].append(quantile(times, 0.99))
                rate[alias].append(pairs_per_s)
        plan = dataclasses.replace(Plan.full(), contended_seconds=args.seconds)
        handoff = contended("django-redlock", "ours-1", 1, urls[0], urls, plan, 8)

    one = statistics.median(p50["one"])
    raw_rate = {n: statistics.median(rate[f"raw-{a}"]) for n, a in ((1, "1"), (5, "fan-out-5"))}
    print("| alias | acquire p50 | acquire p99 | pairs/s | p50 vs 1 node | pairs/s vs raw |")
    print("|---|---|---|---|---|---|")
    for alias in takes:
        mid = statistics.median(p50[alias])
        pairs = statistics.median(rate[alias])
        raw = raw_rate[1 if alias.endswith("1") or alias == "one" else 5]
        print(
            f"| {alias} | {mid * 1e6:.0f} µs | {statistics.median(p99[alias]) * 1e6:.0f} µs"
            f" | {pairs:,.0f} | {mid / one:.2f}x | {pairs / raw:.2f}x |"
        )
    print()
    handed = sorted(handoff.to_other)
    share = handoff.other_share
    print("| 8 processes, 1 node | sections/s | to another process | hand-off p50 | p99 |")
    print("|---|---|---|---|---|")
    print(
        f"| django-redlock | {handoff.rate:,.0f} | {(share or 0) * 100:.1f} %"
        f" | {quantile(handed, 0.5) * 1e6:.0f} µs | {quantile(handed, 0.99) * 1e6:.0f} µs |"
        if handed
        else f"| django-redlock | {handoff.rate:,.0f} | - | - | - | {handoff.note}"
    )


if __name__ == "__main__":
    main()
