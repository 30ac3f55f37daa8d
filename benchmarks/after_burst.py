"""Hand-offs of one contended name after a burst spent the connection budget: a table.

``--shape burst`` (the default): a burst of ``--burst`` asyncio tasks (default 60, more than
the default ``MAX_CONNECTIONS`` of 50) each takes a name of its own, which leaves the whole
budget in idle lock connections. Then ``--waiters`` tasks take turns on one name, holding it
1 ms, for ``--seconds``: sections per second and the gap from one release to the next
holder's acquire (p50, p99). With this tree and with the tree of ``--ref`` (default
``main``), in turn, each in its own process, on 3 nodes; medians of ``--rounds`` rounds.
``--shape mixed``: no burst; ``--waiters`` sync threads and as many tasks on each of two
event loops take turns on one name, all on one connection budget (``--max-connections``,
e.g. 10).

    .venv/bin/python benchmarks/after_burst.py [--ref main] [--rounds 3] [--seconds 5]
    .venv/bin/python benchmarks/after_burst.py --shape mixed --max-connections 10

Starts its own redis-server processes on free loopback ports and stops them at the end.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.pool_cap import run_in_tree, tree_of  # noqa: E402

CHILD = r"""
import asyncio, json, sys, threading, time
import django
from django.conf import settings
urls, burst, waiters, seconds, cap = json.loads(sys.argv[1]), *map(float, sys.argv[2:6])
shape = sys.argv[6]
alias = {"NODES": urls, "KEY_PREFIX": f"burst{time.time_ns()}:", "TTL": 10.0}
if cap:
    alias["MAX_CONNECTIONS"] = int(cap)
settings.configure(REDLOCK={"default": alias}, INSTALLED_APPS=[], USE_TZ=True)
django.setup()
from django_redlock import locks
import django_redlock, os
assert django_redlock.__file__.startswith(os.environ["PYTHONPATH"]), django_redlock.__file__
manager = locks["default"]
gaps, released, guard = [], [None], threading.Lock()
end = [0.0]

def entered():
    with guard:
        if released[0] is not None:
            gaps.append(time.monotonic() - released[0])
        released[0] = None

def leaving():
    with guard:
        released[0] = time.monotonic()

async def awaiter():
    count = 0
    while time.monotonic() < end[0]:
        lease = await manager.aacquire("hot", timeout=30)
        entered()
        await asyncio.sleep(0.001)
        leaving()
        await lease.arelease()
        count += 1
    return count

def waiter(counts):
    count = 0
    while time.monotonic() < end[0]:
        lease = manager.acquire("hot", timeout=30)
        entered()
        time.sleep(0.001)
        leaving()
        lease.release()
        count += 1
    counts.append(count)

async def aburst():
    async def one(i):
        await (await manager.aacquire(f"burst:{i}", timeout=10)).arelease()
    await asyncio.gather(*(one(i) for i in range(int(burst))))

async def agroup():
    return sum(await asyncio.gather(*(awaiter() for _ in range(int(waiters)))))

if shape == "burst":  # asyncio: a burst, then the waiters
    async def measure():
        await aburst()
        end[0] = time.monotonic() + seconds
        return await agroup()
    total = asyncio.run(measure())
else:  # "mixed": sync threads and two event loops, each with the waiters, on one budget
    end[0] = time.monotonic() + seconds
    counts = []
    def loop():
        counts.append(asyncio.run(agroup()))
    threads = [threading.Thread(target=loop) for _ in range(2)]
    threads += [threading.Thread(target=waiter, args=(counts,)) for _ in range(int(waiters))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    total = sum(counts)
gaps.sort()
print(json.dumps([total / seconds, gaps[len(gaps) // 2] * 1e3, gaps[int(len(gaps) * 0.99)] * 1e3]))
"""


def run(
    tree: Path, urls: list[str], burst: int, waiters: int, seconds: float, cap: int, shape: str
) -> list[float]:
    args = (json.dumps(urls), str(burst), str(waiters), str(seconds), str(cap), shape)
    result: list[float] = run_in_tree(tree, CHILD, *args)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--ref", default="main")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--burst", type=int, default=60)
    parser.add_argument("--waiters", type=int, default=4)
    parser.add_argument("--shape", choices=("burst", "mixed"), default="burst")
    parser.add_argument("--max-connections", type=int, default=0, help="0: the default, 50")
    args = parser.parse_args()

    from django_redlock.testing import RedisNodes

    with tempfile.TemporaryDirectory() as tmp, RedisNodes.start(3) as nodes:
        contenders = [(args.ref, tree_of(args.ref, Path(tmp))), ("this tree", ROOT)]
        results: dict[str, list[list[float]]] = {name: [] for name, _ in contenders}
        for _ in range(args.rounds):
            for name, tree in contenders:
                results[name].append(
                    run(
                        tree,
                        nodes.urls,
                        args.burst,
                        args.waiters,
                        args.seconds,
                        args.max_connections,
                        args.shape,
                    )
                )
        cap = args.max_connections or "default"
        if args.shape == "burst":
            what = f"after a burst of {args.burst} tasks, {args.waiters} tasks on one name"
        else:
            what = f"{args.waiters} threads and {args.waiters} tasks on each of 2 loops, one name"
        print(
            f"{what}, 3 nodes, MAX_CONNECTIONS {cap} "
            f"(median of {args.rounds} rounds of {args.seconds:g} s)"
        )
        print("| contender | sections/s | gap p50 ms | gap p99 ms |")
        print("|---|---|---|---|")
        for name, _ in contenders:
            rate, p50, p99 = (statistics.median(r[i] for r in results[name]) for i in range(3))
            print(f"| {name} | {rate:.0f} | {p50:.1f} | {p99:.1f} |")


if __name__ == "__main__":
    main()
