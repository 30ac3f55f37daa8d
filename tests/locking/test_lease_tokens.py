"""Two leases of different names, of any kinds, racing on the same nodes never share a token,
and both are granted: each owns the token its grants gave on a quorum, or the one whose token
a racer passed draws a fresh one. The plans run
against real redis-server nodes, each node running the two callers' calls in an order chosen
here (what callers on separate connections produce). Nothing of the nodes' answers is made
up."""

from __future__ import annotations

from collections.abc import Callable, Generator
from typing import Any

import pytest

from django_redlock.engine.plans import acquire_limits_plan, acquire_many_plan, acquire_plan
from django_redlock.engine.state import AliasState, LeaseRecord, NodeView
from django_redlock.inspection import get_lock
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


def _leases(result: object) -> list[LeaseRecord]:
    if isinstance(result, LeaseRecord):
        return [result]
    assert isinstance(result, list), f"not granted: {result!r}"
    return result


def _tokens(result: object) -> set[int]:
    return {lease.token for lease in _leases(result)}


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


#: Per case: each node's counter (offset from a common one) and the order in which the nodes
#: run the two callers' attempts.
ORDERS = {
    # nodes 0 and 1 at one counter, node 2 far behind; node 0 runs A then B, node 1 B then A:
    # each wins all three nodes, the highest token given by different nodes. A's write-back
    # moves node 2 onto it; B's then finds nodes 1 and 2 past it, and draws a fresh token.
    "lagging": ((0, 0, -500), [("a", 0), ("b", 0), ("b", 1), ("a", 1), ("a", 2), ("b", 2)]),
    # every node at one counter, the grants interleaved (A then B on nodes 0 and 2, B then A
    # on node 1): A owns its lower token on nodes 0 and 2, B its higher one on the same.
    "interleaved": ((0, 0, 0), [("a", 0), ("b", 0), ("b", 1), ("a", 1), ("a", 2), ("b", 2)]),
}


@pytest.mark.parametrize("order", list(ORDERS))
@pytest.mark.parametrize(("kind_a", "kind_b"), PAIRS, ids=[f"{a}-{b}" for a, b in PAIRS])
def test_leases_of_other_names_racing_on_the_nodes_never_share_a_token(
    redis_node_factory: Callable[..., RedisNodes],
    redlock_alias: Callable[..., LockManager],
    kind_a: str,
    kind_b: str,
    order: str,
) -> None:
    """Both win, with tokens of their own (see ORDERS). Where A's grants and B's interleave,
    A used to take the highest token, which B's grants gave, and confirm it with a write-back
    that only raised counters that were below it; where a node lagged, B's write-back did the
    same where it was not a permit. Either way A and B held one token."""
    nodes = redis_node_factory(3)
    manager = redlock_alias(nodes, TTL=TTL)
    manager.acquire("init", timeout=0).release()  # the nodes' fence state
    clients = [node.client() for node in nodes]
    fence = manager.engine.state.keys.fence
    counter = int(clients[0].hget(fence, "token")) + 1000
    offsets, runs = ORDERS[order]
    for client, offset in zip(clients, offsets, strict=True):
        client.hset(fence, "token", counter + offset)
    views: list[NodeView] = [
        FakeNode(f"n{i}", client.info("server")["run_id"]) for i, client in enumerate(clients)
    ]
    state = AliasState(prefix=manager.engine.state.keys.prefix, node_timeout=0.5,
                       drift_factor=0.01, ttl=TTL)  # fmt: skip
    state.longest_ttl_ms = int(TTL * 1000)

    callers = {
        "a": OrderedCaller(_plan(kind_a, "a", state, views), clients),
        "b": OrderedCaller(_plan(kind_b, "b", state, views), clients),
    }
    for who, node in runs:
        callers[who].run_on(node)
    callers["a"].answer()
    callers["b"].answer()
    callers["a"].finish()  # A's write-back, if any, runs first on every node
    callers["b"].finish()
    tokens_a, tokens_b = _tokens(callers["a"].result), _tokens(callers["b"].result)
    assert not tokens_a & tokens_b, f"shared tokens: {tokens_a & tokens_b}"
    assert min(tokens_b) > max(tokens_a)
    counters = [int(client.hget(fence, "token")) for client in clients]
    assert max(counters) == max(tokens_b)  # no token drawn beyond B's
    for lease in _leases(callers["a"].result) + _leases(callers["b"].result):
        if lease.kind != "read":  # readers' tokens are not listed
            info, _ = get_lock(manager.alias, lease.name)
            assert info is not None and info.token == lease.token, (lease.name, info)
