"""Two ``limits()`` sets racing through a lagging node never share a token. The plans run
against real redis-server nodes, their calls executed there one by one in an order chosen
here: the order in which each node runs concurrent callers' calls (what callers on separate
connections produce), with node counters apart (what a lagging node leaves). Nothing of the
nodes' answers is made up."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from django_redlock.engine.plans import acquire_limits_plan
from django_redlock.engine.state import AliasState, LeaseRecord
from django_redlock.locking.manager import LockManager
from django_redlock.testing import RedisNodes
from tests.support.ordered_plans import OrderedCaller
from tests.support.scripted import FakeNode


@pytest.mark.parametrize(
    ("first", "second"),
    [
        ({"x": 1, "y": 1}, {"z": 1, "w": 1}),  # four free semaphores
        ({"x": 2, "y": 1}, {"z": 1, "x": 2}),  # both hold a permit of x
    ],
    ids=["distinct", "shared-semaphore"],
)
def test_two_sets_racing_through_a_lagging_node_never_share_a_token(
    redis_node_factory: Callable[..., RedisNodes],
    redlock_alias: Callable[..., LockManager],
    first: dict[str, int],
    second: dict[str, int],
) -> None:
    """Node 0's counter at c, node 1 far behind, node 2 at c + 1. A's attempt runs first on
    nodes 0 and 1, B's first on node 2: each wins a quorum, with node 1 behind. B's write-back
    reaches node 1 first and raises it to B's last token; A's then finds node 1 past A's first
    token, though below its last. It used to confirm (only the last token was checked), so A
    and B held a token in common (two holders of x with one token, in the second case)."""
    nodes = redis_node_factory(3)
    manager = redlock_alias(nodes, TTL=5.0)
    manager.acquire("init", timeout=0).release()  # the nodes' fence state
    clients = [node.client() for node in nodes]
    fence = manager.engine.state.keys.fence
    counter = int(clients[0].hget(fence, "token"))
    for client, value in zip(clients, (counter, counter - 500, counter + 1), strict=True):
        client.hset(fence, "token", value)
    run_ids = [client.info("server")["run_id"] for client in clients]
    views = [FakeNode(f"n{i}", run_id) for i, run_id in enumerate(run_ids)]
    state = AliasState(prefix=manager.engine.state.keys.prefix, node_timeout=0.5,
                       drift_factor=0.01, ttl=5.0)  # fmt: skip
    state.longest_ttl_ms = 5000

    def caller(limits: dict[str, int]) -> OrderedCaller:
        plan = acquire_limits_plan(state, views, list(limits), list(limits.values()), 5.0)
        return OrderedCaller(plan, clients)

    a, b = caller(first), caller(second)
    a.run_on(0), b.run_on(2), a.run_on(2), b.run_on(0), a.run_on(1), b.run_on(1)
    a.answer()
    b.answer()
    if b.request is not None and b.request.wait:  # B's write-back reaches node 1 first
        b.run_on(1)
    a.finish()
    b.finish()
    tokens = [
        {lease.token for lease in caller.result} if isinstance(caller.result, list) else set()
        for caller in (a, b)
    ]
    assert not tokens[0] & tokens[1], f"shared tokens: {tokens[0] & tokens[1]}"
    won = [c.result for c in (a, b) if isinstance(c.result, list)]
    assert won, "neither won: the order above no longer makes the race"
    assert all(isinstance(lease, LeaseRecord) for leases in won for lease in leases)
    lost = [c.result for c in (a, b) if not isinstance(c.result, list)]
    assert all(failure.raced for failure in lost)  # tried again at once by the policy
