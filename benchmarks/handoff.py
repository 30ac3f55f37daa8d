"""The contended scenario: worker processes hand one lock name to each other."""

from __future__ import annotations

import contextlib
import itertools
import math
import multiprocessing as mp
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from benchmarks.common import (
    HEALTHY_SOCKET_TIMEOUT,
    NODE_TIMEOUT,
    TTL,
    describe,
    quiet_logging,
    redis_client,
    setup_django,
)
from benchmarks.contenders import manager_pair
from benchmarks.loops import SyncPair
from benchmarks.scenarios import Plan

#: (label, kind, nodes) of each library in the contended scenario, in the order they run.
CONTENDED_LOCKS: tuple[tuple[str, str, int], ...] = (
    ("django-redlock", "ours-1", 1),
    ("django-redlock 5 nodes", "ours-5", 5),
    ("redis-py Lock", "redis-py-lock", 1),
    ("python-redis-lock", "python-redis-lock", 1),
    ("pottery", "pottery-5", 5),
)


@dataclass
class ContendedResult:
    label: str
    nodes: int
    seconds: float = 0.0
    sections: int = 0
    to_other: list[float] = field(default_factory=list)  # hand-off latencies, seconds
    to_same: int = 0
    per_worker: list[int] = field(default_factory=list)
    overlaps: int = 0
    failed_acquires: int = 0
    note: str = ""

    @property
    def rate(self) -> float:
        return self.sections / self.seconds if self.seconds else 0.0

    @property
    def other_share(self) -> float | None:
        total = len(self.to_other) + self.to_same
        return len(self.to_other) / total if total else None

    @property
    def fairness(self) -> float | None:
        """max/min acquisitions per worker; inf when a worker starved completely."""
        if not self.per_worker or max(self.per_worker) == 0:
            return None
        low = min(self.per_worker)
        return math.inf if low == 0 else max(self.per_worker) / low


def _critical_section() -> int:
    return sum(range(64))


def _blocking_lock(kind: str, url1: str, urls5: Sequence[str], name: str) -> SyncPair:
    """An acquire that waits (up to 30 s) and its release, for one worker process."""
    if kind.startswith("ours"):
        setup_django(url1, urls5)
        from django_redlock import locks
        from django_redlock.exceptions import LockNotAcquired

        manager = locks["one" if kind == "ours-1" else "five"]
        # Warm up: connect, load scripts and start the release listener (a waiting attempt).
        warm = f"{name}-warm-{os.getpid()}"
        lease = manager.acquire(warm, ttl=TTL, timeout=0)
        with contextlib.suppress(LockNotAcquired):
            manager.acquire(warm, ttl=TTL, timeout=0.05)
        lease.release()
        return manager_pair(manager, name, 30)
    if kind == "redis-py-lock":
        client = redis_client(url1, HEALTHY_SOCKET_TIMEOUT)
        client.ping()

        def acquire_rp() -> Any:
            lock = client.lock(name, timeout=TTL, blocking_timeout=30)
            return lock if lock.acquire() else None

        return acquire_rp, lambda lock: lock.release()
    if kind == "python-redis-lock":
        import redis_lock

        client = redis_client(url1, HEALTHY_SOCKET_TIMEOUT)
        client.ping()

        def acquire_prl() -> Any:
            lock = redis_lock.Lock(client, name, expire=TTL)
            # python-redis-lock refuses a wait longer than the lock's expiry
            return lock if lock.acquire(blocking=True, timeout=TTL) else None

        return acquire_prl, lambda lock: lock.release()
    if kind == "pottery-5":
        from pottery import Redlock

        masters = {redis_client(u, NODE_TIMEOUT) for u in urls5}
        for m in masters:
            m.ping()

        def acquire_pot() -> Any:
            lock = Redlock(key=name, masters=masters, auto_release_time=TTL)
            return lock if lock.acquire(timeout=30) else None

        return acquire_pot, lambda held: held.release()
    raise ValueError(f"unknown kind {kind!r}")


def contended_worker(
    kind: str,
    url1: str,
    urls5: list[str],
    name: str,
    index: int,
    ready: Any,
    go: Any,
    window: Any,
    out: Any,
) -> None:
    """One of the contending processes: report (acquired_at, released_at) of every hold."""
    quiet_logging("pottery")
    try:
        acquire, release = _blocking_lock(kind, url1, urls5, name)
    except Exception as exc:
        ready.put((index, describe(exc)))
        return
    ready.put((index, ""))
    go.wait()
    start, end = window[0], window[1]
    holds: list[tuple[float, float]] = []
    failed = 0
    error = ""
    clock = time.monotonic
    try:
        while True:
            handle = acquire()
            acquired_at = clock()
            if not handle:
                failed += 1
                if acquired_at >= end:
                    break
                continue
            if acquired_at >= end:
                release(handle)
                break
            _critical_section()
            released_at = clock()
            release(handle)
            if acquired_at >= start:
                holds.append((acquired_at, released_at))
    except Exception as exc:  # reported in the table; the others go on until the end
        error = describe(exc)
    out.put((index, holds, failed, error))


def contended(
    label: str, kind: str, nodes_used: int, url1: str, urls5: list[str], plan: Plan, workers: int
) -> ContendedResult:
    ctx = mp.get_context("spawn")
    ready, out = ctx.Queue(), ctx.Queue()
    go = ctx.Event()
    window = ctx.Array("d", [0.0, 0.0])
    name = f"bench-contended-{kind}"
    procs = [
        ctx.Process(
            target=contended_worker,
            args=(kind, url1, urls5, name, i, ready, go, window, out),
            daemon=True,
        )
        for i in range(workers)
    ]
    result = ContendedResult(label, nodes_used)
    for p in procs:
        p.start()
    try:
        errors = [ready.get(timeout=120)[1] for _ in procs]
        if any(errors):
            go.set()
            result.note = "failed: " + next(e for e in errors if e)
            return result
        time.sleep(0.3)  # let the workers' background threads settle
        warm = 0.5 if plan.contended_seconds > 3 else 0.25
        now = time.monotonic()
        window[0], window[1] = now + warm, now + warm + plan.contended_seconds
        go.set()
        holds: list[tuple[float, float, int]] = []
        per_worker = [0] * workers
        for _ in procs:
            index, worker_holds, failed, error = out.get(timeout=plan.contended_seconds + 90)
            if error and not result.note:
                result.note = f"worker error: {error}"
            per_worker[index] = len(worker_holds)
            result.failed_acquires += failed
            holds.extend((a, r, index) for a, r in worker_holds)
        for p in procs:
            p.join(timeout=10)
    finally:
        for p in procs:
            if p.is_alive():
                p.terminate()  # by PID: only the processes started here
                p.join(timeout=5)
    holds.sort()
    result.seconds = plan.contended_seconds
    result.sections = len(holds)
    result.per_worker = per_worker
    for (_, released, who), (acquired, _, nxt) in itertools.pairwise(holds):
        if acquired < released:
            result.overlaps += 1
        if nxt == who:
            result.to_same += 1
        else:
            result.to_other.append(acquired - released)
    return result
