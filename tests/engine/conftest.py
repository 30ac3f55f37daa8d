"""Fixtures of the lane tests (blocking and asyncio)."""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

import pytest

from django_redlock.engine import afan_lane, alane, fan_lane, lane
from django_redlock.locking.manager import LockManager

targets = sys.modules["django_redlock.engine.targets"]


@pytest.fixture
def plan_calls(monkeypatch: pytest.MonkeyPatch) -> dict[str, int]:
    """How often the acquire and release plans ran (a lane runs neither for a free lock)."""
    counts = {"acquire": 0, "release": 0}

    def counting(name: str, real: Callable[..., Any]) -> Callable[..., Any]:
        def plan(*args: Any, **kwargs: Any) -> Any:
            counts[name] += 1
            return real(*args, **kwargs)

        return plan

    monkeypatch.setattr(targets, "acquire_plan", counting("acquire", targets.acquire_plan))
    for module in (lane, alane, fan_lane, afan_lane):
        monkeypatch.setattr(module, "release_plan", counting("release", module.release_plan))
    return counts


@pytest.fixture
def one_node(redis_node_factory: Any, redlock_alias: Any) -> tuple[Any, LockManager]:
    node = redis_node_factory(1)
    return node, redlock_alias(node, NODE_TIMEOUT=0.3, TTL=5)


@pytest.fixture(params=[1, 3], ids=["one node", "three nodes"])
def lane_nodes(
    request: pytest.FixtureRequest, redis_node_factory: Any, redlock_alias: Any
) -> tuple[Any, LockManager]:
    """One node (the single-node lane) or three (the lane for a set of nodes)."""
    nodes = redis_node_factory(request.param)
    return nodes, redlock_alias(nodes, NODE_TIMEOUT=0.3, TTL=5)
