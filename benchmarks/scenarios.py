"""The uncontended scenarios: single node, five nodes and five nodes with one paused."""

from __future__ import annotations

import asyncio
import contextlib
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from benchmarks.common import HEALTHY_SOCKET_TIMEOUT, NODE_TIMEOUT, describe, percentile
from benchmarks.contenders import (
    Contender,
    aioredlock_apair,
    async_contender,
    ours_apair,
    ours_pair,
    pottery_pair,
    python_redis_lock_pair,
    raw_pair,
    redis_py_lock_pair,
    redlock_py_pair,
    sync_contender,
)
from benchmarks.loops import Sample


@dataclass(frozen=True)
class Plan:
    """How long each part runs."""

    rounds: int  # interleaved rounds per uncontended contender (median pairs/s is reported)
    round_seconds: float
    pause_seconds: float  # time cap per library with a node paused
    pause_attempts: int  # attempt cap per library with a node paused
    contended_seconds: float
    warmup: int  # acquire+release pairs before measuring

    @classmethod
    def full(cls) -> Plan:
        return cls(
            rounds=5,
            round_seconds=0.8,
            pause_seconds=5.0,
            pause_attempts=1000,
            contended_seconds=6.0,
            warmup=200,
        )

    @classmethod
    def quick(cls) -> Plan:
        return cls(
            rounds=2,
            round_seconds=0.4,
            pause_seconds=1.5,
            pause_attempts=400,
            contended_seconds=2.0,
            warmup=50,
        )


@dataclass
class PairResult:
    label: str
    rate: float | None = None  # median pairs/s over the rounds
    p50: float | None = None  # acquire latency, seconds
    p99: float | None = None
    failures: int = 0
    note: str = ""

    @classmethod
    def from_samples(cls, label: str, samples: Sequence[Sample], note: str = "") -> PairResult:
        latencies = [x for s in samples for x in s.acquire_s]
        return cls(
            label=label,
            rate=statistics.median(s.rate for s in samples) if samples else None,
            p50=percentile(latencies, 50),
            p99=percentile(latencies, 99),
            failures=sum(s.failures for s in samples),
            note=note,
        )


@dataclass
class PauseResult:
    label: str
    attempts: int = 0
    acquired: int = 0
    p50: float | None = None
    p99: float | None = None
    worst: float | None = None
    elapsed: float = 0.0
    keys_healthy: int | None = None
    keys_resumed: int | None = None
    note: str = ""

    @property
    def success(self) -> float | None:
        return self.acquired / self.attempts if self.attempts else None

    @property
    def rate(self) -> float | None:
        return self.attempts / self.elapsed if self.elapsed else None


def measure(contenders: Sequence[Contender], plan: Plan) -> list[PairResult]:
    """Warm every contender up, then run interleaved rounds (ABCD ABCD ...)."""
    samples: dict[str, list[Sample]] = {c.label: [] for c in contenders}
    broken: dict[str, str] = {}
    for c in contenders:
        try:
            c.run(30.0, plan.warmup)
        except Exception as exc:  # a library that cannot run here is reported, not fatal
            broken[c.label] = describe(exc)
    for _ in range(plan.rounds):
        for c in contenders:
            if c.label in broken:
                continue
            try:
                samples[c.label].append(c.run(plan.round_seconds, None))
            except Exception as exc:
                broken[c.label] = describe(exc)
    results = []
    for c in contenders:
        if c.label in broken:
            results.append(PairResult(c.label, note=f"failed: {broken[c.label]}"))
        else:
            results.append(PairResult.from_samples(c.label, samples[c.label], c.note))
    return results


def destroy_aioredlock(loop: asyncio.AbstractEventLoop, manager: Any, cap: float | None) -> None:
    """Close an aioredlock manager's connections, ignoring errors (within ``cap`` seconds)."""
    with contextlib.suppress(Exception):
        done = manager.destroy()
        loop.run_until_complete(done if cap is None else asyncio.wait_for(done, cap))


def single_node(url: str, plan: Plan) -> list[PairResult]:
    contenders = [
        sync_contender("django-redlock", ours_pair("one", "bench-1-ours"), "fencing token"),
        sync_contender(
            "django-redlock, no busy poll",
            ours_pair("one-no-spin", "bench-1-ours-nospin", busy_poll=0.0),
            "REDLOCK_BUSY_POLL = 0",
        ),
        sync_contender("raw redis-py", raw_pair(url, "bench-1-raw"), "SET NX PX + EVALSHA"),
        sync_contender("redis-py Lock", redis_py_lock_pair(url, "bench-1-redispy")),
        sync_contender("python-redis-lock", python_redis_lock_pair(url, "bench-1-prl")),
        sync_contender(
            "pottery", pottery_pair([url], "bench-1-pottery", HEALTHY_SOCKET_TIMEOUT), "1 master"
        ),
    ]
    return measure(contenders, plan)


def five_nodes(
    urls: Sequence[str], ports: Sequence[int], plan: Plan, loop: asyncio.AbstractEventLoop
) -> list[PairResult]:
    contenders = [
        sync_contender("django-redlock", ours_pair("five", "bench-5-ours"), "sync, fencing"),
        async_contender(
            "django-redlock async", ours_apair("five", "bench-5-ours-async"), loop, "fencing"
        ),
        sync_contender(
            "pottery", pottery_pair(urls, "bench-5-pottery", HEALTHY_SOCKET_TIMEOUT), "threads"
        ),
        sync_contender(
            "redlock-py",
            redlock_py_pair(urls, "bench-5-redlockpy", HEALTHY_SOCKET_TIMEOUT),
            "sequential",
        ),
    ]
    managers: list[Any] = []
    try:
        pair, manager = aioredlock_apair(ports, "bench-5-aioredlock", None)
        managers.append(manager)
        contenders.append(async_contender("aioredlock", pair, loop, "aioredis 1.3.1"))
    except Exception as exc:
        print(f"aioredlock unavailable: {describe(exc)}", file=sys.stderr)
    results = measure(contenders, plan)
    if not managers:
        results.append(PairResult("aioredlock", note="does not import/run here"))
    for manager in managers:
        destroy_aioredlock(loop, manager, None)
    return results


def count_keys(clients: Sequence[Any], fragment: str) -> int:
    return sum(len(list(c.scan_iter(match=f"*{fragment}*", count=1000))) for c in clients)


def paused_node(
    nodes: Any, plan: Plan, loop: asyncio.AbstractEventLoop, victim: int = 2
) -> list[PauseResult]:
    """Five nodes, ``victim`` SIGSTOPped while each library in turn tries to acquire."""
    urls: list[str] = list(nodes.urls)
    ports: list[int] = [n.port for n in nodes]
    inspect = [n.client(socket_timeout=2.0) for n in nodes]
    healthy = [c for i, c in enumerate(inspect) if i != victim]
    results: list[PauseResult] = []

    names = {
        "django-redlock": "bench-pause-ours",
        "pottery": "bench-pause-pottery",
        "redlock-py": "bench-pause-redlockpy",
        "aioredlock": "bench-pause-aioredlock",
    }
    contenders = [
        sync_contender(
            "django-redlock",
            ours_pair("five", names["django-redlock"]),
            "returns at quorum; late replies read in order",
        ),
        sync_contender(
            "pottery",
            pottery_pair(urls, names["pottery"], NODE_TIMEOUT),
            "thread pool; its retries run in the background",
        ),
        sync_contender(
            "redlock-py",
            redlock_py_pair(urls, names["redlock-py"], NODE_TIMEOUT),
            "raises when any node errs, without releasing",
        ),
    ]
    aio_manager: Any = None
    try:
        apair, aio_manager = aioredlock_apair(ports, names["aioredlock"], 2.0)
        contenders.append(
            async_contender(
                "aioredlock",
                apair,
                loop,
                "hangs on the paused node; the benchmark cancels each call at 2 s",
            )
        )
    except Exception as exc:
        results.append(PauseResult("aioredlock", note=f"unavailable: {describe(exc)}"))

    for contender in contenders:
        label = contender.label
        result = PauseResult(label, note=contender.note)
        try:
            contender.run(10.0, 20)  # connect and load scripts while every node is up
        except Exception as exc:
            result.note = f"warm-up failed: {describe(exc)}"
        nodes[victim].pause()
        try:
            sample = pause_attempts(contender.run, plan)
            time.sleep(0.3)  # in-flight releases land; what is left now stays for the TTL
        finally:
            result.keys_healthy = count_keys(healthy, names[label])
            nodes[victim].resume()
        result.elapsed = sample.elapsed
        result.attempts = sample.pairs + sample.failures
        result.acquired = sample.pairs
        if sample.acquire_s:
            result.p50 = percentile(sample.acquire_s, 50)
            result.p99 = percentile(sample.acquire_s, 99)
            result.worst = max(sample.acquire_s)
        time.sleep(0.5)  # let the resumed node run the commands queued while it was stopped
        result.keys_resumed = count_keys([inspect[victim]], names[label])
        results.append(result)
        for c in inspect:  # leave nothing for the next library to trip over
            for key in c.scan_iter(match=f"*{names[label]}*"):
                c.delete(key)
    if aio_manager is not None:
        destroy_aioredlock(loop, aio_manager, 2.0)
    for c in inspect:
        c.close()
    return results


def pause_attempts(run: Callable[[float, int | None], Sample], plan: Plan) -> Sample:
    """Run attempts until the time or attempt cap; failed attempts also get their latency."""
    total = Sample()
    started = time.perf_counter()
    while True:
        left = plan.pause_seconds - (time.perf_counter() - started)
        if left <= 0 or total.pairs + total.failures >= plan.pause_attempts:
            break
        t0 = time.perf_counter()
        one = run(0.0, 1)  # exactly one attempt (acquire, and release if acquired)
        if one.failures:  # latency of a failed acquire counts too (time until it gave up)
            one.acquire_s.append(time.perf_counter() - t0)
        total.pairs += one.pairs
        total.failures += one.failures
        total.acquire_s.extend(one.acquire_s)
    total.elapsed = time.perf_counter() - started
    return total
