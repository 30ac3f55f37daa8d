"""Processes handing one lock name to each other, and what each hand-off costs the nodes: a
table, same run (docs/benchmarks.md, "Woken waiters that lost the name").

Per contender and node count (1, 3 and 5 nodes), ``--workers`` processes (8) loop for
``--seconds`` (8): ``acquire(name, timeout=30)``, a critical section that reads and writes a
counter on a node of its own (``GET`` then ``SET``, as the anchors' harness does), release.
Printed: critical sections per second; script calls the nodes ran per section (``INFO
commandstats``: ``EVALSHA`` and ``EVAL``, summed over the nodes: every attempt, release,
registration and withdrawal sends one per node), so attempts that failed show as calls
beyond a plain acquire and release; the nodes' CPU per section; how long acquires waited
(p50, p99, max); lost increments (must be 0).

Contenders: this tree and the tree of each ``--ref`` (extracted with ``git archive``). Each
process runs one contender's tree; rounds interleave the contenders and the table shows the
median over the rounds.

    .venv/bin/python benchmarks/contended.py [--ref 509173e] [--rounds 3] [--seconds 8]

Starts its own redis-server processes on free loopback ports and stops them at the end.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.pool_cap import tree_of  # noqa: E402

CHILD = r"""
import json, logging, os, sys, time
import django
from django.conf import settings

urls, counter_url, start, stop = json.loads(sys.argv[1])
settings.configure(
    INSTALLED_APPS=["django_redlock"],
    DATABASES={},
    USE_TZ=True,
    REDLOCK={"default": {"NODES": urls, "KEY_PREFIX": "contended:", "NODE_TIMEOUT": 0.05}},
)
django.setup()
logging.disable(logging.CRITICAL)
import redis
from django_redlock import locks

manager = locks["default"]
counter = redis.Redis.from_url(counter_url)
counter.ping()
manager.acquire(f"warm-{os.getpid()}", timeout=0).release()  # connected, scripts loaded
time.sleep(max(0.0, start - time.time()))
waits, sections = [], 0
while time.time() < stop:
    began = time.monotonic()
    lease = manager.acquire("hot", ttl=30.0, timeout=30.0)
    waits.append(time.monotonic() - began)
    value = int(counter.get("counter") or 0)  # deliberately not atomic: a lost update shows
    counter.set("counter", value + 1)
    lease.release()
    sections += 1
print(json.dumps({"sections": sections, "waits": waits}))
"""


def _scripts_and_cpu(clients: list) -> tuple[int, float]:  # type: ignore[type-arg]
    calls, cpu = 0, 0.0
    for client in clients:
        stats = client.info("commandstats")
        for command in ("evalsha", "eval"):
            calls += int(stats.get(f"cmdstat_{command}", {}).get("calls", 0))
        info = client.info("cpu")
        cpu += float(info["used_cpu_user"]) + float(info["used_cpu_sys"])
    return calls, cpu


def run(tree: Path, urls: list[str], counter_url: str, workers: int, seconds: float) -> dict:  # type: ignore[type-arg]
    """One contender's pass: ``workers`` processes of ``tree`` on ``urls``."""
    import redis

    clients = [redis.Redis.from_url(url) for url in urls]
    counter = redis.Redis.from_url(counter_url)
    counter.delete("counter")
    for client in clients:
        client.flushall()
    start = time.time() + 2.0  # every process connected and warm by then
    stop = start + seconds
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", CHILD, json.dumps([urls, counter_url, start, stop])],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={"PYTHONPATH": str(tree), "PATH": "/usr/bin:/bin"},
            cwd=tree,  # not the checkout: python -c puts the working directory first
        )
        for _ in range(workers)
    ]
    time.sleep(max(0.0, start - time.time()))
    calls0, cpu0 = _scripts_and_cpu(clients)
    outs = []
    for proc in procs:
        out, err = proc.communicate(timeout=seconds + 120)
        if proc.returncode:
            raise SystemExit(f"{tree}: {err}")
        outs.append(json.loads(out.strip().splitlines()[-1]))
    calls1, cpu1 = _scripts_and_cpu(clients)
    sections = sum(o["sections"] for o in outs)
    waits = sorted(w for o in outs for w in o["waits"])
    return {
        "rate": sections / seconds,
        "scripts": (calls1 - calls0) / max(sections, 1),
        "server": (cpu1 - cpu0) / max(sections, 1) * 1e6,
        "p50": waits[len(waits) // 2] * 1e3,
        "p99": waits[int(len(waits) * 0.99)] * 1e3,
        "max": waits[-1] * 1e3,
        "lost": sections - int(counter.get("counter") or 0),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--ref", action="append", default=[], help="a git ref to compare")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--workers", type=int, default=8)
    parser.add_argument("--nodes", default="1,3,5", help="node counts, comma-separated")
    args = parser.parse_args()

    from django_redlock.testing import RedisNodes

    with tempfile.TemporaryDirectory() as tmp, RedisNodes.start(6) as nodes:
        contenders: list[tuple[str, Path]] = [("this tree", ROOT)]
        for ref in args.ref:
            contenders.append((ref, tree_of(ref, Path(tmp) / ref)))
        counter_url = nodes.urls[5]
        print(
            f"{args.workers} processes, one name, median of {args.rounds} rounds of "
            f"{args.seconds:g} s"
        )
        print(
            "| nodes | contender | sections/s | script calls/section | server CPU µs/section "
            "| wait p50 ms | wait p99 ms | wait max ms | lost updates |"
        )
        print("|---|---|---|---|---|---|---|---|---|")
        for count in (int(n) for n in args.nodes.split(",")):
            urls = nodes.urls[:count]
            results: dict[str, list[dict]] = {name: [] for name, _ in contenders}  # type: ignore[type-arg]
            for _ in range(args.rounds):
                for name, tree in contenders:
                    results[name].append(run(tree, urls, counter_url, args.workers, args.seconds))
            for name, _ in contenders:
                rows = results[name]
                m = {key: statistics.median(r[key] for r in rows) for key in rows[0]}
                print(
                    f"| {count} | {name} | {m['rate']:,.0f} | {m['scripts']:.1f} | "
                    f"{m['server']:.0f} | {m['p50']:.1f} | {m['p99']:.1f} | {m['max']:.0f} | "
                    f"{sum(r['lost'] for r in rows)} |"
                )


if __name__ == "__main__":
    main()
