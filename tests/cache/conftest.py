"""Fixtures of the cache-fill tests: a redis-server for the caches, and each backend on it."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from django_redlock.testing import RedisNode
from tests.support import cache_workers as workers


@pytest.fixture(scope="module")
def cache_node(redis_node_factory_session: Any) -> RedisNode:
    """A redis-server of the test module's own for the caches."""
    node: RedisNode = redis_node_factory_session(1)[0]
    return node


@pytest.fixture(params=sorted(workers.BACKENDS))
def backend(request: pytest.FixtureRequest, cache_node: RedisNode, settings: Any) -> Iterator[str]:
    """``CACHES["default"]`` of each supported backend on the module's node."""
    settings.CACHES = workers.caches_setting(request.param, cache_node.url)
    yield request.param
