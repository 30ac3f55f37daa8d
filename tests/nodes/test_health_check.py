"""django_redlock.contrib.health: 200 while a quorum of every alias's nodes can vote, 503 (the
plain view) / 500 (django-health-check's view) once nodes are paused (SIGSTOP), killed,
quarantined after an empty restart, or may evict lock keys; real nodes throughout."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from django.test import Client

from django_redlock.locking.manager import LockManager
from django_redlock.testing import RedisNodes

pytestmark = pytest.mark.urls("tests.support.health_urls")


@pytest.fixture
def cluster(
    redis_node_factory: Callable[..., RedisNodes], redlock_alias: Callable[..., LockManager]
) -> tuple[RedisNodes, LockManager]:
    """Three fresh nodes as a test alias (TTL 60 s: an emptied node stays quarantined), used
    once so the cluster is initialised."""
    nodes = redis_node_factory(3)
    manager = redlock_alias(nodes, NODE_TIMEOUT=0.05, TTL=60.0)
    manager.acquire("warm-up", timeout=1).release()
    return nodes, manager


def get(client: Client, alias: str) -> tuple[int, dict[str, Any]]:
    response = client.get("/health/", {"alias": alias})
    return response.status_code, response.json()["aliases"][0]


def test_healthy_then_paused_nodes(client: Client, cluster: tuple[RedisNodes, LockManager]) -> None:
    """All up: 200 (also for every alias together, and django-health-check's view); one node
    paused: still 200 with that node listed; two paused: 503; resumed: 200."""
    nodes, manager = cluster
    status, body = get(client, manager.alias)
    assert status == 200 and body["voting"] == 3 and body["problems"] == []
    assert client.get("/health/").status_code == 200
    assert client.get("/ht/", {"format": "json"}).status_code == 200
    nodes[0].pause()
    try:
        status, body = get(client, manager.alias)
        assert status == 200 and body["problems"] == ["node 0 unreachable"]
        nodes[1].pause()
        status, body = get(client, manager.alias)
        assert status == 503 and body["voting"] == 1 and body["quorum"] == 2
        assert client.get("/health/").status_code == 503
        failing = client.get("/ht/", {"format": "json"})
        assert failing.status_code == 500 and "1/2 voting nodes" in failing.content.decode()
    finally:
        nodes[0].resume()
        nodes[1].resume()
    assert get(client, manager.alias)[0] == 200


def test_killed_nodes(client: Client, cluster: tuple[RedisNodes, LockManager]) -> None:
    """Two of three nodes killed (SIGKILL): 503, and the body names no address."""
    nodes, manager = cluster
    nodes[1].kill()
    nodes[2].kill()
    response = client.get("/health/", {"alias": manager.alias})
    assert response.status_code == 503
    body = response.json()["aliases"][0]
    assert body["problems"] == ["node 1 unreachable", "node 2 unreachable"]
    assert "127.0.0.1" not in response.content.decode()


def test_a_node_restarted_empty_is_quarantined(
    client: Client, cluster: tuple[RedisNodes, LockManager]
) -> None:
    """A node restarted without its data cannot vote for the longest TTL (60 s): 200 with
    it quarantined; with another node paused as well, 503."""
    nodes, manager = cluster
    nodes[2].restart(keep_data=False)
    status, body = get(client, manager.alias)
    assert status == 200 and body["problems"] == ["node 2 in the restart quarantine"]
    assert body["nodes"][2]["up"] and body["nodes"][2]["quarantined"]
    nodes[0].pause()
    try:
        assert get(client, manager.alias)[0] == 503
    finally:
        nodes[0].resume()


def test_a_node_that_may_evict_lock_keys_cannot_vote(
    client: Client,
    redis_node_factory: Callable[..., RedisNodes],
    redlock_alias: Callable[..., LockManager],
) -> None:
    """Two of three nodes with maxmemory-policy allkeys-lru: 503 naming the policy."""
    good = redis_node_factory(1)
    evicting = redis_node_factory(2, extra_args=("--maxmemory-policy", "allkeys-lru"))
    manager = redlock_alias([*good.urls, *evicting.urls], NODE_TIMEOUT=0.05)
    status, body = get(client, manager.alias)
    assert status == 503
    assert body["problems"] == [
        "node 1 has maxmemory-policy allkeys-lru",
        "node 2 has maxmemory-policy allkeys-lru",
    ]


def test_unknown_alias_and_methods(client: Client) -> None:
    """?alias= of no alias: 404; POST: 405."""
    assert client.get("/health/", {"alias": "nope"}).status_code == 404
    assert client.post("/health/").status_code == 405
