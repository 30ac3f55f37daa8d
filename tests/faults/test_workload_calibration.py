"""The shop workload without faults: every oracle holds, and the oracles can fail.

These runs calibrate the suite: if the fault-free run showed anomalies the fault tests would
prove nothing, and if the lock-free run showed none the oracles would be blind.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from django_redlock.testing import RedisNodes
from tests.faults.conftest import SEEDS, TTL, Shop, assert_all_oracles
from tests.support.shop_workload import (
    conservation_anomalies,
)


@pytest.mark.parametrize("node_count", [1, 5])
def test_fault_free_workload_keeps_every_invariant(
    shop: Shop,
    redis_node_factory: Callable[..., RedisNodes],
    report: Callable[..., None],
    node_count: int,
) -> None:
    """8 processes x 10 items x stock 5 on 1 node and on 5 nodes: no oversell, conservation,
    the purchase log in token order, tokens in real-time order without duplicates, no
    overlapping critical sections, and no lock key left after the TTL while every node keeps
    its fence counter."""
    nodes = redis_node_factory(node_count)
    run = shop.run(shop.settings(nodes), stock=5)
    report(f"{node_count} node(s)", run)
    assert_all_oracles(run, nodes, shop.prefix, TTL + 1.0)


@pytest.mark.parametrize("seed", SEEDS)
def test_negative_control_without_lock_oversells(
    shop: Shop,
    redis_node_factory: Callable[..., RedisNodes],
    report: Callable[..., None],
    seed: int,
) -> None:
    """The same workload without the lock (plain read, think, write) loses updates: the
    conservation oracle sees it. Proves the oracle is not blind."""
    nodes = redis_node_factory(1)
    run = shop.run(
        shop.settings(nodes),
        mode="nolock",
        stock=50,
        seed=seed,
        think=(0.0, 0.01),
        duration=1.0,
        oracle=False,
    )
    anomalies = conservation_anomalies(run.initial)
    report("no lock", run, anomalies=len(anomalies))
    assert anomalies, "the lock-free control showed no lost update"
