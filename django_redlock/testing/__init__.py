"""Real ``redis-server`` processes for tests and demos.

``RedisNode`` is one server on a free loopback port (or a unix socket), without persistence
unless asked; it can be paused (SIGSTOP), resumed, killed (SIGKILL) and restarted on the same
address. ``RedisNodes`` starts several at once; ``SentinelGroup`` a master, its replica and
sentinels; ``ClusterGroup`` a Redis Cluster. Every process started here is stopped by PID
when the interpreter exits, on SIGTERM/SIGINT, and (on Linux) by the kernel if this process dies.

``simulate()`` (and the pytest fixture ``redlock_simulate``) runs this process's locks without
Redis, for unit tests of code that locks (docs/testing.md). It needs Django and is imported
on first use; the rest has no Django imports: usable from any test suite.
``python -m django_redlock.testing serve`` keeps nodes running for a demo until it is
interrupted.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from django_redlock.testing.cluster import ClusterGroup
from django_redlock.testing.nodes import RedisNode, RedisNodeError, RedisNodes
from django_redlock.testing.processes import stop_all
from django_redlock.testing.sentinel import SentinelGroup
from django_redlock.testing.server import (
    RedisServerNotFound,
    find_redis_server,
    server_flavour,
    server_version,
)

if TYPE_CHECKING:
    from django_redlock.testing.simulation import Simulation, simulate


def __getattr__(name: str) -> Any:
    """``simulate`` and ``Simulation``, imported on first use (they need Django settings)."""
    if name in ("simulate", "Simulation"):
        from django_redlock.testing import simulation

        return getattr(simulation, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "ClusterGroup",
    "RedisNode",
    "RedisNodeError",
    "RedisNodes",
    "RedisServerNotFound",
    "SentinelGroup",
    "Simulation",
    "find_redis_server",
    "server_flavour",
    "server_version",
    "simulate",
    "stop_all",
]
