"""A cluster node under the shop workload: the master of the alias's slot SIGKILLed and failed
over to its replica (also for a spread alias, whose locks are on every master), and the slot
migrated to another master mid-workload. The failovers are judged by tests/support/failover.py:
which server granted a lease by its token, when by stamps taken before the call and after the
grant, so a worker that ran late cannot make a correct run look wrong (nor the reverse)."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from django_redlock.engine.keyspace import Keyspace
from django_redlock.nodes.cluster import SHARDS, shard_of, shard_prefixes, slot_of
from django_redlock.testing.cluster import ClusterGroup
from django_redlock.testing.node import RedisNode
from tests.faults.conftest import LONG, TTL, Run, Shop, assert_data_oracles
from tests.support.failover import (
    failover_anomalies,
    granted_fences,
    now,
    token_floor,
    wait_promoted,
)
from tests.support.shop_workload import WorkerPool, overlap_anomalies, token_anomalies

#: seconds the workload runs: the fault a second in, then the quarantine (TTL) and after
SECONDS = 30.0 if LONG else 8.0
#: How long the fault injector waits for the replica to hold the fence state (a lease granted)
#: of the shards it judges before it kills the master anyway. A shard whose first lease the
#: replica never received is trusted at once after the promotion (docs/algorithm.md), so it is
#: not judged: it is reported as ``unquarantined``.
REPLICATED_WITHIN = 3.0


@pytest.fixture(scope="module")
def cluster() -> Iterator[ClusterGroup]:
    """Three masters with a replica each."""
    with ClusterGroup.start(3, 1) as started:
        yield started


@dataclass
class Failover:
    """One master's failover as the fault injector saw it (times: ``time.monotonic_ns()``)."""

    old: RedisNode
    replica: RedisNode
    #: the old master's fence hashes (one per shard it served) that are judged
    fences: frozenset[str]
    #: those the replica held, with a lease granted, before the kill: quarantined once promoted
    quarantined: frozenset[str]
    #: below it every token of the old master, above it every token of the promoted replica
    floor: int
    #: just before the kill; the old master was reaped by ``killed``
    fault: int
    killed: int
    #: the last moment the replica was seen a replica: it was promoted after that
    promoted_after: int
    #: every live node of the cluster said ``ok`` again
    settled: int


def _replica_of(cluster: ClusterGroup, master: RedisNode) -> RedisNode:
    """The live replica of ``master``."""
    for node in cluster.nodes:
        if node is master or not node.is_running:
            continue
        info = node.client(decode_responses=True).info("replication")
        if info["role"] == "slave" and int(info["master_port"]) == master.port:
            return node
    raise AssertionError(f"{master!r} has no live replica")


def _fail_over(cluster: ClusterGroup, slot: int, fences: Iterable[str]) -> Failover:
    """SIGKILL the master of ``slot`` once its replica holds the fence state of ``fences``
    (or :data:`REPLICATED_WITHIN` passed), and wait for the replica to take over."""
    fences = frozenset(fences)
    old = cluster.master_of(slot)
    replica = _replica_of(cluster, old)
    deadline = time.monotonic() + REPLICATED_WITHIN
    while (held := granted_fences(replica, fences, True)) != fences:
        if time.monotonic() > deadline:
            break
        time.sleep(0.05)
    # a fence hash is never deleted: the replica holds at least ``held`` when the master dies
    floor = token_floor()
    fault = now()
    old.kill()
    killed = now()
    promoted_after = wait_promoted(replica, killed)
    cluster.wait_failover(slot, old)
    return Failover(old, replica, fences, held, floor, fault, killed, promoted_after, now())


def _judge(run: Run, fault_ns: int, settled_ns: int) -> dict[str, Any]:
    """The oracles, and sales before the fault and after it; returns what to report."""
    assert_data_oracles(run)
    assert token_anomalies(run.history) == []
    assert overlap_anomalies(run.history) == []
    granted = sorted(e["acquired"] for e in run.history.granted)
    before = [t for t in granted if t < fault_ns]
    after = [t for t in granted if t > settled_ns]
    assert before and after, "sales must run before the fault and resume after it"
    return {
        "outage_s": round((after[0] - fault_ns) / 1e9, 2),
        "granted_before": len(before),
        "granted_after": len(after),
    }


def _judge_failover(
    run: Run, failover: Failover, fence_of: Callable[[dict[str, Any]], str]
) -> dict[str, Any]:
    """On the old master's shards (``fence_of``: an event's shard's fence hash): the old
    master granted nothing sent after the kill, and the promoted replica's shards that were
    quarantined granted nothing before one TTL after its promotion. Returns what to report."""
    anomalies, judged = failover_anomalies(
        [e for e in run.history.granted if fence_of(e) in failover.fences],
        floor=failover.floor,
        killed=failover.killed,
        promoted_after=failover.promoted_after,
        quarantine=TTL,
        judged=lambda e: fence_of(e) in failover.quarantined,
    )
    assert anomalies == [], f"promoted replica: port {failover.replica.port}"
    end = failover.promoted_after + TTL * 1e9
    first = min((e["acquired"] for e in judged), default=None)
    return {
        "promotion_s": round((failover.promoted_after - failover.killed) / 1e9, 2),
        "quarantined": len(failover.quarantined),
        "unquarantined": len(failover.fences - failover.quarantined),
        "granted_by_promoted": len(judged),
        "first_after_quarantine_s": None if first is None else round((first - end) / 1e9, 2),
    }


def test_slot_master_killed_and_failed_over(
    shop: Shop, cluster: ClusterGroup, report: Callable[..., None]
) -> None:
    """The master serving the alias's slot is SIGKILLed a second in; its replica takes over
    and, with another run_id, is quarantined: no lease granted by it before one TTL after its
    promotion, none by the old master after the kill. No oversold item, no lost update, no
    duplicate or regressing token; sales resume."""
    prefix = "{shopkill}:"
    slot = slot_of(prefix)
    fence = Keyspace(prefix).fence
    seen: list[Failover] = []

    def crash(pool: WorkerPool) -> None:
        time.sleep(1.0)
        seen.append(_fail_over(cluster, slot, [fence]))

    config = shop.settings([cluster.node_setting()], KEY_PREFIX=prefix)
    run = shop.run(config, stock=10_000, duration=SECONDS, during=crash)
    (failover,) = seen
    result = _judge(run, failover.fault, failover.settled)
    assert failover.quarantined == {fence}, "the workload granted nothing in its first seconds"
    result |= _judge_failover(run, failover, lambda e: fence)
    report("cluster master killed", run, **result)


def test_a_master_of_a_spread_alias_killed_and_failed_over(
    shop: Shop, cluster: ClusterGroup, report: Callable[..., None]
) -> None:
    """A spread alias (no hash tag: its items' locks on every master): a master serving some
    of the products' shards is SIGKILLed a second in and its replica takes over. Those shards
    grant nothing from the promoted replica before one TTL after its promotion, nor from the
    old master after the kill, while the other masters' shards may (their sales meanwhile are
    reported); the same oracles hold."""
    prefix = "shopspread:"
    shards = shard_prefixes(prefix)
    fences = [Keyspace(p).fence for p in shards]
    seen: list[Failover] = []

    def fence_of(event: dict[str, Any]) -> str:
        return fences[event["shard"]]

    def crash(pool: WorkerPool) -> None:
        time.sleep(1.0)
        masters = {i: cluster.master_of(slot_of(p)) for i, p in enumerate(shards)}
        wanted = {shard_of(f"product:{pk}", SHARDS) for pk in shop.pks}
        # the master serving most of the products' shards, among those with a replica (an
        # earlier test's failover left a master without one)
        candidates = [m for m in set(masters.values()) if _has_replica(cluster, m)]
        victim = max(candidates, key=lambda m: sum(masters[i] is m for i in wanted))
        on_victim = [i for i in wanted if masters[i] is victim]
        assert on_victim, "no product's shard on a master that can fail over"
        slot = slot_of(shards[on_victim[0]])
        seen.append(_fail_over(cluster, slot, [fences[i] for i in on_victim]))

    config = shop.settings([cluster.node_setting()], KEY_PREFIX=prefix)
    run = shop.run(config, stock=10_000, duration=SECONDS, during=crash)
    (failover,) = seen
    result = _judge(run, failover.fault, failover.settled)
    assert failover.quarantined, "the workload granted nothing on the victim's shards"
    result |= _judge_failover(run, failover, fence_of)
    # reported, not asserted: workers that drew a quarantined product wait for it (timeout
    # 2 s), so how many sales the other shards make meanwhile varies (1 to 52 in CI runs)
    end = failover.promoted_after + TTL * 1e9
    elsewhere = [
        e
        for e in run.history.granted
        if fence_of(e) not in failover.fences and failover.promoted_after < e["acquired"] < end
    ]
    report("spread alias, a cluster master killed", run, sold_meanwhile=len(elsewhere), **result)


def _has_replica(cluster: ClusterGroup, master: RedisNode) -> bool:
    try:
        _replica_of(cluster, master)
    except AssertionError:
        return False
    return True


def test_slot_migrated_mid_workload(
    shop: Shop, cluster: ClusterGroup, report: Callable[..., None]
) -> None:
    """The alias's slot (locks, waiters, fence hash) is migrated to another master a second
    in, in batches of two keys: scripts meeting a half-moved slot fail (TRYAGAIN, ASK), then
    MOVED sends the engine to the new owner. Same oracles; sales resume."""
    prefix = "{shopmove}:"
    slot = slot_of(prefix)
    marks: dict[str, int] = {}

    def migrate(pool: WorkerPool) -> None:
        time.sleep(1.0)
        source = cluster.master_of(slot)
        target = next(m for m in cluster.masters() if m is not source)
        marks["fault"] = time.monotonic_ns()
        cluster.migrate_slot(slot, target, batch=2)
        marks["settled"] = time.monotonic_ns()

    config = shop.settings([cluster.node_setting()], KEY_PREFIX=prefix)
    run = shop.run(config, stock=10_000, duration=SECONDS, during=migrate)
    seen = _judge(run, marks["fault"], marks["settled"])
    report("cluster slot migrated", run, **seen)
