"""What a semaphore permit, a read and a write lease cost against a lock (docs/primitives.md):
prints three tables.

1. Acquire + release pairs, one thread, on 1 and on 5 nodes (same run, interleaved rounds):
   ``acquire(name)`` + ``release()`` against ``acquire(name, permits=3)``, ``acquire(name,
   rw="read")`` and ``acquire(name, rw="write")`` + ``release()``.
2. Acquire p50 of ``lock_many`` of 10 names against one lock's (the two take turns call by
   call).
3. Contended: 8 spawned processes, each looping for ``--seconds``: take the name (a lock, or
   one of 3 permits), work ``--hold`` ms, let go; sections per second in all.

    .venv/bin/python benchmarks/primitives.py [--pairs 3000] [--rounds 5] [--seconds 3]

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


def pair_options(pairs: int) -> argparse.Namespace:
    """The command line of a script timing pairs: ``--pairs`` (per round) and ``--rounds``."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--pairs", type=int, default=pairs)
    parser.add_argument("--rounds", type=int, default=5)
    return parser.parse_args()


def configure_redlock(redlock: dict[str, object]) -> None:
    """Django set up with only ``django_redlock`` installed and ``redlock`` as ``REDLOCK``."""
    import django
    from django.conf import settings

    settings.configure(INSTALLED_APPS=["django_redlock"], REDLOCK=redlock)
    django.setup()


def pairs_per_second(take: Callable[[], object], pairs: int) -> float:
    started = time.perf_counter()
    for _ in range(pairs):
        take().release()  # type: ignore[attr-defined]
    return pairs / (time.perf_counter() - started)


def median_rates(
    cases: dict[str, Callable[[], object]], pairs: int, rounds: int
) -> dict[str, float]:
    """Per case, the median pairs/s of ``rounds`` interleaved rounds of ``pairs`` (after a
    warm-up of each)."""
    for take in cases.values():
        pairs_per_second(take, 300)  # warm up
    rates: dict[str, list[float]] = {label: [] for label in cases}
    for _ in range(rounds):
        for label, take in cases.items():
            rates[label].append(pairs_per_second(take, pairs))
    return {label: statistics.median(r) for label, r in rates.items()}


def acquire_p50s_us(cases: list[Callable[[], object]], count: int) -> list[float]:
    """Per case, the median acquire latency (the release is not timed), microseconds. The
    cases take turns call by call, so each is timed under the same load: this VM's speed
    drifts between blocks of a thousand calls (one lock's p50 read 89-160 us in consecutive
    blocks), which made a ratio of two blocks' medians swing with it."""
    times: list[list[float]] = [[] for _ in cases]
    for _ in range(count):
        for take, timed in zip(cases, times, strict=True):
            started = time.perf_counter()
            held = take()
            timed.append(time.perf_counter() - started)
            held.release()  # type: ignore[attr-defined]
    return [statistics.median(timed) * 1e6 for timed in times]


def contended_worker(
    redlock: dict[str, object], alias: str, permits: int, seconds: float, hold: float, start: float
) -> int:
    """One process of the contended case: sections done in ``seconds`` after ``start``."""
    import django
    from django.conf import settings

    settings.configure(INSTALLED_APPS=["django_redlock"], REDLOCK=redlock)
    django.setup()
    from django_redlock import locks

    manager = locks[alias]
    extra = {"permits": permits} if permits else {}
    manager.acquire("bench:warm", timeout=5).release()
    while time.time() < start:
        time.sleep(0.001)
    done, end = 0, start + seconds
    while time.time() < end:
        lease = manager.acquire(f"bench:contended:{permits}", ttl=5, timeout=30, **extra)
        time.sleep(hold)
        lease.release()
        done += 1
    return done


def contended(
    redlock: dict[str, object], alias: str, permits: int, args: argparse.Namespace
) -> float:
    import multiprocessing

    start = time.time() + 3.0  # after every process has imported Django
    with multiprocessing.get_context("spawn").Pool(8) as pool:
        counts = pool.starmap(
            contended_worker,
            [(redlock, alias, permits, args.seconds, args.hold / 1000, start)] * 8,
        )
    return sum(counts) / args.seconds


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--pairs", type=int, default=3000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--hold", type=float, default=0.5, help="ms of work per section")
    args = parser.parse_args()

    from django_redlock.testing import RedisNodes

    with RedisNodes.start(6) as nodes:
        import django
        from django.conf import settings

        redlock: dict[str, object] = {
            "one": {"NODES": [nodes[0].url]},
            "five": {"NODES": [n.url for n in list(nodes)[1:]]},
        }
        settings.configure(INSTALLED_APPS=["django_redlock"], REDLOCK=redlock)
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
                "read lease": lambda m=manager: m.acquire("bench:read", timeout=0, rw="read"),
                "write lease": lambda m=manager: m.acquire("bench:write", timeout=0, rw="write"),
            }
            medians = median_rates(cases, args.pairs, args.rounds)
            for label, rate in medians.items():
                rows.append((alias, label, rate, rate / medians["lock"]))
        many_rows = []
        ten = [f"bench:many:{i}" for i in range(10)]
        for alias in ("one", "five"):
            manager = locks[alias]
            single = lambda m=manager: m.acquire("bench:single", timeout=0)  # noqa: E731
            many = lambda m=manager: m.acquire_many(ten, timeout=0)  # noqa: E731
            acquire_p50s_us([single, many], 300)  # warm up
            p50s: dict[str, list[float]] = {"single": [], "many": []}
            for _ in range(args.rounds):
                one_p50, many_p50 = acquire_p50s_us([single, many], 1000)
                p50s["single"].append(one_p50)
                p50s["many"].append(many_p50)
            one, ten_p50 = statistics.median(p50s["single"]), statistics.median(p50s["many"])
            many_rows.append((alias, one, ten_p50))
        busy = []
        for alias in ("one", "five"):
            lock_rate = contended(redlock, alias, 0, args)
            sem_rate = contended(redlock, alias, 3, args)
            busy.append((alias, lock_rate, sem_rate))

    print(f"{'nodes':<6}{'case (median of rounds)':<26}{'pairs/s':>10}{'vs lock':>9}")
    for alias, label, rate, ratio in rows:
        print(f"{alias:<6}{label:<26}{rate:>10,.0f}{ratio:>8.2f}x")
    print()
    print(f"{'nodes':<6}{'lock acquire p50':>18}{'lock_many(10) p50':>19}{'ratio':>8}")
    for alias, one, ten_p50 in many_rows:
        print(f"{alias:<6}{one:>16.0f}us{ten_p50:>17.0f}us{ten_p50 / one:>7.2f}x")
    print()
    print(f"8 processes, {args.hold} ms of work per section, {args.seconds} s each")
    print(f"{'nodes':<6}{'lock sections/s':>16}{'semaphore(3) sections/s':>25}{'ratio':>8}")
    for alias, lock_rate, sem_rate in busy:
        print(f"{alias:<6}{lock_rate:>16,.0f}{sem_rate:>25,.0f}{sem_rate / lock_rate:>7.2f}x")


if __name__ == "__main__":
    main()
