"""Pytest fixtures that give a test real ``redis-server`` nodes in one line.

Enabled automatically (``pytest11`` entry point ``django_redlock``) once django-redlock is
installed; ``-p no:django_redlock`` turns it off. Needs no Django settings.

- ``redis_node``: one fresh node per test (a ``RedisNode``).
- ``redis_nodes``: three fresh nodes per test (a ``RedisNodes``).
- ``redis_node_factory``: ``factory(count=1, **kwargs) -> RedisNodes``; kwargs as
  ``RedisNodes.start`` (``unix``, ``persistence``, ``extra_args``, ...). Stopped after the test.
- ``redis_node_factory_session``: the same, stopped at the end of the session, for suites that
  share nodes between tests.
- ``redis_sentinel_group``: a master, a replica and three sentinels (``SentinelGroup``).
- ``redis_cluster``: a 3-master Redis Cluster (``ClusterGroup``).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Protocol

import pytest

from django_redlock.testing import RedisNode, RedisNodes, RedisServerNotFound, find_redis_server
from django_redlock.testing.cluster import ClusterGroup
from django_redlock.testing.sentinel import SentinelGroup


class RedisNodeFactory(Protocol):
    """Starts nodes that are stopped when the fixture's scope ends."""

    def __call__(self, count: int = 1, **kwargs: Any) -> RedisNodes: ...


class _Factory:
    """Keeps every ``RedisNodes`` it started so teardown can stop them all."""

    def __init__(self) -> None:
        self.started: list[RedisNodes] = []

    def __call__(self, count: int = 1, **kwargs: Any) -> RedisNodes:
        nodes = RedisNodes.start(count, **kwargs)
        self.started.append(nodes)
        return nodes

    def stop(self) -> None:
        for nodes in reversed(self.started):
            nodes.stop()
        self.started.clear()


def _factory_for_scope() -> Iterator[RedisNodeFactory]:
    factory = _Factory()
    try:
        yield factory
    finally:
        factory.stop()


@pytest.fixture
def redis_node_factory() -> Iterator[RedisNodeFactory]:
    """A factory of nodes that are all stopped after the test."""
    yield from _factory_for_scope()


@pytest.fixture(scope="session")
def redis_node_factory_session() -> Iterator[RedisNodeFactory]:
    """A factory of nodes that are all stopped at the end of the session."""
    yield from _factory_for_scope()


@pytest.fixture
def redis_nodes(redis_node_factory: RedisNodeFactory) -> RedisNodes:
    """Three fresh, independent nodes on free loopback ports."""
    return redis_node_factory(3)


@pytest.fixture
def redis_node(redis_node_factory: RedisNodeFactory) -> RedisNode:
    """One fresh node on a free loopback port."""
    return redis_node_factory(1)[0]


@pytest.fixture
def redis_sentinel_group() -> Iterator[SentinelGroup]:
    """A fresh master, replica and three sentinels; ``node_setting()`` is its NODES entry."""
    with SentinelGroup.start() as group:
        yield group


@pytest.fixture
def redis_cluster() -> Iterator[ClusterGroup]:
    """A fresh 3-master Redis Cluster; ``node_setting()`` is its NODES entry (the alias
    needs a hash tag in KEY_PREFIX)."""
    with ClusterGroup.start(3) as cluster:
        yield cluster


def pytest_report_header(config: pytest.Config) -> str:
    """Say which redis-server the fixtures run."""
    try:
        return f"django-redlock: redis-server {find_redis_server()}"
    except RedisServerNotFound as exc:
        return f"django-redlock: {exc}"
