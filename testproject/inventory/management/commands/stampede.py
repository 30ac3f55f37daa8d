"""``manage.py stampede``: many processes miss one cache key at the same moment.

``--processes`` worker processes ("spawn") wait at a barrier, then each asks the Redis cache
``demo`` for one report that takes ``--compute`` seconds to build, and nobody has built yet.

- ``--no-fill``: Django's own ``cache.get_or_set``. Every process misses, and every one builds
  the report: N computes of an expensive value, all at once (a cache stampede).
- default: ``django_redlock.cache.get_or_set``. One process builds it under a lock; the others
  wait on the lock, are woken by its release, and read the value it stored: one compute.

Each compute leaves a file in a temporary folder; the count of files is the number of computes.
"""

from __future__ import annotations

import os
import tempfile
import time
import uuid
from argparse import ArgumentParser
from multiprocessing.synchronize import Barrier
from pathlib import Path
from queue import Empty
from typing import Any

from django.core.management.base import BaseCommand, CommandError

from testproject.inventory.demo_run import SPAWN, WorkerProcesses, add_json_option, emit_result

CACHE = "demo"


def reader(
    key: str, fill: bool, compute_seconds: float, folder: str, barrier: Barrier, results: Any
) -> None:
    """One process: miss ``key`` together with the others, then report what it got."""
    from django.core.cache import caches

    from django_redlock.cache import get_or_set

    def compute() -> str:
        Path(folder, f"compute-{os.getpid()}").touch()
        time.sleep(compute_seconds)
        return f"report built by process {os.getpid()}"

    barrier.wait(timeout=60)
    started = time.monotonic()
    if fill:
        value = get_or_set(key, compute, 300, cache=CACHE)
    else:
        value = caches[CACHE].get_or_set(key, compute, 300)
    results.put((value, time.monotonic() - started))


class Command(BaseCommand):
    help = "N processes miss one cache key at once: computed once with the fill, N times without."

    def add_arguments(self, parser: ArgumentParser) -> None:
        parser.add_argument("--no-fill", action="store_true", help="Django's cache.get_or_set.")
        parser.add_argument("--processes", type=int, default=8, help="Processes missing (8).")
        parser.add_argument(
            "--compute", type=float, default=1.0, help="Seconds one compute takes (1.0)."
        )
        add_json_option(parser)

    def handle(self, *args: Any, **options: Any) -> None:
        count, compute = options["processes"], options["compute"]
        if not 1 <= count <= 64:
            raise CommandError("--processes must be from 1 to 64")
        if not 0 <= compute <= 30:
            raise CommandError("--compute must be from 0 to 30 seconds")
        fill = not options["no_fill"]
        key = f"stampede-report:{uuid.uuid4().hex[:8]}"
        barrier, results = SPAWN.Barrier(count), SPAWN.Queue()
        workers = WorkerProcesses()
        got: list[tuple[str, float]] = []
        with tempfile.TemporaryDirectory(prefix="stampede-") as folder:
            for _ in range(count):
                workers.add(reader, key, fill, compute, folder, barrier, results)
            started = time.monotonic()
            try:
                workers.start()
                for _ in range(count):
                    got.append(results.get(timeout=60 + 2 * compute * count))
            except Empty:
                raise CommandError(f"only {len(got)} of {count} processes answered") from None
            finally:
                workers.stop(grace=5)
            seconds = time.monotonic() - started
            computes = len(list(Path(folder).glob("compute-*")))
        values = {value for value, _ in got}
        waits = sorted(wait for _, wait in got)
        result = {
            "fill": fill,
            "processes": count,
            "computes": computes,
            "distinct_values": len(values),
            "slowest_reader_seconds": round(waits[-1], 3),
            "seconds": round(seconds, 2),
        }
        label = "with django_redlock.cache.get_or_set" if fill else "with cache.get_or_set"
        line = (
            f"stampede, {count} processes, {label}: {computes} compute(s), "
            f"{len(values)} distinct value(s) read, slowest reader {waits[-1]:.2f} s"
        )
        emit_result(self, line, result, options["json"])
