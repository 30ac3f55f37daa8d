"""What unique tokens cost leases of different names that race on the nodes: a table.

``--procs`` processes (default 4: two per core here) lock names of their own
(``timeout=0``: a refused attempt shows) on 3 and 5 nodes, for ``--seconds`` each round, in
two shapes: "steady" (each process locks and releases back to back) and "burst" (every
process attempts at the same wall-clock tick, every 5 ms, so that their attempts reach the
nodes in different orders). Kinds: plain locks, or a mix (locks, permits of a 4-permit
semaphore, read leases, ``lock_many`` of two names).

Columns: leases granted per second (all processes); attempts refused (``timeout=0``; nobody
else held those names, so each is a loss of availability); tokens handed to two leases at once
(counted over every lease granted in the round: two leases with one token break the fencing
rule that equal tokens mean the same lease); how fast the counters grew, in tokens per
millisecond (the clock floor of docs/algorithm.md needs far fewer than 1,024). Contenders:
this tree, and the tree of ``--ref`` (extracted with ``git archive``), in the same run;
rounds interleave them and the table shows the median of the rates and the sum of the
counts.

    .venv/bin/python benchmarks/token_races.py [--ref HEAD~1] [--procs 4] [--seconds 5]

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
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.pool_cap import tree_of  # noqa: E402

CHILD = r"""
import json, os, sys, time
import django
from django.conf import settings
urls, me, shape, kinds, start, seconds, prefix = json.loads(sys.argv[1])
alias = {"NODES": urls, "KEY_PREFIX": prefix, "NODE_TIMEOUT": 1.0, "TTL": 10.0}
settings.configure(REDLOCK={"default": alias}, INSTALLED_APPS=[], USE_TZ=True)
django.setup()
from django_redlock import locks
from django_redlock.exceptions import LockNotAcquired
import django_redlock
assert django_redlock.__file__.startswith(os.environ["PYTHONPATH"]), django_redlock.__file__
manager = locks["default"]
for i in range(50):  # connections, scripts
    manager.acquire(f"warm:{me}:{i}", timeout=0).release()

def attempt(i):
    kind = kinds[i % len(kinds)]
    name = f"{me}:{i % 64}"
    if kind == "lock":
        block = manager.lock(name, timeout=0)
    elif kind == "permit":
        block = manager.semaphore(f"sem:{name}", 4, timeout=0)
    elif kind == "read":
        block = manager.read_lock(f"rw:{name}", timeout=0)
    else:
        block = manager.lock_many([f"m1:{name}", f"m2:{name}"], timeout=0)
    with block as held:
        return list(held.tokens.values()) if hasattr(held, "tokens") else [held.token]

tokens, refused, i = [], 0, 0
while time.time() < start:
    time.sleep(0.0005)
ends = start + seconds
tick = start
while time.time() < ends:
    if shape == "burst":
        tick += 0.005
        while time.time() < tick:
            pass
    try:
        tokens += attempt(i)
    except LockNotAcquired:
        refused += 1
    i += 1
print(json.dumps([i - refused, refused, tokens]))
"""

KINDS = {"lock": ["lock"], "mix": ["lock", "permit", "read", "many"]}


def run(tree: Path, urls: list[str], procs: int, shape: str, kinds: str, seconds: float) -> list:
    """One round of ``procs`` processes; returns [granted/s, refused, duplicate tokens,
    counter growth per ms]."""
    start = time.time() + 2.0  # every process connected and warm by then
    prefix = f"races:{time.time_ns()}:"
    children = [
        subprocess.Popen(
            [
                sys.executable,
                "-c",
                CHILD,
                json.dumps([urls, f"p{n}", shape, KINDS[kinds], start, seconds, prefix]),
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={"PYTHONPATH": str(tree), "PATH": "/usr/bin:/bin"},
            cwd=tree,
        )
        for n in range(procs)
    ]
    granted = refused = 0
    tokens: Counter[int] = Counter()
    for child in children:
        out, err = child.communicate()
        if child.returncode:
            raise SystemExit(f"{tree}: {err}")
        done = json.loads(out.strip().splitlines()[-1])
        granted, refused = granted + done[0], refused + done[1]
        tokens.update(done[2])
    shared = sum(1 for count in tokens.values() if count > 1)
    growth = (max(tokens) - min(tokens)) / seconds / 1000 if tokens else 0.0
    return [granted / seconds, refused, shared, growth]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--ref", default="HEAD")
    parser.add_argument("--procs", type=int, default=4)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()

    from django_redlock.testing import RedisNodes

    with tempfile.TemporaryDirectory() as tmp, RedisNodes.start(5) as nodes:
        before = tree_of(args.ref, Path(tmp))
        contenders = [(args.ref, before), ("this tree", ROOT)]
        print(
            f"{args.procs} processes, names of their own, timeout=0; "
            f"{args.rounds} rounds of {args.seconds:g} s (rates: median; counts: sum)"
        )
        print("| nodes | shape | kinds | contender | granted/s | refused | shared tokens |"
              " tokens/ms |")  # fmt: skip
        print("|---|---|---|---|---|---|---|---|")
        for count in (3, 5):
            for shape in ("steady", "burst"):
                for kinds in ("lock", "mix"):
                    results: dict[str, list[list]] = {name: [] for name, _ in contenders}
                    for _ in range(args.rounds):
                        for name, tree in contenders:
                            got = run(tree, nodes.urls[:count], args.procs, shape, kinds,
                                      args.seconds)  # fmt: skip
                            results[name].append(got)
                    for name, _ in contenders:
                        rate = statistics.median(r[0] for r in results[name])
                        refused = sum(r[1] for r in results[name])
                        shared = sum(r[2] for r in results[name])
                        growth = statistics.median(r[3] for r in results[name])
                        print(f"| {count} | {shape} | {kinds} | {name} | {rate:,.0f} | "
                              f"{refused} | {shared} | {growth:.1f} |")  # fmt: skip


if __name__ == "__main__":
    main()
