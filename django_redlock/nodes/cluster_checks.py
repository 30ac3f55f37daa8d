"""``check --deploy`` checks of cluster nodes: every master's ``maxmemory-policy`` (W004) and
a cluster whose servers are also other nodes of the same Redlock set (W008).

The master serving the alias's slot is probed with the other nodes (``checks._nodes_health``);
here every master of the cluster is, since a migration or failover can put the slot on any.
"""

from __future__ import annotations

import redis
from django.core import checks

from .cluster import ClusterSlot, slot_of
from .connections import socket_timeout
from .probe import eviction_policy
from .spec import AliasNodes, NodeSpec, url_identity


def cluster_checks(config: AliasNodes) -> list[checks.CheckMessage]:
    """W004 for each cluster master that can evict keys; W008 when a cluster node shares a
    server with another node of the set (their votes are not independent)."""
    messages: list[checks.CheckMessage] = []
    others = {node.address for node in config.nodes if node.address is not None}
    seen: dict[str, NodeSpec] = {}
    for node in config.nodes:
        if not node.cluster:
            continue
        masters = _masters(node, config)
        where = f"REDLOCK[{config.alias!r}] node {node.label}"
        for host, port, policy in masters:
            if policy not in (None, "noeviction"):
                messages.append(
                    checks.Warning(
                        f"{where}: cluster master {host}:{port} has maxmemory-policy "
                        f"{policy!r}, which can evict lock keys and fence counters.",
                        hint="Set maxmemory-policy noeviction on every master of the cluster.",
                        id="django_redlock.W004",
                    )
                )
        for host, port, _ in masters:
            address = url_identity(f"redis://{host}:{port}")[0]
            other = seen.get(address)
            if address in others or (other is not None and other is not node):
                messages.append(
                    checks.Warning(
                        f"{where}: its master {address} is also another node of this "
                        "Redlock set: one server would vote twice.",
                        hint="A cluster counts as one node: list each cluster once, and no "
                        "server of it as another node.",
                        id="django_redlock.W008",
                    )
                )
            seen[address] = node
    return messages


def _masters(node: NodeSpec, config: AliasNodes) -> list[tuple[str, int, str | None]]:
    """Every master of the cluster with its policy (None when it could not be read); an
    unreachable cluster gives none (W005 reports it)."""
    timeout = socket_timeout(config)
    locator = ClusterSlot(node.cluster, slot_of(node.hash_tag_of), timeout, node.address_remap)
    try:
        locator()
    except redis.RedisError:
        return []
    return [(h, p, _policy(node.cluster[0], h, p, timeout)) for h, p in locator.masters]


def _policy(seed: str, host: str, port: int, timeout: float) -> str | None:
    """The policy of ``host:port``, reached with the seed URL's credentials and TLS (read as
    every node's is, see :mod:`.nodes.probe`); None when it could not be read."""
    client = redis.Redis.from_url(seed, socket_timeout=timeout, socket_connect_timeout=timeout)
    client.connection_pool.connection_kwargs.update(host=host, port=port)
    try:
        return eviction_policy(client)
    except redis.RedisError:
        return None
    finally:
        client.close()
