"""What the connection cap costs an uncontended lock (docs/production.md): a table.

Times ``--pairs`` acquire + release pairs of free names, sync and asyncio, on 1 and 3
nodes, with this tree (``MAX_CONNECTIONS`` 50, the default, and 1) and with the tree of
``--ref`` (default ``main``, before the cap), in the same run: each round runs every
contender in turn, in its own process, and the table shows the median over the rounds.

    .venv/bin/python benchmarks/pool_cap.py [--ref main] [--pairs 3000] [--rounds 5]

Starts its own redis-server processes on free loopback ports and stops them at the end.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tarfile
import tempfile
from io import BytesIO
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

CHILD = r"""
import asyncio, json, sys, time
import django
from django.conf import settings
urls, pairs, cap = json.loads(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
alias = {"NODES": urls, "KEY_PREFIX": "bench:", "NODE_TIMEOUT": 1.0}
if cap != "-":
    alias["MAX_CONNECTIONS"] = int(cap)
settings.configure(REDLOCK={"default": alias}, INSTALLED_APPS=[], USE_TZ=True)
django.setup()
from django_redlock import locks
import django_redlock, os
assert django_redlock.__file__.startswith(os.environ["PYTHONPATH"]), django_redlock.__file__
manager = locks["default"]
for i in range(200):  # warm up: connections, scripts
    manager.acquire(f"warm:{i}", timeout=0).release()
started = time.perf_counter()
for i in range(pairs):
    manager.acquire(f"s:{i}", timeout=0).release()
sync_us = (time.perf_counter() - started) / pairs * 1e6

async def run():
    for i in range(200):
        await (await manager.aacquire(f"awarm:{i}", timeout=0)).arelease()
    started = time.perf_counter()
    for i in range(pairs):
        await (await manager.aacquire(f"a:{i}", timeout=0)).arelease()
    return (time.perf_counter() - started) / pairs * 1e6

print(json.dumps([sync_us, asyncio.run(run())]))
"""


def tree_of(ref: str, into: Path) -> Path:
    """The ``django_redlock`` package of git ``ref``, extracted under ``into``."""
    archive = subprocess.run(
        ["git", "-C", str(ROOT), "archive", ref, "django_redlock"],
        check=True,
        capture_output=True,
    ).stdout
    with tarfile.open(fileobj=BytesIO(archive)) as tar:
        tar.extractall(into, filter="data")
    return into


def run_in_tree(tree: Path, child: str, *args: str) -> Any:
    """The JSON ``child`` (a script) prints last, run with ``args`` and the ``django_redlock``
    of ``tree`` (each contender in its own process)."""
    done = subprocess.run(
        [sys.executable, "-c", child, *args],
        capture_output=True,
        text=True,
        env={"PYTHONPATH": str(tree), "PATH": "/usr/bin:/bin"},
        cwd=tree,  # not the checkout: python -c puts the working directory first on sys.path
    )
    if done.returncode:
        raise SystemExit(f"{tree} {args}: {done.stderr}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def run(tree: Path, urls: list[str], pairs: int, cap: str) -> list[float]:
    result: list[float] = run_in_tree(tree, CHILD, json.dumps(urls), str(pairs), cap)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--ref", default="main")
    parser.add_argument("--pairs", type=int, default=3000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()

    from django_redlock.testing import RedisNodes

    with tempfile.TemporaryDirectory() as tmp, RedisNodes.start(4) as nodes:
        before = tree_of(args.ref, Path(tmp))
        contenders = [
            (f"{args.ref} (no cap)", before, "-"),
            ("this tree, MAX_CONNECTIONS=50", ROOT, "-"),
            ("this tree, MAX_CONNECTIONS=1", ROOT, "1"),
        ]
        print(f"uncontended acquire+release, µs per pair (median of {args.rounds} rounds)")
        print("| nodes | contender | sync | asyncio |")
        print("|---|---|---|---|")
        for count in (1, 3):
            urls = nodes.urls[:1] if count == 1 else nodes.urls[1:]  # a fresh set each
            results: dict[str, list[list[float]]] = {name: [] for name, _, _ in contenders}
            for _ in range(args.rounds):
                for name, tree, cap in contenders:
                    results[name].append(run(tree, urls, args.pairs, cap))
            for name, _, _ in contenders:
                sync = statistics.median(r[0] for r in results[name])
                aio = statistics.median(r[1] for r in results[name])
                print(f"| {count} | {name} | {sync:.0f} | {aio:.0f} |")


if __name__ == "__main__":
    main()
