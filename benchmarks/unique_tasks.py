"""What a unique enqueue costs (docs/effects.md): prints a table.

For django-tasks (the database backend, SQLite in memory) and RQ (a redis-server of its own),
per enqueue, in one process, one lock node: the plain ``enqueue``; a unique enqueue of a new
key each time (mutex, marker read, send, marker write); a unique enqueue of a key whose task
is queued (mutex, marker read, the queued task fetched again, nothing sent).

    .venv/bin/python benchmarks/unique_tasks.py [--calls 500]

Starts its own redis-server processes on free loopback ports and stops them at the end.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def plain_body(key: str) -> None:
    """The plain task's body (never run; the name becomes the task, as ``@task()`` does)."""


def unique_body(key: str) -> None:
    """The unique task's body (never run; the name becomes the task)."""


def per_call(fn: Callable[[int], Any], calls: int) -> float:
    started = time.perf_counter()
    for i in range(calls):
        fn(i)
    return (time.perf_counter() - started) / calls


def median_of_three(fn: Callable[[int], Any], calls: int) -> float:
    return statistics.median(per_call(fn, calls) for _ in range(3))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--calls", type=int, default=500)
    args = parser.parse_args()

    from django_redlock.testing import RedisNodes

    with RedisNodes.start(2) as nodes:
        import django
        from django.conf import settings

        settings.configure(
            INSTALLED_APPS=["django_redlock", "django_tasks", "django_tasks_db"],
            DATABASES={"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"}},
            TASKS={"default": {"BACKEND": "django_tasks_db.DatabaseBackend"}},
            REDLOCK={"default": {"NODES": [nodes[0].url]}},
        )
        django.setup()
        from django.core.management import call_command
        from django_tasks import task
        from redis import Redis
        from rq import Queue

        from django_redlock.contrib.rq import enqueue_unique
        from django_redlock.contrib.tasks import unique_task

        call_command("migrate", verbosity=0)
        # the backend finds a task by its function's import path: the names are the tasks
        plain = task()(plain_body)
        unique = unique_task("bench:{key}")(task()(unique_body))
        globals().update(plain_body=plain, unique_body=unique)
        queue = Queue("bench", connection=Redis.from_url(nodes[1].url))
        run = str(time.monotonic())
        rows: list[tuple[str, float, float, float]] = []

        unique.enqueue("warm-up")
        plain_s = median_of_three(lambda i: plain.enqueue(f"p{i}"), args.calls)
        new_s = median_of_three(lambda i: unique.enqueue(f"{run}:{i}:{time.time()}"), args.calls)
        queued_s = median_of_three(lambda i: unique.enqueue("warm-up"), args.calls)
        rows.append(("django-tasks (db backend)", plain_s, new_s, queued_s))

        enqueue_unique(queue, time.sleep, 0, key="bench:rq:warm-up")
        plain_s = median_of_three(lambda i: queue.enqueue(time.sleep, 0), args.calls)
        new_s = median_of_three(
            lambda i: enqueue_unique(queue, time.sleep, 0, key=f"bench:rq:{time.time()}:{i}"),
            args.calls,
        )
        queued_s = median_of_three(
            lambda i: enqueue_unique(queue, time.sleep, 0, key="bench:rq:warm-up"), args.calls
        )
        rows.append(("RQ", plain_s, new_s, queued_s))
        queue.connection.close()

    print(f"{'queue':<28}{'plain enqueue':>16}{'unique, new key':>18}{'unique, queued':>18}")
    for label, plain_s, new_s, queued_s in rows:
        print(f"{label:<28}{plain_s * 1e6:>14.0f}us{new_s * 1e6:>16.0f}us{queued_s * 1e6:>16.0f}us")


if __name__ == "__main__":
    main()
