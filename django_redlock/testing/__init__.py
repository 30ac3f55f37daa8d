"""Real ``redis-server`` processes for tests and demos.

``RedisNode`` is one server on a free loopback port (or a unix socket), without persistence
unless asked; it can be paused (SIGSTOP), resumed, killed (SIGKILL) and restarted on the same
address. ``RedisNodes`` starts several at once; ``SentinelGroup`` a master, its replica and
sentinels; ``ClusterGroup`` a Redis Cluster. Every process started here is stopped by PID
when the interpreter exits, on SIGTERM/SIGINT, and (on Linux) by the kernel if this process dies.

No Django imports: usable from any test suite. ``python -m django_redlock.testing serve`` keeps
nodes running for a demo until it is interrupted.
"""

from __future__ import annotations

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

__all__ = [
    "ClusterGroup",
    "RedisNode",
    "RedisNodeError",
    "RedisNodes",
    "RedisServerNotFound",
    "SentinelGroup",
    "find_redis_server",
    "server_flavour",
    "server_version",
    "stop_all",
]
