"""What one uncontended lock costs (docs/benchmarks.md, "The hot path"): a table, same run.

Per contender, acquire (one attempt) + release of free names, back to back, on 1 node and on
5 nodes: pairs/s; acquire p50; client CPU per pair (``time.process_time``); server CPU per
pair (the nodes' ``used_cpu_user`` + ``used_cpu_sys`` from ``INFO cpu``, summed over the
nodes); Python function calls per pair (``cProfile``, counted in a separate pass so the
profiler's cost stays out of the timings, with busy polling off so that it counts the work,
not the turns of a spin); Redis commands per pair and node (``INFO
commandstats``: those the scripts run, not the ``EVALSHA`` itself); the nodes' time inside
the scripts per pair (``INFO commandstats``: ``EVALSHA`` and ``EVAL``, summed over the nodes).

Contenders: this tree; the tree of each ``--ref`` (extracted with ``git archive``); raw
redis-py on 1 node (``SET NX PX`` + ``EVALSHA`` compare-and-delete, hiredis) and the
multiplexed raw fan-out on 5 (each command written to the five connections, then the five
replies read). Each contender runs in its own process, rounds interleave the contenders, and
the table shows the median over the rounds.

    .venv/bin/python benchmarks/hot_path.py [--ref 0f914f6] [--pairs 3000] [--rounds 5]
    .venv/bin/python benchmarks/hot_path.py --asyncio   # aacquire/arelease vs redis.asyncio

"this tree, busy poll off" is this tree with ``REDLOCK_BUSY_POLL=0`` (replies waited for in
``poll()`` at once): busy polling spends client CPU to get replies sooner.

Starts its own redis-server processes on free loopback ports and stops them at the end.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.pool_cap import tree_of  # noqa: E402

CHILD = r"""
import cProfile, json, os, pstats, sys, time
import redis

urls, pairs, kind = json.loads(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
clients = [redis.Redis.from_url(url) for url in urls]

def server_cpu():
    total = 0.0
    for client in clients:
        info = client.info("cpu")
        total += float(info["used_cpu_user"]) + float(info["used_cpu_sys"])
    return total

def commands():
    # commands the nodes ran (those inside scripts included), but INFO and the scripts' own
    # EVALSHA and EVAL: what the scripts (or raw redis-py) ask of Redis
    total = 0
    for client in clients:
        for name, stats in client.info("commandstats").items():
            if name not in ("cmdstat_info", "cmdstat_evalsha", "cmdstat_eval"):
                total += int(stats["calls"])
    return total

def script_usec():
    # the nodes' time inside EVALSHA and EVAL (the commands the scripts run included)
    total = 0
    for client in clients:
        for name, stats in client.info("commandstats").items():
            if name in ("cmdstat_evalsha", "cmdstat_eval"):
                total += int(stats["usec"])
    return total

asynchronous = kind.endswith("-async")
if asynchronous:
    kind = kind[: -len("-async")]
if kind.startswith("ours"):
    import django
    from django.conf import settings
    alias = {"NODES": urls, "KEY_PREFIX": "hot:", "NODE_TIMEOUT": 1.0}
    counting = {**alias, "KEY_PREFIX": "hotc:"}
    settings.configure(
        REDLOCK={"default": alias, "counting": counting}, INSTALLED_APPS=[], USE_TZ=True
    )
    django.setup()
    from django_redlock import locks
    import django_redlock, os
    assert django_redlock.__file__.startswith(os.environ["PYTHONPATH"]), django_redlock.__file__
    manager = locks["default"]
    if kind == "ours-nospin":  # REDLOCK_BUSY_POLL=0: every reply waited for in poll()
        manager.engine.state.busy_poll = 0.0
    # the counted pass spins for no reply: the work per pair, not how often a spin turned
    locks["counting"].engine.state.busy_poll = 0.0

    def acquire(name, manager=manager):
        return manager.acquire(name, timeout=0)

    def counted_acquire(name):
        return acquire(name, locks["counting"])

    def release(held):
        held.release()

    async def aacquire(name, manager=manager):
        return await manager.aacquire(name, timeout=0)

    async def acounted_acquire(name):
        return await aacquire(name, locks["counting"])

    async def arelease(held):
        await held.arelease()
else:  # the raw pairs every benchmark compares with (benchmarks/contenders.py, scale.py)
    sys.path.insert(0, os.environ["BENCH_ROOT"])
    from benchmarks.contenders import raw_apair, raw_pair
    from benchmarks.scale import raw_fanout_pair

    if asynchronous:
        if len(urls) != 1:
            raise SystemExit("raw redis.asyncio: one node only")
        atake, agive = raw_apair(urls[0], "raw:hot")

        async def aacquire(name):
            owner = await atake()
            if owner is None:
                raise SystemExit("the raw lock was not free")
            return owner

        acounted_acquire, arelease = aacquire, agive

    one = len(urls) == 1
    take, give = raw_pair(urls[0], "raw:hot") if one else raw_fanout_pair(urls, "raw:hot")

    def acquire(name):
        owner = take()
        if owner is None:
            raise SystemExit("the raw lock was not free")
        return owner

    release = give

if kind != "ours":
    counted_acquire = acquire
    if asynchronous:
        acounted_acquire = aacquire
times = []
counted = min(pairs, 1000)
profile = cProfile.Profile()


def timed():
    for i in range(300):  # warm up: connections, scripts, fence state
        release(acquire(f"warm:{i}"))
        release(counted_acquire(f"warm:{i}"))
    ran, scripted = commands(), script_usec()
    cpu, server, started = time.process_time(), server_cpu(), time.perf_counter()
    for i in range(pairs):
        before = time.perf_counter()
        held = acquire(f"t:{i}")
        times.append(time.perf_counter() - before)
        release(held)
    elapsed = time.perf_counter() - started
    measured = (
        time.process_time() - cpu, server_cpu() - server, commands() - ran, elapsed,
        script_usec() - scripted,
    )
    profile.enable()
    for i in range(counted):
        release(counted_acquire(f"p:{i}"))
    profile.disable()
    return measured


async def atimed():  # the same on an event loop (the INFO calls block it: outside the timings)
    for i in range(300):
        await arelease(await aacquire(f"warm:{i}"))
        await arelease(await acounted_acquire(f"warm:{i}"))
    ran, scripted = commands(), script_usec()
    cpu, server, started = time.process_time(), server_cpu(), time.perf_counter()
    for i in range(pairs):
        before = time.perf_counter()
        held = await aacquire(f"t:{i}")
        times.append(time.perf_counter() - before)
        await arelease(held)
    elapsed = time.perf_counter() - started
    measured = (
        time.process_time() - cpu, server_cpu() - server, commands() - ran, elapsed,
        script_usec() - scripted,
    )
    profile.enable()
    for i in range(counted):
        await arelease(await acounted_acquire(f"p:{i}"))
    profile.disable()
    return measured


if asynchronous:
    import asyncio

    cpu, server, ran, elapsed, scripted = asyncio.run(atimed())
else:
    cpu, server, ran, elapsed, scripted = timed()
ran = ran / pairs / len(clients)
calls = pstats.Stats(profile).total_calls / counted
times.sort()
print(json.dumps({
    "rate": pairs / elapsed,
    "p50": times[len(times) // 2] * 1e6,
    "cpu": cpu / pairs * 1e6,
    "server": server / pairs * 1e6,
    "calls": calls,
    "commands": ran,
    "scripts": scripted / pairs,
}))
"""


#: The row of this tree with ``REDLOCK_BUSY_POLL=0``.
NO_SPIN = "this tree, busy poll off"


def run(
    tree: Path | None, urls: list[str], pairs: int, spin: bool = True, asynchronous: bool = False
) -> dict[str, float]:
    """One contender's pass in a process of its own (``tree``: None for raw redis-py;
    ``spin``: False runs it with busy polling off; ``asynchronous``: on an event loop)."""
    path = [str(tree)] if tree is not None else []
    kind = "raw" if tree is None else ("ours" if spin else "ours-nospin")
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            CHILD,
            json.dumps(urls),
            str(pairs),
            kind + ("-async" if asynchronous else ""),
        ],
        capture_output=True,
        text=True,
        env={"PYTHONPATH": ":".join(path), "PATH": "/usr/bin:/bin", "BENCH_ROOT": str(ROOT)},
        # not the checkout: python -c puts the working directory first on sys.path
        cwd=tree or tempfile.gettempdir(),
    )
    if done.returncode:
        raise SystemExit(f"{tree or 'raw'}: {done.stderr}")
    result: dict[str, float] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--ref", action="append", default=[], help="a git ref to compare")
    parser.add_argument("--pairs", type=int, default=3000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument(
        "--asyncio",
        action="store_true",
        help="on an event loop (aacquire/arelease; raw redis.asyncio), one node only",
    )
    args = parser.parse_args()
    asynchronous = args.asyncio

    from django_redlock.testing import RedisNodes

    with tempfile.TemporaryDirectory() as tmp, RedisNodes.start(6) as nodes:
        contenders: list[tuple[str, Path | None]] = [("this tree", ROOT)]
        for ref in args.ref:
            contenders.append((ref, tree_of(ref, Path(tmp) / ref)))
        # busy polling trades client CPU for throughput: this tree without it too
        contenders.insert(1, (NO_SPIN, ROOT))
        print(
            f"uncontended acquire + release{' (asyncio)' if asynchronous else ''}, "
            f"median of {args.rounds} rounds of "
            f"{args.pairs} pairs (calls: cProfile, up to 1,000 pairs)"
        )
        print(
            "| nodes | contender | pairs/s | acquire p50 µs | client CPU µs/pair | "
            "server CPU µs/pair | in scripts µs/pair | Python calls/pair | "
            "Redis commands/pair/node | pairs/s vs raw | client CPU vs raw | server CPU vs raw |"
        )
        print("|---|---|---|---|---|---|---|---|---|---|---|---|")
        for count in (1,) if asynchronous else (1, 5):
            urls = nodes.urls[:1] if count == 1 else nodes.urls[1:]  # a fresh set each
            raw = "raw redis-py" if count == 1 else "raw fan-out"
            raw = "raw redis.asyncio" if asynchronous else raw
            every = [*contenders, (raw, None)]
            results: dict[str, list[dict[str, float]]] = {name: [] for name, _ in every}
            for _ in range(args.rounds):
                for name, tree in every:
                    spin = name != NO_SPIN
                    results[name].append(run(tree, urls, args.pairs, spin, asynchronous))
            median = {
                name: {key: statistics.median(r[key] for r in rows) for key in rows[0]}
                for name, rows in results.items()
            }
            for name, _ in every:
                m, r = median[name], median[raw]
                print(
                    f"| {count} | {name} | {m['rate']:,.0f} | {m['p50']:.0f} | {m['cpu']:.0f} | "
                    f"{m['server']:.0f} | {m['scripts']:.0f} | {m['calls']:.0f} | "
                    f"{m['commands']:.1f} | "
                    f"{m['rate'] / r['rate']:.2f}x | {m['cpu'] / r['cpu']:.2f}x | "
                    f"{m['server'] / r['server']:.2f}x |"
                )


if __name__ == "__main__":
    main()
