"""Kept responses on a Redlock set (3 real redis-server processes): written beside the lock
on each node the lease holds, read from every node, the newest token wins, a quorum of
answers needed."""

from __future__ import annotations

from typing import Any

import pytest

from django_redlock.exceptions import NodesUnavailable
from django_redlock.request_locks import records


def test_the_newest_token_wins_and_a_minority_loss_keeps_the_record(
    redis_node_factory: Any, redlock_alias: Any, unique_name: str
) -> None:
    nodes = redis_node_factory(3)
    manager = redlock_alias(nodes, NODE_TIMEOUT=0.2)
    first = manager.acquire(unique_name, ttl=5, timeout=0)
    assert records.store(first, ["fp", "{}", b"first"], 60) == 3
    first.release()
    second = manager.acquire(unique_name, ttl=5, timeout=0)
    reached = second.record.reached
    second.record.reached = (True, False, False)  # as if only node 0 took the write
    assert records.store(second, ["fp", "{}", b"second"], 60) == 1
    second.record.reached = reached
    found = records.read(second)
    assert found is not None and (found.body, found.token) == (b"second", second.token)
    second.release()
    nodes[0].kill()  # the newest record's only node: the older one is what is left
    third = manager.acquire(unique_name, ttl=5, timeout=0)
    found = records.read(third)
    assert found is not None and (found.body, found.token) == (b"first", first.token)
    third.release()


def test_a_read_without_a_quorum_of_answers_raises(
    redis_node_factory: Any, redlock_alias: Any, unique_name: str
) -> None:
    """Two of three nodes gone: a record written on a quorum may be on them, so the read does
    not say "none" (the request gets 503, the view does not run)."""
    nodes = redis_node_factory(3)
    manager = redlock_alias(nodes, NODE_TIMEOUT=0.2)
    lease = manager.acquire(unique_name, ttl=5, timeout=0)
    nodes[1].kill()
    nodes[2].kill()
    with pytest.raises(NodesUnavailable, match="only 1 of 3"):
        records.read(lease)
