"""The other primitives under faults (docs/primitives.md): ``lock_many`` carts in the shop workload
with
nodes paused and a node restarted empty, judged by the fault suites' oracles; a semaphore's
"at most N holders" with 8 processes while nodes are paused and one restarts empty."""

from __future__ import annotations

import contextlib
import random
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from django_redlock.testing import RedisNode, RedisNodes
from tests.faults.conftest import SEEDS, TTL, Shop, assert_all_oracles, assert_data_oracles
from tests.support import engine_workers as workers
from tests.support.processes import PROCESSES
from tests.support.shop_workload import WorkerPool, overlap_anomalies, token_anomalies

Nodes = Callable[..., RedisNodes]


def every(interval: float, action: Callable[[], Any], seconds: float) -> int:
    deadline, count = time.monotonic() + seconds, 0
    while time.monotonic() < deadline:
        action()
        count += 1
        time.sleep(interval)
    return count


#: The key ``pauses_and_a_restart`` sets on its ``flag`` node once its planned faults are
#: done: the workers go on until it exists, so a fast workload still meets every fault.
FAULTS_DONE = "faults-done"


@contextlib.contextmanager
def pauses_and_a_restart(
    nodes: RedisNodes, seed: int, flag: RedisNode | None = None
) -> Iterator[list[str]]:
    """While the block runs, pause a random node for 0.15 s every 0.3 s, and kill node 0 and
    restart it empty after the sixth pause; two pauses after the restart, set
    :data:`FAULTS_DONE` on ``flag``. Yields the list of faults done so far."""
    stop = threading.Event()
    faults: list[str] = []

    def chaos() -> None:
        rng = random.Random(seed)
        while not stop.is_set():
            victim = nodes[rng.randrange(len(nodes))]
            victim.pause()
            faults.append("pause")
            time.sleep(0.15)
            victim.resume()
            if len(faults) == 6:
                nodes[0].restart(keep_data=False)
                faults.append("restart")
            if len(faults) == 9 and flag is not None:
                flag.client().set(FAULTS_DONE, 1)
            time.sleep(0.15)

    thread = threading.Thread(target=chaos)
    thread.start()
    try:
        yield faults
    finally:
        stop.set()
        thread.join(10)
        for node in nodes:
            if node.is_paused:
                node.resume()


@pytest.mark.parametrize("seed", SEEDS)
def test_carts_with_nodes_paused_at_random(
    shop: Shop, redis_node_factory: Nodes, report: Callable[..., None], seed: int
) -> None:
    """8 workers sell carts of two products (lock_many + claim_many) while 1 or 2 of 5 nodes
    are SIGSTOPped and resumed at random: every oracle holds (stock conserved, purchase log in
    token order, no overlapping sections per product, tokens in real-time order)."""
    nodes = redis_node_factory(5)
    rng = random.Random(seed)
    rounds: list[int] = []

    def chaos(pool: WorkerPool) -> None:
        def flip() -> None:
            for node in nodes:
                if node.is_paused:
                    node.resume()
            for i in rng.sample(range(5), rng.choice((1, 2))):
                nodes[i].pause()

        try:
            rounds.append(every(0.3, flip, 2.0))
        finally:
            for node in nodes:
                if node.is_paused:
                    node.resume()

    run = shop.run(shop.settings(nodes), mode="cart", stock=20, seed=seed, during=chaos)
    report("carts, 1-2 of 5 paused", run, pause_rounds=rounds)
    assert rounds and rounds[0] >= 3
    assert_all_oracles(run, nodes, shop.prefix, TTL + 1.5)


def test_carts_with_a_node_restarted_empty(
    shop: Shop, redis_node_factory: Nodes, report: Callable[..., None]
) -> None:
    """Carts on 3 nodes while one node is killed (-9) and restarted empty mid-run (it is
    quarantined for the rest of the run): stock conserved, purchase log in token order, no
    overlapping sections, tokens in real-time order."""
    nodes = redis_node_factory(3)
    run_ids: list[str] = []

    def crash(pool: WorkerPool) -> None:
        time.sleep(0.6)
        run_ids.append(nodes[1].client().info("server")["run_id"])
        nodes[1].restart(keep_data=False)
        run_ids.append(nodes[1].client().info("server")["run_id"])

    run = shop.run(shop.settings(nodes), mode="cart", stock=20, during=crash)
    report("carts, a node restarted empty", run)
    assert len(set(run_ids)) == 2  # the fault took effect: a new incarnation
    assert_data_oracles(run)
    assert token_anomalies(run.history) == []
    assert overlap_anomalies(run.history) == []
    assert sum(1 for e in run.history.of("ok") if e.get("sold")) > 0


@pytest.mark.parametrize("count", [3, pytest.param(5, marks=pytest.mark.slow)])
def test_semaphore_holders_with_nodes_paused_and_restarted(
    count: int, redis_node_factory: Nodes
) -> None:
    """8 processes x 25 sections on a 3-permit semaphore while nodes are paused and resumed
    and one is killed and restarted empty: the holder counter outside the library never
    exceeds 3, and every permit had its own token."""
    nodes = redis_node_factory(count)
    counter = redis_node_factory(1)[0]
    redlock = {"sem": {"NODES": nodes.urls, "NODE_TIMEOUT": 0.1, "TTL": 5.0}}
    key = f"holders-{count}"
    with pauses_and_a_restart(nodes, seed=count, flag=counter) as faults, PROCESSES.Pool(8) as pool:
        results = pool.starmap(
            workers.hold_permits,
            [(redlock, "sem", "s", 3, counter.url, key, 25, FAULTS_DONE) for _ in range(8)],
        )
    seen = [int(n) for n in counter.client().lrange(f"{key}:seen", 0, -1)]
    assert len(seen) >= 200 and max(seen) <= 3
    assert "restart" in faults and faults.count("pause") >= 8
    tokens = [t for r in results for t in r]
    assert len(set(tokens)) == len(tokens)


def test_read_write_lock_with_nodes_paused_and_restarted(redis_node_factory: Nodes) -> None:
    """6 reading and 2 writing processes on 5 nodes while nodes are paused and resumed and one
    is killed and restarted empty: a writer never sees another holder inside, a reader never
    sees a writer, and both writers finish."""
    nodes = redis_node_factory(5)
    counter = redis_node_factory(1)[0]
    redlock = {"rw": {"NODES": nodes.urls, "NODE_TIMEOUT": 0.1, "TTL": 5.0}}
    args = [(redlock, "rw", "rw", counter.url, 15, False, FAULTS_DONE)] * 6
    args += [(redlock, "rw", "rw", counter.url, 10, True, FAULTS_DONE)] * 2
    with pauses_and_a_restart(nodes, seed=5, flag=counter) as faults, PROCESSES.Pool(8) as pool:
        done = pool.starmap(workers.read_write_sections, args)
    assert min(done[:6]) >= 15 and min(done[6:]) >= 10
    seen = [v.split() for v in counter.client().lrange("rw:seen", 0, -1)]
    assert all(s[1] == b"1" and s[2] == b"0" for s in seen if s[0] == b"writers")
    assert all(s[2] == b"0" for s in seen if s[0] == b"readers")
    assert "restart" in faults and faults.count("pause") >= 8
