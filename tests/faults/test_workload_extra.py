"""The whole shop workload under least privilege and through per-client proxies, and long
profile variants of the newer scenarios.

- An ACL user limited to the alias's key prefix and the documented commands runs the
  multi-process workload; ``KEYS`` is denied to it while inspection (``list_locks``) works
  as that user, so inspection uses SCAN.
- The workload's worker processes reach the nodes through one proxy per node (started in
  the test process): one node delayed, another blackholed mid-run and healed.
- ``slow`` tests (``REDLOCK_LONG=1`` only): the read-then-write race workload with more seeds
  and longer runs, and many rounds of the dropped ``SET NX`` reply scenario.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest
import redis

from django_redlock.engine.plans import HANDOFF_MS
from django_redlock.exceptions import LockNotAcquired, NodesUnavailable
from django_redlock.inspect import list_locks
from django_redlock.manager import LockManager
from django_redlock.testing import RedisNodes
from tests.faults.conftest import DURATION, LONG, SEEDS, TTL, WORKERS, Shop, assert_all_oracles
from tests.faults.proxy import Proxy
from tests.faults.test_more_faults import stale_rejections
from tests.faults.test_proxy_faults import healed_leases
from tests.faults.workload import (
    conservation_anomalies,
    errors_of,
    overlap_anomalies,
    purchase_log_anomalies,
    token_anomalies,
    wait_no_lock_keys,
)
from tests.test_node_urls import acl_user_urls

Nodes = Callable[..., RedisNodes]
Alias = Callable[..., LockManager]

USER, PASSWORD = "shopper", "Sh0p-pa55"


# -- 1. least privilege ----------------------------------------------------------------------


def test_acl_user_limited_to_prefix_runs_the_whole_workload(
    shop: Shop,
    redis_node_factory: Nodes,
    redlock_alias: Alias,
    report: Callable[..., None],
) -> None:
    """8 worker processes whose NODES are ``redis://shopper:...@`` URLs of a user limited to
    ``~<prefix>*``, no channels and the documented ACL_COMMANDS run the whole workload: every
    oracle holds and no command is refused (a NOPERM would be a raw error or a failure
    reason). ``KEYS *`` as that user is NoPermissionError, while ``list_locks`` as that user,
    in this process during and after the run, answers without errors: inspection uses SCAN.
    A control shows the user really is confined (a key outside the prefix is denied)."""
    nodes = redis_node_factory(3)
    urls = acl_user_urls(nodes, USER, PASSWORD, shop.prefix)
    user = redis.Redis(host="127.0.0.1", port=nodes[0].port, username=USER, password=PASSWORD)
    with pytest.raises(redis.exceptions.NoPermissionError):
        user.get("other:secret")  # control: the ACL confines this user
    admins = [node.client() for node in nodes]
    assert admins[0].execute_command("ACL", "LOG")  # ...and denials are logged
    for admin in admins:
        admin.execute_command("ACL", "LOG", "RESET")
    inspector = redlock_alias(urls, KEY_PREFIX=shop.prefix, TTL=TTL, NODE_TIMEOUT=1.0)
    pages: list[Any] = []
    as_user: set[str] = set()

    def inspect_during(pool: Any) -> None:
        deadline = time.monotonic() + DURATION
        while time.monotonic() < deadline:
            pages.append(list_locks(using=[inspector.alias]))
            as_user.update(c["addr"] for c in admins[0].client_list() if c.get("user") == USER)
            time.sleep(0.1)

    run = shop.run(shop.settings(urls), during=inspect_during)
    listed = sum(len(page.locks) for page in pages)
    report("ACL user", run, inspections=len(pages), listed=listed, connections=len(as_user))
    failures = [e["error"] for e in run.history.of("fail")]
    assert not [f for f in failures if "NOPERM" in f or "NoPermission" in f], failures[:3]
    assert_all_oracles(run, nodes, shop.prefix, TTL + 2.0)
    assert len(as_user) > WORKERS // 2, as_user  # the workers really connected as the user
    assert [a.execute_command("ACL", "LOG") for a in admins] == [[], [], []]  # nothing denied
    assert pages and not [page.errors for page in pages if page.errors]
    assert all(info.name.startswith("product:") for page in pages for info in page.locks)
    after = list_locks(using=[inspector.alias])
    assert after.locks == [] and not after.errors
    with pytest.raises(redis.exceptions.NoPermissionError):
        user.keys("*")
    with pytest.raises(redis.exceptions.NoPermissionError):
        user.keys(f"{shop.prefix}*")


# -- 2. per-client network faults under the workload -------------------------------------


@pytest.mark.parametrize("seed", SEEDS)
def test_workload_through_proxies_with_delay_and_a_healed_blackhole(
    shop: Shop,
    redis_node_factory: Nodes,
    proxies: Callable[[RedisNodes], list[Proxy]],
    report: Callable[..., None],
    seed: int,
) -> None:
    """The workers reach 3 nodes only through proxies (one per node, in this process). Node 0
    is delayed by 20-50 ms each way (by seed; 30 ms for seed 1) for the whole run; node 1 is
    blackholed after a third of the run and healed after two thirds (held-back traffic is
    then delivered late, in order). Every oracle holds: a slow and a lost node cost latency
    or failed attempts, never data, token order or exclusion. The proxies' counters show the
    faults bit: traffic was delayed through node 0, swallowed on node 1 while blackholed,
    and forwarded through all of them."""
    nodes = redis_node_factory(3)
    px = proxies(nodes)
    delay_ms = (30, 20, 50, 40, 25)[(seed - 1) % 5]
    px[0].set("delay", delay_ms=delay_ms)
    seen: dict[str, int] = {}

    def faults(pool: Any) -> None:
        time.sleep(DURATION / 3)
        before = px[1].counters.swallowed["up"]
        px[1].set("blackhole")
        time.sleep(DURATION / 3)
        px[1].set("pass")
        seen["blackholed"] = px[1].counters.swallowed["up"] - before

    run = shop.run(shop.settings([p.url for p in px]), seed=seed, during=faults)
    seen["delayed"] = px[0].counters.forwarded["up"]  # delay mode for the whole run
    report(f"proxies: {delay_ms} ms delay + blackhole", run, **seen)
    assert seen["delayed"] > 0, "nothing went through the delayed proxy"
    assert seen["blackholed"] > 0, "the blackhole swallowed nothing: the fault never bit"
    assert all(p.counters.forwarded["up"] > 0 for p in px)
    assert_all_oracles(run, nodes, shop.prefix, TTL + 2.0)


# -- 3. long profile variants --------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("seed", SEEDS)
def test_long_read_then_write_race_in_the_workload(
    shop: Shop,
    redis_node_factory: Nodes,
    redlock_alias: Alias,
    report: Callable[..., None],
    seed: int,
) -> None:
    """Long profile of ``test_read_then_write_race_in_the_workload``: per seed, a DURATION run
    of 8 processes while an operator force-releases held product locks every 20 ms. Every
    StaleTokenError hits a stale writer, stock is conserved, the purchase log and tokens are
    in order. Control (shorter): the guard disabled overlaps and loses updates."""
    nodes = redis_node_factory(3)
    manager = redlock_alias(nodes, KEY_PREFIX=shop.prefix, TTL=2.0)
    admin = nodes[0].client()
    released: list[int] = []

    def evict_for(seconds: float) -> Callable[[Any], None]:
        def evict(pool: Any) -> None:
            deadline = time.monotonic() + seconds
            while time.monotonic() < deadline:
                for key in admin.scan_iter(match=f"{shop.prefix}product:*", count=100):
                    released.append(manager.force_release(key.decode()[len(shop.prefix) :]))
                time.sleep(0.02)

        return evict

    kwargs: dict[str, Any] = {"stock": 100 * max(1, int(DURATION / 2)), "items": 3,
                              "think": (0.01, 0.04), "seed": seed}  # fmt: skip
    run = shop.run(shop.settings(nodes), during=evict_for(DURATION), **kwargs)
    rejected, anomalies = stale_rejections(run.history)
    evicted = sum(1 for r in released if r)
    report(f"long race, seed {seed}", run, evicted=evicted, rejected=rejected)
    assert evicted > 0
    assert anomalies == []
    assert errors_of(run.history) == []
    assert conservation_anomalies(run.initial, run.history) == []
    assert purchase_log_anomalies(run.initial) == []
    assert token_anomalies(run.history) == []
    released.clear()
    control = shop.run(shop.settings(nodes), mode="unfenced", oracle=False, duration=2.0,
                       during=evict_for(2.0), **kwargs)  # fmt: skip
    report(f"long race control, seed {seed}", control)
    assert overlap_anomalies(control.history), "no overlap: the eviction did not bite"
    assert conservation_anomalies(control.initial), "the unguarded race lost no update"


def _fence(nodes: RedisNodes, prefix: str) -> list[int]:
    return [int(n.client().hget(f"{prefix}__fence__", "token") or 0) for n in nodes]


@pytest.mark.slow
def test_long_dropped_set_nx_replies_many_rounds(
    redis_node_factory: Nodes,
    redlock_alias: Alias,
    proxies: Callable[[RedisNodes], list[Proxy]],
) -> None:
    """Long profile of ``test_dropped_set_nx_reply``: many rounds, each with a different pair
    of proxies swallowing the replies of client A's acquire script. Every round: A's attempt
    fails typed, the scripts did run (fence counters moved) and the proxies swallowed replies,
    the keys set are deleted (TTL 30 s: released, not expired), B (direct) gets a larger token
    and is sole holder; after healing, A's reused connections pair replies correctly: its
    tokens keep increasing and B is refused while A holds."""
    nodes = redis_node_factory(3)
    px = proxies(nodes)
    prefix = "droplong:"
    a = redlock_alias([p.url for p in px], KEY_PREFIX=prefix, NODE_TIMEOUT=0.3, TTL=30.0)
    b = redlock_alias(nodes, KEY_PREFIX=prefix, NODE_TIMEOUT=0.3, TTL=30.0)
    clients = [n.client() for n in nodes]
    first = a.acquire("k", timeout=0)
    assert first.release() is True
    last = first.token
    pairs = [(0, 1), (1, 2), (0, 2)]
    rounds = 30 if LONG else 3
    for round_ in range(rounds):
        dropping = [px[i] for i in pairs[round_ % 3]]
        # A waited in the last round, so its mark on the name outlives that wait and its own
        # release reserved the name for a woken waiter (HANDOFF_MS): an attempt inside that
        # window is refused as busy before the script's counter moves. Let it pass first.
        time.sleep(2 * HANDOFF_MS / 1000)
        before = _fence(nodes, prefix)
        swallowed = sum(p.counters.swallowed["down"] for p in dropping)
        for p in dropping:
            p.set("drop-replies")
        with pytest.raises((NodesUnavailable, LockNotAcquired)):
            a.acquire("k", timeout=0)
        after = _fence(nodes, prefix)
        assert sum(1 for x, y in zip(before, after, strict=True) if y > x) >= 2, (before, after)
        assert sum(p.counters.swallowed["down"] for p in dropping) > swallowed
        assert wait_no_lock_keys(clients, prefix, 5.0) == [], round_
        with b.lock("k", timeout=5) as held:
            assert held.token > max(after) and held.token > last
            last = held.token
            with pytest.raises((LockNotAcquired, NodesUnavailable)):
                a.acquire("k", timeout=0)
        for p in px:
            p.set("pass")
        last = healed_leases(a, b, clients, "k", after=last, count=2)
    assert wait_no_lock_keys(clients, prefix, 5.0) == []
