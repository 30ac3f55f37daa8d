"""What running a job under a lock costs (docs/jobs.md): prints a table.

1. ``@lock(...)``-decorated function vs the same plain function, called back to back in one
   process (one node; each call acquires, runs an empty body and releases).
2. ``manage.py redlock run NAME -- python -c pass`` vs ``python -c pass`` run directly, each a
   real process, one after the other.

    .venv/bin/python benchmarks/jobs_overhead.py [--calls 3000] [--runs 15]

Starts its own redis-server on a free loopback port and stops it at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def per_call(fn: object, calls: int) -> float:
    started = time.perf_counter()
    for i in range(calls):
        fn(i)  # type: ignore[operator]
    return (time.perf_counter() - started) / calls


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--calls", type=int, default=3000)
    parser.add_argument("--runs", type=int, default=15)
    args = parser.parse_args()

    from django_redlock.testing import RedisNodes

    with RedisNodes.start(1) as nodes:
        url = nodes[0].url
        import django
        from django.conf import settings

        settings.configure(INSTALLED_APPS=["django_redlock"], REDLOCK={"default": {"NODES": [url]}})
        django.setup()
        from django_redlock import lock

        def plain(n: int) -> int:
            return n

        locked = lock("bench:job:{0}", timeout=0)(plain)
        per_call(locked, 200)  # warm up connections and scripts
        plain_s = statistics.median(per_call(plain, args.calls) for _ in range(3))
        locked_s = statistics.median(per_call(locked, args.calls) for _ in range(3))

        env = {
            **os.environ,
            "DJANGO_SETTINGS_MODULE": "tests.support.subprocess_settings",
            "REDLOCK_JSON": json.dumps({"default": {"NODES": [url]}}),
            "PYTHONPATH": str(ROOT),
        }
        job = [sys.executable, "-c", "pass"]
        wrapped = [sys.executable, "-m", "django", "redlock", "run", "bench:cron", "--", *job]
        direct: list[float] = []
        under_lock: list[float] = []
        for _ in range(args.runs):  # interleaved, so both see the same machine
            for command, times in ((job, direct), (wrapped, under_lock)):
                started = time.perf_counter()
                subprocess.run(command, env=env, cwd=ROOT, check=True)
                times.append(time.perf_counter() - started)

    print(f"{'case':<40}{'plain':>12}{'under the lock':>16}{'overhead':>12}")
    print(
        f"{'function call (@lock, 1 node)':<40}{plain_s * 1e6:>10.1f}us{locked_s * 1e6:>14.1f}us"
        f"{(locked_s - plain_s) * 1e6:>10.1f}us"
    )
    d, w = statistics.median(direct), statistics.median(under_lock)
    label = "command (redlock run), median"
    print(f"{label:<40}{d * 1e3:>10.1f}ms{w * 1e3:>14.1f}ms{(w - d) * 1e3:>10.1f}ms")


if __name__ == "__main__":
    main()
