"""What ``LockedTask`` costs per Celery task: prints a table.

A real worker (``celery worker --pool=prefork --concurrency=2``) runs two no-op tasks from
``tests/jobs/celery_app.py``: ``plain_noop`` (a plain task) and ``locked_noop`` (``LockedTask``,
one lock name per call, so nothing ever waits: the cost of acquire + auto-extend thread +
release). Both are measured in the same run, in interleaved rounds:

1. throughput: send a batch of ``--tasks`` tasks, wait for every result; time per task;
2. latency: ``--sequential`` tasks one after the other (send, wait for the result, next).

    .venv/bin/python benchmarks/celery_overhead.py [--tasks 300] [--rounds 3] [--sequential 100]

Starts two redis-server processes on free loopback ports (broker + results, locks) and the
worker, and stops all of them at the end (the worker by PID: SIGTERM, then SIGKILL).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def batch(task: Any, count: int, offset: int) -> float:
    """Seconds per task for ``count`` tasks sent at once and all awaited."""
    from celery.result import ResultSet

    started = time.perf_counter()
    results = ResultSet([task.delay(offset + i) for i in range(count)])
    values = results.get(timeout=120)
    elapsed = time.perf_counter() - started
    assert sorted(values) == list(range(offset, offset + count)), "a task was lost or skipped"
    return elapsed / count


def sequential(task: Any, count: int, offset: int) -> float:
    """Median seconds from send to result, one task at a time."""
    times = []
    for i in range(count):
        started = time.perf_counter()
        assert task.delay(offset + i).get(timeout=30) == offset + i
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tasks", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--sequential", type=int, default=100)
    args = parser.parse_args()

    from django_redlock.testing import RedisNodes

    with RedisNodes.start(2) as nodes, tempfile.TemporaryDirectory() as scratch:
        broker = nodes[0].url.rsplit("/", 1)[0]
        redlock = {"default": {"NODES": [nodes[1].url], "KEY_PREFIX": "bench:"}}
        os.environ.update(
            DJANGO_SETTINGS_MODULE="tests.support.subprocess_settings",
            REDLOCK_JSON=json.dumps(redlock),
            REDLOCK_CELERY_REDIS=broker,
            SQLITE_PATH=str(Path(scratch) / "bench.sqlite3"),
        )
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        from django_redlock import locks
        from testproject.inventory.demo_run import stop_group
        from tests.jobs.celery_app import app, locked_noop, plain_noop  # sets Django up

        argv = [sys.executable, "-m", "celery", "-A", "tests.jobs.celery_app", "worker"]
        argv += ["--pool=prefork", "--concurrency=2", "--loglevel=warning"]
        argv += ["--without-heartbeat", "--without-gossip", "--without-mingle"]
        log = Path(scratch) / "worker.log"
        with log.open("wb") as out:
            worker = subprocess.Popen(
                argv, env=env, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT,
                start_new_session=True,
            )  # fmt: skip
        try:
            deadline = time.monotonic() + 30
            while not app.control.ping(timeout=0.3):
                if worker.poll() is not None or time.monotonic() > deadline:
                    sys.exit(f"the worker did not start:\n{log.read_text()}")
            for task in (plain_noop, locked_noop):  # warm up connections and scripts
                batch(task, 50, 0)
            throughput: dict[str, list[float]] = {"plain": [], "locked": []}
            latency: dict[str, list[float]] = {"plain": [], "locked": []}
            offset = 1000
            for _ in range(args.rounds):  # interleaved, so both see the same machine
                for label, task in (("plain", plain_noop), ("locked", locked_noop)):
                    throughput[label].append(batch(task, args.tasks, offset))
                    offset += args.tasks
                    latency[label].append(sequential(task, args.sequential, offset))
                    offset += args.sequential
            app.close()
            locks.reset()
        finally:
            stop_group(worker, grace=10)

    print(f"Celery {_version('celery')}, prefork worker, concurrency 2, {os.cpu_count()} CPUs")
    print(
        f"{'case (median of rounds)':<44}{'plain':>10}{'LockedTask':>12}{'overhead':>11}"
        f"{'ratio':>8}"
    )
    rows = (
        (f"throughput: {args.tasks} tasks at once, per task", throughput),
        (f"latency: send -> result, {args.sequential} one by one", latency),
    )
    for label, values in rows:
        plain, locked = statistics.median(values["plain"]), statistics.median(values["locked"])
        print(
            f"{label:<44}{plain * 1e3:>8.2f}ms{locked * 1e3:>10.2f}ms"
            f"{(locked - plain) * 1e3:>9.2f}ms{locked / plain:>7.2f}x"
        )


def _version(name: str) -> str:
    from importlib.metadata import version

    return version(name)


if __name__ == "__main__":
    main()
