"""Fixtures of the lane tests (blocking and asyncio)."""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

import pytest

from django_redlock.engine import alane, lane
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
    monkeypatch.setattr(lane, "release_plan", counting("release", lane.release_plan))
    monkeypatch.setattr(alane, "release_plan", counting("release", alane.release_plan))
    return counts


@pytest.fixture
def one_node(redis_node_factory: Any, redlock_alias: Any) -> tuple[Any, LockManager]:
    node = redis_node_factory(1)
    return node, redlock_alias(node, NODE_TIMEOUT=0.3, TTL=5)
