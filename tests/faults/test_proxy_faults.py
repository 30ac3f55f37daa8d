"""Per-client network faults through a TCP proxy (``tests/support/tcp_proxy.py``): one client sees
delayed, swallowed or reset traffic while another client reaches the same nodes directly.

Each test first shows that the proxy path works (the negative control: no fault, lock granted)
and asserts from the nodes or the proxy's counters that the fault really happened.

Under the shop workload, the worker processes reach the nodes only through one proxy per node
(one delayed, another blackholed mid-run and healed). The long profile (``slow``) repeats the
dropped ``SET NX`` reply scenario for many rounds.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
from django.db import transaction

from django_redlock.engine.kinds import HANDOFF_MS
from django_redlock.exceptions import LockNotAcquired, NodesUnavailable, StaleTokenError
from django_redlock.locking.manager import LockManager
from django_redlock.testing import RedisNodes
from tests.faults.conftest import DURATION, LONG, SEEDS, TTL, Shop, assert_all_oracles
from tests.support.shop_workload import wait_no_lock_keys
from tests.support.tcp_proxy import Proxy

Nodes = Callable[..., RedisNodes]
Alias = Callable[..., LockManager]


def counters(nodes: RedisNodes, prefix: str) -> list[int]:
    return [int(n.client().hget(f"{prefix}__fence__", "token") or 0) for n in nodes]


@pytest.mark.parametrize("mode", ["blackhole", "reset"])
def test_proxy_modes_cut_the_client_off(
    redis_node_factory: Nodes,
    redlock_alias: Callable[..., LockManager],
    proxies: Callable[[RedisNodes], list[Proxy]],
    mode: str,
) -> None:
    """The proxy itself: in ``pass`` mode the lock works through it (control); blackholing or
    resetting a quorum of proxies makes the next acquisition fail with NodesUnavailable within
    a bounded time, never a raw error, and the client recovers once the proxies pass again."""
    nodes = redis_node_factory(3)
    px = proxies(nodes)
    manager = redlock_alias([p.url for p in px], NODE_TIMEOUT=0.2, TTL=5.0)
    manager.acquire("p", timeout=0).release()  # control: the proxy path works
    for p in px[:2]:
        p.set(mode)
    started = time.monotonic()
    with pytest.raises(NodesUnavailable) as info:
        manager.acquire("p", timeout=0)
    assert time.monotonic() - started < 3.0  # NODE_TIMEOUT 0.2 s; generous on a busy box
    assert len(info.value.errors) >= 2
    if mode == "blackhole":
        assert sum(p.counters.swallowed["up"] for p in px[:2]) >= 2  # the fault bit
    else:
        assert sum(p.counters.resets for p in px[:2]) >= 2
    for p in px:
        p.set("pass")
    lease = manager.acquire("p", timeout=5)  # reconnects in the background, then works
    assert lease.release() is True
    assert wait_no_lock_keys([n.client() for n in nodes], manager.config.key_prefix, 6) == []


@pytest.mark.django_db(transaction=True)
def test_proxy_delay_beyond_validity(
    redis_node_factory: Nodes,
    redlock_alias: Callable[..., LockManager],
    proxies: Callable[[RedisNodes], list[Proxy]],
) -> None:
    """Client A reaches 2 of 3 nodes through proxies delaying each direction by 300 ms, with
    a 0.3 s TTL and a NODE_TIMEOUT long enough to wait for the replies: a quorum answers only
    after the lease would have run out, so the acquisition must fail (validity <= 0), or if
    it were granted the fenced data must still be right. No key outlives the TTL, and a
    direct client B then gets a larger token and its write is never overwritten by A."""
    from testproject.inventory.models import Product

    nodes = redis_node_factory(3)
    px = proxies(nodes)
    prefix = "delay:"
    a = redlock_alias([px[0].url, px[1].url, nodes[2].url], KEY_PREFIX=prefix,
                      NODE_TIMEOUT=3.0, TTL=0.3)  # fmt: skip
    b = redlock_alias(nodes, KEY_PREFIX=prefix, NODE_TIMEOUT=0.5, TTL=5.0)
    product = Product.objects.create(name="delayed", stock=10)
    control = a.acquire("item", ttl=0.3, timeout=0)  # control: without delay A is granted
    assert control.validity > 0 and control.release() is True
    for p in px[:2]:
        p.set("delay", delay_ms=300)
    forwarded = sum(p.counters.forwarded["down"] for p in px[:2])
    started = time.monotonic()
    lease = None
    with contextlib.suppress(LockNotAcquired, NodesUnavailable):
        lease = a.acquire("item", ttl=0.3, timeout=0)
    elapsed = time.monotonic() - started
    assert elapsed >= 0.5, elapsed  # the quorum's replies really were late (2 x 300 ms)
    assert sum(p.counters.forwarded["down"] for p in px[:2]) > forwarded  # and did arrive
    if lease is not None:  # granted anyway: it must not be usable past its validity
        assert lease.validity <= 0.3
    clients = [n.client() for n in nodes]
    assert wait_no_lock_keys(clients, prefix, 0.3 + 2.0) == []
    with b.lock("item", timeout=5) as newer:
        assert newer.token > control.token
        with transaction.atomic():
            row = Product.objects.claim(pk=product.pk)
            row.stock = 7
            row.save()
    if lease is not None:
        assert newer.token > lease.token
        stale = Product.objects.get(pk=product.pk)
        stale.stock = 1
        with pytest.raises(StaleTokenError), transaction.atomic():
            stale.save(fence_token=lease.token)
    assert Product.objects.get(pk=product.pk).stock == 7
    for p in px:
        p.set("pass")


def test_dropped_set_nx_reply(
    redis_node_factory: Nodes,
    redlock_alias: Callable[..., LockManager],
    proxies: Callable[[RedisNodes], list[Proxy]],
) -> None:
    """The acquire script runs on 2 of 3 nodes but their replies never reach client A (the
    proxies swallow them). A's attempt fails; the keys the nodes did set are deleted (TTL is
    30 s, so they were released, not expired); B gets the lock at once and is the only holder;
    and once the network heals A's reused connections do not mix up old and new replies:
    tokens stay unique and increasing and exclusion holds."""
    nodes = redis_node_factory(3)
    px = proxies(nodes)
    prefix = "drop:"
    a = redlock_alias([p.url for p in px], KEY_PREFIX=prefix, NODE_TIMEOUT=0.3, TTL=30.0)
    b = redlock_alias(nodes, KEY_PREFIX=prefix, NODE_TIMEOUT=0.3, TTL=30.0)
    first = a.acquire("k", timeout=0)  # control, and warm connections through the proxies
    assert first.release() is True
    before = counters(nodes, prefix)
    for p in px[:2]:
        p.set("drop-replies")
    with pytest.raises((NodesUnavailable, LockNotAcquired)) as info:
        a.acquire("k", timeout=0)
    assert len(info.value.errors) >= 2, info.value.errors
    after = counters(nodes, prefix)
    assert after[0] > before[0] and after[1] > before[1], (before, after)  # the SETs ran
    assert sum(p.counters.swallowed["down"] for p in px[:2]) >= 2
    clients = [n.client() for n in nodes]
    assert wait_no_lock_keys(clients, prefix, 5.0) == []  # deleted, long before the TTL
    with b.lock("k", timeout=5) as held:
        assert held.token > max(after)
        with pytest.raises((LockNotAcquired, NodesUnavailable)):
            a.acquire("k", timeout=0)  # B is the only holder
    for p in px:
        p.set("pass")
    healed_leases(a, b, clients, "k", after=held.token, count=5)
    assert wait_no_lock_keys(clients, prefix, 5.0) == []


def healed_leases(
    a: LockManager, b: LockManager, clients: list[Any], name: str, after: int, count: int
) -> int:
    """Once the network heals, A (reusing its connections) gets ``count`` leases on ``name``
    within 20 s, with tokens increasing from ``after``; while A holds, its key is on a
    quorum of the 3 nodes and B is refused. Returns the last token."""
    key = f"{a.config.key_prefix}{name}"
    tokens = [after]
    deadline = time.monotonic() + 20
    while len(tokens) <= count and time.monotonic() < deadline:
        try:
            lease = a.acquire(name, timeout=2)
        except (LockNotAcquired, NodesUnavailable):
            continue
        assert lease.token > tokens[-1], (lease.token, tokens)
        tokens.append(lease.token)
        with pytest.raises(LockNotAcquired):
            b.acquire(name, timeout=0)  # exclusion: A holds, B is refused
        assert [c.exists(key) for c in clients].count(1) >= 2
        lease.release()
    assert len(tokens) == count + 1, tokens
    return tokens[-1]


def test_busy_polling_backs_off_from_a_slow_node(
    redis_node_factory: Nodes,
    redlock_alias: Callable[..., LockManager],
    proxies: Callable[[RedisNodes], list[Proxy]],
) -> None:
    """A node reached through a proxy that delays each direction by 2 ms answers long after
    the 100 us busy-poll budget: after a few calls the channel stops spinning (and locks keep
    working). The same node reached directly keeps the channel spinning: the control."""
    nodes = redis_node_factory(1)
    (px,) = proxies(nodes)
    px.set("delay", delay_ms=2)
    slow = redlock_alias([px.url], KEY_PREFIX="spin:", TTL=5.0, NODE_TIMEOUT=1.0)
    fast = redlock_alias(nodes, KEY_PREFIX="spin:", TTL=5.0, NODE_TIMEOUT=1.0)
    for manager in (slow, fast):
        for i in range(6):
            lease = manager.acquire(f"n{i}", timeout=0)
            assert lease.release() is True
    (slow_channel,) = slow.engine.pools._free
    (fast_channel,) = fast.engine.pools._free
    assert not slow_channel.spinner.active
    for _ in range(5):  # a loaded machine can make a direct node late 4 times in a row too
        if fast_channel.spinner.active:
            break
        for i in range(70):  # past the pause of 64 calls, then calls that spin in time
            fast.acquire(f"n{i}", timeout=0).release()
    assert fast_channel.spinner.active
    assert px.counters.forwarded["up"] > 0  # the slow alias really went through the proxy


def test_force_release_between_acquire_and_token_write_back(
    redis_node_factory: Nodes,
    redlock_alias: Callable[..., LockManager],
    proxies: Callable[[RedisNodes], list[Proxy]],
) -> None:
    """The race the long force-release workload once hit (two leases with one token). A wins
    nodes 0 and 2, where node 2's counter is behind, so A must write its token back to node 2
    before it may use it; that node is 200 ms away for A. Meanwhile an operator force-releases
    the name and B takes nodes 1 and 2: node 1's counter equals node 0's, so B's token is A's
    token. A's write-back must then fail (it no longer holds node 2), so A gets no lease: two
    holders may never share a token. Without the ownership check A got B's token."""
    nodes = redis_node_factory(3)
    px = proxies(nodes)
    prefix = "raise:"
    admin = redlock_alias(nodes, KEY_PREFIX=prefix, NODE_TIMEOUT=0.5, TTL=30.0)
    admin.acquire("k", timeout=0).release()  # bootstraps the three counters
    fence = f"{prefix}__fence__"
    high = int(nodes[0].client().hget(fence, "token")) + 100
    for node in nodes[:2]:
        node.client().hset(fence, "token", high)  # node 2 is now far behind nodes 0 and 1
    px[2].set("delay", delay_ms=200)
    for p in px[:2]:
        p.set("reset")  # A never reaches node 1; B never reaches node 0
    a = redlock_alias([nodes[0].url, px[1].url, px[2].url], KEY_PREFIX=prefix,
                      NODE_TIMEOUT=1.5, TTL=30.0)  # fmt: skip
    b = redlock_alias([px[0].url, nodes[1].url, nodes[2].url], KEY_PREFIX=prefix,
                      NODE_TIMEOUT=0.3, TTL=30.0)  # fmt: skip
    outcome: dict[str, Any] = {}

    def take() -> None:
        try:
            outcome["a"] = a.acquire("k", timeout=0)
        except (LockNotAcquired, NodesUnavailable) as exc:
            outcome["a"] = exc

    thread = threading.Thread(target=take)
    thread.start()
    node2 = nodes[2].client()
    deadline = time.monotonic() + 5
    while not node2.exists(f"{prefix}k") and time.monotonic() < deadline:
        time.sleep(0.002)  # A's acquire has run on node 2; its reply is 200 ms away
    assert node2.exists(f"{prefix}k"), "A's acquire never reached node 2"
    assert admin.force_release("k") == 2  # nodes 0 and 2 held A's key
    held_b = b.acquire("k", timeout=0)
    assert held_b.token == high + 1  # B's token came from node 1: equal to A's
    thread.join(10)
    a_result = outcome["a"]
    assert not hasattr(a_result, "token") or a_result.token != held_b.token, (
        "two leases share a fencing token"
    )
    assert isinstance(a_result, LockNotAcquired | NodesUnavailable), a_result
    assert held_b.release() is True


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
        before = counters(nodes, prefix)
        swallowed = sum(p.counters.swallowed["down"] for p in dropping)
        for p in dropping:
            p.set("drop-replies")
        with pytest.raises((NodesUnavailable, LockNotAcquired)):
            a.acquire("k", timeout=0)
        after = counters(nodes, prefix)
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
