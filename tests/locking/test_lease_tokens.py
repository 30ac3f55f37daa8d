"""Two leases of different names, of any kinds, racing on the same nodes never share a token,
and both are granted: the one whose token a racer passed draws a fresh one. The plans run
against real redis-server nodes, each node running the two callers' calls in an order chosen
here (what callers on separate connections produce). Nothing of the nodes' answers is made
up."""

from __future__ import annotations

from collections.abc import Callable, Generator
from typing import Any

import pytest

from django_redlock.engine.plans import acquire_limits_plan, acquire_many_plan, acquire_plan
from django_redlock.engine.state import AliasState, LeaseRecord, NodeView
from django_redlock.locking.manager import LockManager
from django_redlock.testing import RedisNodes
from tests.support.ordered_plans import OrderedCaller
from tests.support.scripted import FakeNode

Plan = Generator[Any, Any, Any]
TTL = 5.0


def _plan(kind: str, name: str, state: AliasState, views: list[NodeView]) -> Plan:
    """One attempt at a lease of ``kind`` on ``name`` (two names for the sets)."""
    if kind == "many":
        return acquire_many_plan(state, views, [f"{name}.1", f"{name}.2"], TTL)
    if kind == "limits":
        return acquire_limits_plan(state, views, [f"{name}.1", f"{name}.2"], [2, 1], TTL)
    if kind == "permit":
        return acquire_plan(state, views, name, TTL, permits=2)
    return acquire_plan(state, views, name, TTL, rw=kind if kind in ("read", "write") else "")


def _tokens(result: object) -> set[int]:
    if isinstance(result, LeaseRecord):
        return {result.token}
    assert isinstance(result, list), f"not granted: {result!r}"
    return {lease.token for lease in result}


PAIRS = [
    ("lock", "lock"),
    ("lock", "permit"),
    ("permit", "lock"),
    ("read", "lock"),
    ("lock", "write"),
    ("many", "lock"),
    ("lock", "limits"),
    ("many", "many"),
]


@pytest.mark.parametrize(("kind_a", "kind_b"), PAIRS, ids=[f"{a}-{b}" for a, b in PAIRS])
def test_leases_of_other_names_racing_on_the_nodes_never_share_a_token(
    redis_node_factory: Callable[..., RedisNodes],
    redlock_alias: Callable[..., LockManager],
    kind_a: str,
    kind_b: str,
) -> None:
    """Nodes 0 and 1 at one counter, node 2 far behind. Node 0 runs A's attempt, then B's;
    node 1 runs B's, then A's: each wins all three nodes, with the same highest token from
    different nodes. A's write-back moves node 2 onto that token; B's then finds node 2 and
    node 0 past it. B used to confirm it anyway where it was not a permit (a lock's
    write-back was not strict), so A and B held one token. Now B draws the next token and
    raises its winners to it."""
    nodes = redis_node_factory(3)
    manager = redlock_alias(nodes, TTL=TTL)
    manager.acquire("init", timeout=0).release()  # the nodes' fence state
    clients = [node.client() for node in nodes]
    fence = manager.engine.state.keys.fence
    counter = int(clients[0].hget(fence, "token")) + 1000
    for client, value in zip(clients, (counter, counter, counter - 500), strict=True):
        client.hset(fence, "token", value)
    views: list[NodeView] = [
        FakeNode(f"n{i}", client.info("server")["run_id"]) for i, client in enumerate(clients)
    ]
    state = AliasState(prefix=manager.engine.state.keys.prefix, node_timeout=0.5,
                       drift_factor=0.01, ttl=TTL)  # fmt: skip
    state.longest_ttl_ms = int(TTL * 1000)

    a = OrderedCaller(_plan(kind_a, "a", state, views), clients)
    b = OrderedCaller(_plan(kind_b, "b", state, views), clients)
    a.run_on(0), b.run_on(0), b.run_on(1), a.run_on(1), a.run_on(2), b.run_on(2)
    a.answer()
    b.answer()
    a.finish()  # A's write-back runs first on every node
    b.finish()
    tokens_a, tokens_b = _tokens(a.result), _tokens(b.result)
    assert not tokens_a & tokens_b, f"shared tokens: {tokens_a & tokens_b}"
    assert min(tokens_b) > max(tokens_a)  # B's fresh tokens are above every counter it saw
    counters = [int(client.hget(fence, "token")) for client in clients]
    assert counters == [max(tokens_b)] * 3  # B moved its winners onto its last token
