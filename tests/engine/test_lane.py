"""The single-node lane against a real redis-server: it is the path a free lock takes, and
everything it does not settle itself (a busy name, a paused node, a connection the server
closed, scripts flushed) still comes out as the general path's would."""

from __future__ import annotations

import signal
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


class Interrupted(Exception):
    """What the tests' signal handler raises (as a worker timeout would)."""


@pytest.mark.parametrize("count", [1, 3], ids=["lane", "three nodes"])
def test_a_call_interrupted_as_it_is_written_never_shifts_the_replies(
    redis_node_factory: Any, redlock_alias: Any, count: int
) -> None:
    """CPython's sendall runs signal handlers once the bytes are out: a handler that raises
    there used to leave the call on the wire with no place for its reply, so every later call
    on that connection read the reply of the one before (a TypeError, another call's token, a
    lock granted twice). Now the connection is dropped: the next calls read their own."""
    nodes = redis_node_factory(count)
    manager = redlock_alias(nodes, NODE_TIMEOUT=1.0, TTL=30)
    warm = manager.acquire("warm", timeout=0)
    link = warm._record.pinned.links[0]
    warm.release()
    real = link._output

    def write_then_raise(data: bytes) -> None:
        link._output = real
        real(data)
        raise Interrupted

    link._output = write_then_raise
    with pytest.raises(Interrupted):
        manager.acquire("x", timeout=0)
    tokens = []
    for name in ("y", "z", "w"):
        lease = manager.acquire(name, timeout=0)
        tokens.append(lease.token)
        assert lease.release() is True
    assert tokens == sorted(tokens) and len(set(tokens)) == 3
    client = nodes[0].client()
    prefix = manager.config.key_prefix
    assert [client.exists(f"{prefix}{name}") for name in ("y", "z", "w")] == [0, 0, 0]


@pytest.mark.parametrize("count", [1, 3], ids=["lane", "three nodes"])
def test_a_call_interrupted_while_it_waits_gives_its_grant_back(
    redis_node_factory: Any, redlock_alias: Any, count: int
) -> None:
    """A signal handler raises while the attempt waits for a paused node: the give-back goes
    out behind the attempt on the same connection, so once the node resumes no key is left,
    and the calls after it read their own replies."""
    nodes = redis_node_factory(count)
    manager = redlock_alias(nodes, NODE_TIMEOUT=5.0, TTL=30)
    before = manager.acquire("warm", timeout=0)
    before.release()

    def alarm(signum: int, frame: Any) -> None:
        raise Interrupted

    previous = signal.signal(signal.SIGALRM, alarm)
    for node in nodes:
        node.pause()
    try:
        signal.setitimer(signal.ITIMER_REAL, 0.3)
        with pytest.raises(Interrupted):
            manager.acquire("x", timeout=0)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
        for node in nodes:
            node.resume()
    key = f"{manager.config.key_prefix}x"
    until(lambda: all(node.client().exists(key) == 0 for node in nodes), 5, "the grant given back")
    lease = manager.acquire("x", timeout=0)
    assert lease.token > before.token
    assert lease.release() is True
