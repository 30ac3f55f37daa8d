"""What the lock-order checker costs per lock block (docs/production.md): prints a table.

One process enters and leaves an uncontended ``with manager.lock(name, timeout=0)`` block on
one node, back to back, in interleaved and rotated rounds of these cases:

1. ``before``: ``LockManager`` as it was before the checker (its ``manager.py`` loaded from
   the git commit given by ``--base``; the block is today's, with its one ``check_order``
   test), so the cost of the checker's code when off shows against no code at all;
2. ``off``: ``REDLOCK_CHECK_ORDER = False``;
3. ``on``: the checker on, no other lock held (a shape is computed, nothing is recorded);
4. each of the three again inside an outer block held for the whole round: with the checker
   on, the inner block's edge (outer shape -> inner shape) is known after its first round, so
   this is the steady cost of a nested lock (a dict lookup per held lease).

pairs/s is the median over the rounds; "cost" is ``before``'s pairs/s over the case's; "CPU
us/block" is this process's CPU time per block (``time.process_time()``).

    .venv/bin/python benchmarks/order_checker.py [--blocks 1000] [--rounds 15] [--base REF]

Starts its own redis-server on a free loopback port and stops it at the end.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def manager_before(base: str) -> type:
    """``LockManager`` from ``django_redlock/locking/manager.py`` at ``base`` (a git ref)."""
    source = subprocess.run(
        ["git", "show", f"{base}:django_redlock/locking/manager.py"],
        cwd=ROOT,
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    name = "django_redlock.locking._manager_before"
    spec = importlib.util.spec_from_loader(name, loader=None)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    module.__package__ = "django_redlock.locking"
    sys.modules[name] = module
    exec(compile(source, f"{base}:manager.py", "exec"), module.__dict__)
    cls: type = module.LockManager
    return cls


def run_blocks(manager: Any, blocks: int, offset: int) -> None:
    for i in range(offset, offset + blocks):
        with manager.lock(f"bench:order:{i}", timeout=0):
            pass


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--blocks", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--base", default="16bc7a4", help="git ref before the checker")
    args = parser.parse_args()

    from django_redlock.testing import RedisNodes

    with RedisNodes.start(1) as nodes:
        import django
        from django.conf import settings

        settings.configure(
            INSTALLED_APPS=["django_redlock"],
            REDLOCK={"default": {"NODES": nodes.urls, "KEY_PREFIX": "bench:"}},
            REDLOCK_CHECK_ORDER=False,
        )
        django.setup()
        from django_redlock import locks

        current = locks["default"]
        old = manager_before(args.base)(current.config, current.engine, current.shards)
        old.check_order = False  # today's block reads it (the one test it makes)
        on = locks["default"].__class__(current.config, current.engine, current.shards)
        on.check_order = True
        managers = {"before": old, "off": current, "on": on}
        cases = [(m, outer) for outer in (False, True) for m in managers]
        results: dict[tuple[str, bool], list[float]] = {}
        cpu_results: dict[tuple[str, bool], list[float]] = {}
        offset = 0
        for manager in managers.values():
            run_blocks(manager, 300, offset)  # warm up connections and scripts
            offset += 300
        for round_ in range(args.rounds):  # interleaved and rotated: same machine for all
            shift = round_ % len(cases)
            for name, outer in cases[shift:] + cases[:shift]:
                manager = managers[name]
                with contextlib.ExitStack() as stack:
                    if outer:
                        stack.enter_context(manager.lock(f"bench:outer:{name}", timeout=0))
                    started, cpu = time.perf_counter(), time.process_time()
                    run_blocks(manager, args.blocks, offset)
                    rate = args.blocks / (time.perf_counter() - started)
                    cpu_us = (time.process_time() - cpu) / args.blocks * 1e6
                offset += args.blocks
                results.setdefault((name, outer), []).append(rate)
                cpu_results.setdefault((name, outer), []).append(cpu_us)

    header = f"{'case':<28}{'blocks/s':>10}{'us/block':>10}{'cost':>8}"
    print(f"{header}{'CPU us/block':>14}{'CPU cost':>10}")
    for outer in (False, True):
        bare = statistics.median(results[("before", outer)])
        bare_cpu = statistics.median(cpu_results[("before", outer)])
        for name in managers:
            rate = statistics.median(results[(name, outer)])
            cpu = statistics.median(cpu_results[(name, outer)])
            label = f"{name}{', in an outer block' if outer else ''}"
            print(
                f"{label:<28}{rate:>10.0f}{1e6 / rate:>10.1f}{bare / rate:>7.2f}x"
                f"{cpu:>14.1f}{cpu / bare_cpu:>9.2f}x"
            )


if __name__ == "__main__":
    main()
