"""What the stampede-proof cache fill costs and saves (docs/effects.md): prints a table.

1. A hit: ``django_redlock.cache.get_or_set`` vs a plain ``cache.get`` of the same key, back to
   back in one process, per call (µs) and their ratio, for Django's ``RedisCache`` and
   django-redis.
2. A miss in N processes at once (a compute of ``--compute`` seconds): how many computes ran
   and the wall time until the last process had its value, for ``get_or_set``, Django's plain
   ``cache.get_or_set`` and a naive fill under a plain lock (each caller takes the lock, reads,
   computes on a miss: the N-1 waiters go through N-1 hand-offs), and the time from the end
   of the (last) compute until the last process returned. Median over ``--rounds`` rounds, a
   fresh key each.

    .venv/bin/python benchmarks/cache_fill.py [--calls 5000] [--procs 8] [--rounds 5]

Starts its own redis-server on a free loopback port and stops it at the end.
"""

from __future__ import annotations

import argparse
import multiprocessing
import statistics
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.support import cache_workers as workers  # noqa: E402

SPAWN = multiprocessing.get_context("spawn")
FILLS = ("get_or_set", "django", "lock")
FILL_LABELS = {
    "get_or_set": "redlock get_or_set",
    "django": "Django cache.get_or_set",
    "lock": "plain lock + get/set",
}


def per_call(fn: Callable[[], object], calls: int) -> float:
    started = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - started) / calls


def hit_costs(calls: int) -> tuple[float, float]:
    """(plain get, get_or_set) seconds per call on a hit of the configured default cache."""
    from django.core.cache import cache

    from django_redlock.cache import get_or_set

    key = f"bench:hit:{uuid.uuid4().hex[:8]}"
    get_or_set(key, lambda: {"user": 7, "name": "x" * 100}, 600)

    def ours() -> object:
        return get_or_set(key, dict, 600)

    def plain() -> object:
        return cache.get(key)

    per_call(ours, 500)  # warm up connections and scripts
    per_call(plain, 500)
    rounds = [(per_call(plain, calls), per_call(ours, calls)) for _ in range(5)]  # interleaved
    return (
        statistics.median(r[0] for r in rounds),
        statistics.median(r[1] for r in rounds),
    )


def miss_round(
    pool: Any, url: str, how: str, procs: int, compute: float
) -> tuple[int, float, float]:
    """One round: ``procs`` processes fill one fresh key at once; (computes, wall seconds from
    the start to the last return, seconds from the end of the last compute to the last
    return: what waiting for the value costs once it is there)."""
    import redis

    key = f"bench:miss:{uuid.uuid4().hex[:8]}"
    counter = f"{key}:computes"
    start_at = time.time() + 0.3
    args = [(key, url, counter, compute, start_at, how)] * procs
    results = pool.starmap(workers.fill_at, args)
    values = {value for value, _ in results}
    assert len(values) == 1 or how == "django", values
    client = redis.Redis.from_url(url)
    computes = int(client.get(counter) or 0)
    computed_at = float(client.get(f"{counter}:end") or 0)
    last = max(returned for _, returned in results)
    return computes, last - start_at, last - computed_at


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--calls", type=int, default=5000)
    parser.add_argument("--procs", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--compute", type=float, default=0.1)
    args = parser.parse_args()

    import django
    from django.conf import settings
    from django.test.utils import override_settings

    from django_redlock.testing import RedisNodes

    hits: dict[str, tuple[float, float]] = {}
    misses: dict[tuple[str, str], list[tuple[int, float, float]]] = {}
    with RedisNodes.start(1) as nodes:
        url = nodes[0].url
        redlock = {"default": {"NODES": [url], "TTL": 30}}
        settings.configure(
            INSTALLED_APPS=["django_redlock"],
            REDLOCK=redlock,
            CACHES=workers.caches_setting("django", url),
            USE_TZ=True,
            DATABASES={},
        )
        django.setup()
        for backend in workers.BACKENDS:
            caches = workers.caches_setting(backend, url)
            with override_settings(CACHES=caches):
                hits[backend] = hit_costs(args.calls)
            with SPAWN.Pool(
                args.procs, initializer=workers.setup_django, initargs=(redlock, caches)
            ) as pool:
                for how in FILLS:  # warm up: imports, connections, scripts in every process
                    miss_round(pool, url, how, args.procs, args.compute)
                for _ in range(args.rounds):
                    for how in FILLS:  # interleaved, so all see the same machine
                        result = miss_round(pool, url, how, args.procs, args.compute)
                        misses.setdefault((backend, how), []).append(result)

    print(f"Hit: per call, median of 5 rounds of {args.calls} calls")
    print(f"{'backend':<14}{'cache.get':>12}{'get_or_set':>14}{'ratio':>8}")
    for backend, (plain, ours) in hits.items():
        print(f"{backend:<14}{plain * 1e6:>10.1f}us{ours * 1e6:>12.1f}us{ours / plain:>7.2f}x")
    print()
    print(
        f"Miss: {args.procs} processes at once, compute {args.compute * 1e3:.0f} ms, "
        f"median of {args.rounds} rounds (computes: min-max)"
    )
    print(f"{'backend':<14}{'fill':<26}{'computes':>10}{'wall':>10}{'last return after value':>25}")
    for (backend, how), rounds in misses.items():
        computes = [c for c, _, _ in rounds]
        wall = statistics.median(w for _, w, _ in rounds)
        after = statistics.median(a for _, _, a in rounds)
        spread = f"{min(computes)}-{max(computes)}"
        print(
            f"{backend:<14}{FILL_LABELS[how]:<26}{spread:>10}{wall * 1e3:>8.1f}ms"
            f"{after * 1e3:>23.1f}ms"
        )


if __name__ == "__main__":
    main()
