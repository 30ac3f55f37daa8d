"""What a sentinel node and a cluster node cost against a plain node (docs/topologies.md):
three tables.

1. Acquire + release pairs, one thread, interleaved rounds: a plain URL node against a
   sentinel node naming the same master (target: sentinel <= 1.1x the plain node's time).
2. The same against a cluster node (the master of the alias's slot) and a single plain node.
3. 8 spawned processes, each on its own names, acquire + release for ``--seconds``: one alias
   pinned to one master, against one spread alias (no hash tag: its names over the cluster's
   masters) and three pinned aliases on the three masters: aggregate pairs/s.

    .venv/bin/python benchmarks/topologies.py [--pairs 3000] [--rounds 5] [--seconds 4]

Starts its own servers (a sentinel group: master, replica, 3 sentinels; a 3-master cluster;
a plain node) on free loopback ports and stops them by PID at the end.
"""

from __future__ import annotations

import argparse
import multiprocessing
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.primitives import median_rates  # noqa: E402


def spread_worker(redlock: dict[str, Any], aliases: list[str], index: int, seconds: float) -> int:
    """One process: acquire + release its own names, round-robin over ``aliases``."""
    import django
    from django.conf import settings

    settings.configure(INSTALLED_APPS=["django_redlock"], REDLOCK=redlock)
    django.setup()
    from django_redlock import locks

    managers = [locks[alias] for alias in aliases]
    for manager in managers:
        manager.acquire(f"warm:{index}", timeout=5).release()
    done, end = 0, time.monotonic() + seconds
    while time.monotonic() < end:
        manager = managers[done % len(managers)]
        manager.acquire(f"w{index}:{done % 50}", timeout=0).release()
        done += 1
    return done


def spread(redlock: dict[str, Any], aliases: list[str], seconds: float) -> float:
    """Aggregate pairs/s of 8 processes on distinct names."""
    with multiprocessing.get_context("spawn").Pool(8) as pool:
        counts = pool.starmap(spread_worker, [(redlock, aliases, i, seconds) for i in range(8)])
    return sum(counts) / seconds


def tags_on_each_master(cluster: Any) -> list[str]:
    """One hash tag per master of ``cluster`` (``{m0}:``, ...), each on a different master."""
    from django_redlock.nodes.cluster import slot_of

    found: dict[int, str] = {}
    for i in range(10_000):
        prefix = f"{{t{i}}}:"
        port = cluster.master_of(slot_of(prefix)).port
        found.setdefault(port, prefix)
        if len(found) == len(cluster.masters()):
            break
    return list(found.values())


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--pairs", type=int, default=3000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=4.0)
    args = parser.parse_args()

    from django_redlock.testing import RedisNodes
    from django_redlock.testing.cluster import ClusterGroup
    from django_redlock.testing.sentinel import SentinelGroup

    with (
        SentinelGroup.start() as group,
        ClusterGroup.start(3) as cluster,
        RedisNodes.start(1) as single,
    ):
        tags = tags_on_each_master(cluster)
        redlock: dict[str, Any] = {
            "plain": {"NODES": [group.master.url]},
            "sentinel": {"NODES": [group.node_setting()], "KEY_PREFIX": "s:"},
            "single": {"NODES": [single[0].url]},
            "cluster": {"NODES": [cluster.node_setting()], "KEY_PREFIX": tags[0]},
            "spread": {"NODES": [cluster.node_setting()], "KEY_PREFIX": "sp:"},
            **{
                f"master{i}": {"NODES": [cluster.node_setting()], "KEY_PREFIX": tag}
                for i, tag in enumerate(tags)
            },
        }
        import django
        from django.conf import settings

        settings.configure(INSTALLED_APPS=["django_redlock"], REDLOCK=redlock)
        django.setup()
        from django_redlock import locks

        def case(alias: str) -> Callable[[], object]:
            return lambda: locks[alias].acquire("bench:pair", timeout=0)

        sentinel = median_rates(
            {"plain": case("plain"), "sentinel": case("sentinel")}, args.pairs, args.rounds
        )
        clustered = median_rates(
            {"single": case("single"), "cluster": case("cluster")}, args.pairs, args.rounds
        )
        one_master = spread(redlock, ["master0"], args.seconds)
        three_masters = spread(redlock, [f"master{i}" for i in range(len(tags))], args.seconds)
        for master in cluster.masters():
            master.client().config_resetstat()
        spread_alias = spread(redlock, ["spread"], args.seconds)
        shares = [master_calls(master) for master in cluster.masters()]

    print(f"{'case (median of rounds)':<38}{'pairs/s':>10}{'time vs plain':>15}")
    for label, rate in sentinel.items():
        print(
            f"{label + ' node (same master)':<38}{rate:>10,.0f}{sentinel['plain'] / rate:>14.2f}x"
        )
    for label, rate in clustered.items():
        print(f"{label + ' node':<38}{rate:>10,.0f}{clustered['single'] / rate:>14.2f}x")
    print()
    print(f"8 processes on distinct names, {args.seconds} s")
    print(f"{'aliases':<38}{'pairs/s':>10}{'vs 1 master':>15}")
    print(f"{'1 alias, 1 cluster master':<38}{one_master:>10,.0f}{1:>14.2f}x")
    label = f"{len(tags)} aliases on {len(tags)} masters"
    print(f"{label:<38}{three_masters:>10,.0f}{three_masters / one_master:>14.2f}x")
    label = f"1 spread alias on {len(tags)} masters"
    print(f"{label:<38}{spread_alias:>10,.0f}{spread_alias / one_master:>14.2f}x")
    total = sum(shares) or 1
    print(
        "script calls per master in the spread run: "
        + ", ".join(f"{calls / total:.0%}" for calls in shares)
    )


def master_calls(master: Any) -> int:
    """Script calls (EVALSHA and EVAL) a master ran since its statistics were reset."""
    stats = master.client().info("commandstats")
    return sum(int(stats.get(f"cmdstat_{c}", {}).get("calls", 0)) for c in ("evalsha", "eval"))


if __name__ == "__main__":
    main()
