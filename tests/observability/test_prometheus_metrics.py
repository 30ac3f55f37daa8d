"""django_redlock.contrib.prometheus in one process (docs/observability.md): each metric counts
what the lock
calls did, on real nodes, in a registry of the test's own. The multi-process scrape through
django-prometheus is tests/observability/test_prometheus_scrape.py."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from django_redlock import locks
from django_redlock.contrib.nodes import public_label
from django_redlock.contrib.prometheus.metrics import RedlockMetrics
from django_redlock.exceptions import LockLost, LockNotAcquired, NodesUnavailable
from django_redlock.locking.manager import LockManager
from tests.support.waiting import release_once_waited_for


@pytest.fixture
def metrics() -> Iterator[tuple[RedlockMetrics, CollectorRegistry]]:
    registry = CollectorRegistry()
    metrics = RedlockMetrics(
        registry, waiters_interval=3600, nodes_interval=3600
    )  # the test refreshes by hand
    metrics.connect()
    yield metrics, registry
    metrics.disconnect()


def value(registry: CollectorRegistry, name: str, **labels: str) -> float:
    found = registry.get_sample_value(name, labels)
    return 0.0 if found is None else found


def test_acquire_hold_and_lost_count_what_the_calls_did(
    metrics: tuple[RedlockMetrics, CollectorRegistry], unique_name: str
) -> None:
    """2 acquired (one after a wait of at least 0.2 s: the holder releases 0.2 s after the
    waiter is seen waiting), 1 busy (timeout), 2 holds, 1 lost lease; the acquired histogram
    sums the waits the two calls measured."""
    _, registry = metrics
    manager = locks["multi"]
    holder = manager.acquire(unique_name, timeout=0)
    with pytest.raises(LockNotAcquired):
        manager.acquire(unique_name, timeout=0.1)
    releaser = release_once_waited_for(manager, unique_name, holder, 0.2)
    lease = manager.acquire(unique_name, timeout=30)
    releaser.join()
    manager.force_release(unique_name)
    with pytest.raises(LockLost):
        lease.extend()
    lease.release()

    count = "redlock_acquire_seconds_count"
    assert value(registry, count, alias="multi", outcome="acquired") == 2
    assert value(registry, count, alias="multi", outcome="busy") == 1
    assert value(registry, count, alias="multi", outcome="unavailable") == 0
    waited = value(registry, "redlock_acquire_seconds_sum", alias="multi", outcome="acquired")
    assert waited == pytest.approx(holder.waited + lease.waited) and lease.waited >= 0.2
    assert (
        value(registry, "redlock_acquire_seconds_bucket", alias="multi", outcome="busy", le="0.05")
        == 0
    )
    assert value(registry, "redlock_hold_seconds_count", alias="multi") == 2
    assert value(registry, "redlock_lost_total", alias="multi") == 1
    for family in registry.collect():  # bounded cardinality: no lock name in any label
        for sample in family.samples:
            assert not any(unique_name in str(v) for v in sample.labels.values())


def test_unavailable_outcome_and_node_gauges(
    metrics: tuple[RedlockMetrics, CollectorRegistry],
    redis_node_factory: Callable[..., Any],
    redlock_alias: Callable[..., LockManager],
    unique_name: str,
) -> None:
    """Two of three nodes paused: the acquire is "unavailable" and the refresher sets
    node_up 0 for them, 1 for the third (with its RTT, in seconds: within the refresh that
    measured it); resumed: all up again. NODE_TIMEOUT 1 s: a paused node never answers, a
    healthy one on a loaded machine may take more than a few ms."""
    metric, registry = metrics
    nodes = redis_node_factory(3)
    manager = redlock_alias(nodes, NODE_TIMEOUT=1.0)
    alias = manager.alias
    labels = [public_label(node) for node in manager.config.nodes]
    assert all("@" not in label and label.endswith("/0") for label in labels)
    nodes[0].pause()
    nodes[1].pause()
    try:
        with pytest.raises(NodesUnavailable):
            manager.acquire(unique_name, timeout=0)
        started = time.monotonic()
        metric.refresher.refresh()
        refreshed_in = time.monotonic() - started
        up = [value(registry, "redlock_node_up", alias=alias, node=n) for n in labels]
        assert up == [0, 0, 1]
        rtt = value(registry, "redlock_node_rtt_seconds", alias=alias, node=labels[2])
        assert 0 < rtt < refreshed_in
    finally:
        nodes[0].resume()
        nodes[1].resume()
    count = "redlock_acquire_seconds_count"
    assert value(registry, count, alias=alias, outcome="unavailable") == 1
    metric.refresher.refresh()
    assert [value(registry, "redlock_node_up", alias=alias, node=n) for n in labels] == [1, 1, 1]


def test_waiters_gauge_counts_the_calls_waiting_now(
    metrics: tuple[RedlockMetrics, CollectorRegistry], unique_name: str
) -> None:
    """Two threads waiting for a held name: redlock_waiters 2; after they got it: 0."""
    metric, registry = metrics
    manager = locks["multi"]
    holder = manager.acquire(unique_name, timeout=0)
    done: list[bool] = []

    def wait_for_it() -> None:
        with manager.lock(unique_name, timeout=10):
            done.append(True)

    threads = [threading.Thread(target=wait_for_it) for _ in range(2)]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + 5
    while manager.engine.waiters.value < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    metric.refresher.refresh()
    assert value(registry, "redlock_waiters", alias="multi") == 2
    holder.release()
    for thread in threads:
        thread.join()
    metric.refresher.refresh()
    assert done == [True, True] and value(registry, "redlock_waiters", alias="multi") == 0


def test_the_refresher_starts_at_the_first_lock_event(
    unique_name: str,
) -> None:
    """No thread before any lock call; the first acquire starts it and it sets the gauges."""
    registry = CollectorRegistry()
    metric = RedlockMetrics(registry, waiters_interval=0.05, nodes_interval=0.05)
    metric.connect()
    try:
        assert metric.refresher.thread is None
        locks["default"].acquire(unique_name, timeout=0).release()
        assert metric.refresher.thread is not None and metric.refresher.thread.is_alive()
        node = public_label(locks["default"].config.nodes[0])
        deadline = time.monotonic() + 5
        while (
            registry.get_sample_value("redlock_node_up", {"alias": "default", "node": node}) is None
        ):
            assert time.monotonic() < deadline, "the refresher never set the node gauge"
            time.sleep(0.02)
    finally:
        metric.disconnect()
