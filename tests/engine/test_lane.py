"""The single-node lane against a real redis-server: it is the path a free lock takes, and
everything it does not settle itself (a busy name, a paused node, a connection the server
closed, scripts flushed) still comes out as the general path's would."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import Any

import pytest

from django_redlock.engine import lane
from django_redlock.exceptions import LockNotAcquired, NodesUnavailable
from django_redlock.locking.manager import LockManager
from tests.support.waiting import until

targets = sys.modules["django_redlock.engine.targets"]


@pytest.fixture
def plan_calls(monkeypatch: pytest.MonkeyPatch) -> dict[str, int]:
    """How often the acquire and release plans ran (the lane runs neither for a free lock)."""
    counts = {"acquire": 0, "release": 0}

    def counting(name: str, real: Callable[..., Any]) -> Callable[..., Any]:
        def plan(*args: Any, **kwargs: Any) -> Any:
            counts[name] += 1
            return real(*args, **kwargs)

        return plan

    monkeypatch.setattr(targets, "acquire_plan", counting("acquire", targets.acquire_plan))
    monkeypatch.setattr(lane, "release_plan", counting("release", lane.release_plan))
    return counts


@pytest.fixture
def one_node(redis_node_factory: Any, redlock_alias: Any) -> tuple[Any, LockManager]:
    node = redis_node_factory(1)
    return node, redlock_alias(node, NODE_TIMEOUT=0.3, TTL=5)


def test_a_free_lock_takes_the_lane_and_a_busy_one_the_plan(
    one_node: tuple[Any, LockManager], plan_calls: dict[str, int]
) -> None:
    _, manager = one_node
    manager.acquire("warm", timeout=0).release()  # a new node joins through the plan's rejoin
    plan_calls.update(acquire=0, release=0)
    first = manager.acquire("lane", timeout=0)
    assert plan_calls == {"acquire": 0, "release": 0}
    with pytest.raises(LockNotAcquired):
        manager.acquire("lane", timeout=0)
    assert plan_calls["acquire"] == 1  # the busy reply is the plan's to decide
    assert first.release() is True
    second = manager.acquire("lane", timeout=0)
    assert second.token > first.token
    assert second.release() is True
    assert plan_calls == {"acquire": 1, "release": 0}


def test_a_paused_node_times_the_lane_out_and_its_late_grant_is_given_back(
    one_node: tuple[Any, LockManager],
) -> None:
    """The attempt times out (NODE_TIMEOUT), the plan sends the give-back behind it on the
    same connection, and once the node resumes it runs both: no key is left, and the next
    lock reads the replies in order and works."""
    nodes, manager = one_node
    held = manager.acquire("warm", timeout=0)
    held.release()
    nodes[0].pause()
    try:
        started = time.monotonic()
        with pytest.raises(NodesUnavailable):
            manager.acquire("paused", timeout=0)
        assert time.monotonic() - started < 5.0
    finally:
        nodes[0].resume()
    client = nodes[0].client()
    key = f"{manager.config.key_prefix}paused"
    until(lambda: client.exists(key) == 0, 5, "the late grant was given back")
    lease = manager.acquire("paused", timeout=0)
    assert lease.token > held.token + 1  # the late grant drew a token too
    assert lease.release() is True


def test_a_connection_the_server_closed_is_replaced(one_node: tuple[Any, LockManager]) -> None:
    nodes, manager = one_node
    manager.acquire("closed", timeout=0).release()
    killed = nodes[0].client().client_kill_filter(_type="normal", skipme=True)
    assert killed >= 1
    lease = manager.acquire("closed", timeout=0)
    assert lease.release() is True


def test_flushed_scripts_are_sent_in_full(
    one_node: tuple[Any, LockManager], plan_calls: dict[str, int]
) -> None:
    nodes, manager = one_node
    manager.acquire("flushed", timeout=0).release()
    plan_calls.update(acquire=0, release=0)
    nodes[0].client().script_flush()
    lease = manager.acquire("flushed", timeout=0)  # NOSCRIPT, then EVAL
    nodes[0].client().script_flush()
    assert lease.release() is True
    assert plan_calls == {"acquire": 0, "release": 0}
    assert nodes[0].client().exists(f"{manager.config.key_prefix}flushed") == 0
