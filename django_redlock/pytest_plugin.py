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
- ``redlock_simulate``: ``redlock_simulate(busy=[...], unavailable=..., lost_after=...,
  using=...)`` runs this process's locks without Redis until the test ends (see
  ``django_redlock.testing.simulate``; needs Django settings). Called again, the new
  simulation replaces the previous one.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any, Protocol

import pytest

from django_redlock.testing import RedisNode, RedisNodes, RedisServerNotFound, find_redis_server
from django_redlock.testing.cluster import ClusterGroup
from django_redlock.testing.sentinel import SentinelGroup

if TYPE_CHECKING:
    from django_redlock.testing.simulation import Simulation


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


class SimulateFixture:
    """``redlock_simulate(...)``: start a simulation for the rest of the test (the one
    started before, if any, is stopped first); ``.current`` is the active one."""

    def __init__(self) -> None:
        self.current: Simulation | None = None

    def __call__(
        self,
        busy: Iterable[str] = (),
        unavailable: bool = False,
        lost_after: float | None = None,
        using: str | None = None,
    ) -> Simulation:
        from django_redlock.testing.simulation import simulate

        simulation = simulate(busy, unavailable, lost_after, using)  # checked before the swap
        self.stop()
        self.current = simulation.start()
        return simulation

    def stop(self) -> None:
        current, self.current = self.current, None
        if current is not None:
            current.stop()


@pytest.fixture
def redlock_simulate() -> Iterator[SimulateFixture]:
    """Call it to run this test's locks without Redis (``django_redlock.testing.simulate``);
    undone when the test ends."""
    fixture = SimulateFixture()
    try:
        yield fixture
    finally:
        fixture.stop()


def pytest_report_header(config: pytest.Config) -> str:
    """Say which redis-server the fixtures run."""
    try:
        return f"django-redlock: redis-server {find_redis_server()}"
    except RedisServerNotFound as exc:
        return f"django-redlock: {exc}"
