"""Loss means loss (docs/production.md): a node that answers late (frozen with SIGSTOP for a
moment) during
``extend()``, an auto-extend renewal or a release never forfeits a valid lease, never deletes its
key, and is never reported as a lost lease."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import pytest

from django_redlock.exceptions import LockNotAcquired, NodesUnavailable
from django_redlock.locking.manager import LockManager
from django_redlock.testing import RedisNode, RedisNodes

Nodes = Callable[..., RedisNodes]
Alias = Callable[..., LockManager]


def freeze(nodes: Sequence[RedisNode], seconds: float) -> threading.Timer:
    """SIGSTOP ``nodes`` now and SIGCONT them after ``seconds`` (from a timer thread)."""
    for node in nodes:
        node.pause()

    def thaw() -> None:
        for node in nodes:
            node.resume()

    timer = threading.Timer(seconds, thaw)
    timer.start()
    return timer


def refused_while(other: LockManager, name: str, seconds: float) -> int:
    """Try ``name`` on ``other`` (one attempt at a time) for ``seconds``; returns how many
    attempts were made. Fails the test if any attempt gets the lock."""
    attempts, deadline = 0, time.monotonic() + seconds
    while time.monotonic() < deadline:
        attempts += 1
        try:
            lease = other.acquire(name, timeout=0)
        except (LockNotAcquired, NodesUnavailable):
            time.sleep(0.01)
            continue
        lease.release()
        pytest.fail(f"a second client got {name!r} while the first lease was valid")
    return attempts


def test_extend_that_times_out_keeps_the_lease(
    redis_node_factory: Nodes, redlock_alias: Alias, lost_signals: list[dict[str, Any]]
) -> None:
    """extend() whose node answers after NODE_TIMEOUT raises NodesUnavailable, but the lease
    stays valid and held: no lock_lost, and its key is not deleted behind the late renewal, so
    nobody else can take the name (before the fix: LockLost, and another client got the name
    0.35 s into a 30 s lease)."""
    nodes = redis_node_factory(1)
    manager = redlock_alias(nodes, TTL=30.0, NODE_TIMEOUT=0.05)
    lease = manager.acquire("hiccup:extend", timeout=0)
    timer = freeze(nodes, 0.3)
    with pytest.raises(NodesUnavailable):
        lease.extend()
    timer.join()
    assert not lease.lost and lease.validity > 25 and not lost_signals
    refused_while(manager, "hiccup:extend", 0.3)
    assert lease.release() is True


@pytest.mark.parametrize(("count", "frozen"), [(1, 1), (3, 2)], ids=["1-node", "3-nodes-2-frozen"])
def test_watchdog_survives_a_node_freeze_during_a_renewal(
    redis_node_factory: Nodes,
    redlock_alias: Alias,
    lost_signals: list[dict[str, Any]],
    count: int,
    frozen: int,
) -> None:
    """auto_extend=True with TTL 0.6 s renews every 0.2 s; a 0.2 s freeze of a quorum of nodes
    during a renewal makes it time out. The watchdog retries while the lease is valid, so a
    second client never gets the name while the block runs, and leaving the block raises
    nothing (before the fix: the renewal marked the lease lost and queued a delete)."""
    nodes = redis_node_factory(count)
    manager = redlock_alias(nodes, TTL=0.6, NODE_TIMEOUT=0.05)
    with manager.lock("hiccup:watchdog", auto_extend=True, timeout=0) as lease:
        time.sleep(0.25)  # one renewal done; the next one falls into the freeze
        freeze(nodes[:frozen], 0.2).join()
        assert refused_while(manager, "hiccup:watchdog", 1.2) > 10
        assert not lease.lost and lease.validity > 0
    assert not lost_signals


def test_release_that_times_out_is_not_a_loss(
    redis_node_factory: Nodes, redlock_alias: Alias, lost_signals: list[dict[str, Any]]
) -> None:
    """The node freezes for 0.5 s as the block ends: the release times out, but the lease had
    ~10 s left and no node said "not yours". Leaving the block raises nothing, no lock_lost is
    sent, and the queued compare-and-delete frees the name when the node resumes."""
    nodes = redis_node_factory(1)
    manager = redlock_alias(nodes, TTL=10.0, NODE_TIMEOUT=0.05)
    with manager.lock("hiccup:release", timeout=0) as lease:
        timer = freeze(nodes, 0.5)
    assert lease.released and not lost_signals
    timer.join()
    deadline = time.monotonic() + 2
    while nodes[0].client().exists(f"{manager.config.key_prefix}hiccup:release"):
        assert time.monotonic() < deadline, "the queued release did not run"
        time.sleep(0.01)
    manager.acquire("hiccup:release", timeout=0).release()
