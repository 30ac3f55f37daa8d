"""``ClusterGroup``: a Redis Cluster of real ``--cluster-enabled yes`` processes on loopback.

The slots are split evenly over the masters with ``CLUSTER ADDSLOTS``, the nodes meet with
``CLUSTER MEET`` and each replica follows its master with ``CLUSTER REPLICATE`` (no
``redis-cli`` needed). Every process is a :class:`~.node.RedisNode`, started and stopped by
PID. ``kill_master(slot)`` SIGKILLs the master of a slot, ``wait_failover()`` waits for its
replica to take over, ``migrate_slot()`` moves a slot (and its keys) to another master.
"""

from __future__ import annotations

import random
import time
from collections.abc import Iterable, Sequence
from typing import Any

from django_redlock.testing.node import RedisNode, RedisNodeError, StopOnExit
from django_redlock.testing.wire import FREE_PORTS, HOST, chosen_ports, port_free

SLOTS = 16384
#: A cluster node also listens on its port + 10000 (the cluster bus).
BUS_OFFSET = 10000


#: Ports :func:`cluster_port` hands out: their bus ports (+10000) stay in :data:`FREE_PORTS`,
#: below Linux's ephemeral range, so no client's outgoing connection takes a bus port between
#: the check and the node's bind (CI saw a bus port 39982 taken so).
CLUSTER_PORTS = range(10000, FREE_PORTS.stop - BUS_OFFSET)


def cluster_port() -> int:
    """A free port whose cluster-bus port (+10000) is free too, both outside the ephemeral
    range (see :data:`CLUSTER_PORTS`). A node given this as its ``choose_port`` picks a new
    pair when one was bound before it started."""
    for _ in range(200):
        port = random.choice(CLUSTER_PORTS)
        if port_free(port) and port_free(port + BUS_OFFSET):
            return port
    raise RedisNodeError("no free port pair (port, port + 10000) for a cluster node")


class ClusterGroup(StopOnExit):
    """``masters`` masters, each with ``replicas`` replicas."""

    def __init__(self, nodes: list[RedisNode], masters: int) -> None:
        self.nodes = nodes
        self.initial_masters = nodes[:masters]

    @classmethod
    def start(
        cls,
        masters: int = 3,
        replicas: int = 0,
        *,
        node_timeout_ms: int = 1000,
        extra_args: Iterable[str] = (),
        server: str | None = None,
        timeout: float = 30.0,
        ports: Sequence[int] | None = None,
    ) -> ClusterGroup:
        """Start the processes, assign the slots, join them and wait until every node sees the
        cluster ``ok`` (and every replica in sync).

        ``ports``: the ports to use, the masters' first (``masters * (1 + replicas)`` of them;
        default: free ports); each node's cluster bus takes its port + 10000. A wrong count
        is a ``ValueError`` and a port (or bus port) in use an ``OSError``, before anything
        starts."""
        count = masters * (1 + replicas)
        fixed: list[int] | None = None
        if ports is not None:
            what = f"{masters} masters with {replicas} replicas each"
            fixed = chosen_ports(ports, count, what, bus_offset=BUS_OFFSET)
        args = [
            "--cluster-enabled",
            "yes",
            "--cluster-config-file",
            "nodes.conf",
            "--cluster-node-timeout",
            str(node_timeout_ms),
            *extra_args,
        ]
        nodes: list[RedisNode] = []
        try:
            for i in range(count):
                port = None if fixed is None else fixed[i]
                node = RedisNode(
                    port=port, extra_args=args, server=server, choose_port=cluster_port
                )
                nodes.append(node.start())
            group = cls(nodes, masters)
            group._form(masters, replicas, timeout)
            return group
        except BaseException:
            for node in nodes:
                node.stop()
            raise

    # -- what tests use

    @property
    def seed_urls(self) -> list[str]:
        return [f"redis://{HOST}:{node.port}" for node in self.nodes]

    def node_setting(self) -> dict[str, Any]:
        """The ``NODES`` entry of this cluster: ``{"CLUSTER": [seed urls]}``."""
        return {"CLUSTER": self.seed_urls}

    def node_id(self, node: RedisNode) -> str:
        return str(node.client(decode_responses=True).execute_command("CLUSTER", "MYID"))

    def master_of(self, slot: int) -> RedisNode:
        """The node that serves ``slot`` now, as a live node sees it."""
        for node in self.nodes:
            if not node.is_running:
                continue
            for entry in node.client(decode_responses=True).execute_command("CLUSTER SLOTS"):
                if int(entry[0]) <= slot <= int(entry[1]):
                    port = int(entry[2][1])
                    return next(n for n in self.nodes if n.port == port)
        raise RedisNodeError(f"no live node knows who serves slot {slot}")

    def masters(self) -> list[RedisNode]:
        """The live nodes that are masters now."""
        return [
            n
            for n in self.nodes
            if n.is_running
            and n.client(decode_responses=True).info("replication")["role"] == "master"
        ]

    def kill_master(self, slot: int) -> RedisNode:
        """SIGKILL the master serving ``slot``; returns it."""
        node = self.master_of(slot)
        node.kill()
        return node

    def wait_failover(self, slot: int, old: RedisNode, timeout: float = 30.0) -> RedisNode:
        """Wait until a live node serves ``slot`` instead of ``old`` and the cluster is ok."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                node = self.master_of(slot)
            except Exception:  # a node that is being killed or restarted: ask again
                node = old
            if node is not old and self._all_ok():
                return node
            time.sleep(0.05)
        raise RedisNodeError(f"slot {slot} still not failed over from {old!r} after {timeout} s")

    def migrate_slot(self, slot: int, target: RedisNode, batch: int = 10) -> None:
        """Move ``slot`` and its keys to ``target`` (MIGRATING/IMPORTING, MIGRATE in batches,
        then SETSLOT NODE on every master), as ``redis-cli --cluster reshard`` does."""
        source = self.master_of(slot)
        if source is target:
            return
        src, dst = self.node_id(source), self.node_id(target)
        target.client().execute_command("CLUSTER", "SETSLOT", slot, "IMPORTING", src)
        source.client().execute_command("CLUSTER", "SETSLOT", slot, "MIGRATING", dst)
        client = source.client(decode_responses=True)
        while True:
            keys = client.execute_command("CLUSTER", "GETKEYSINSLOT", slot, batch)
            if not keys:
                break
            client.execute_command("MIGRATE", HOST, target.port, "", 0, 5000, "KEYS", *keys)
        for node in [target, source, *self.masters()]:
            node.client().execute_command("CLUSTER", "SETSLOT", slot, "NODE", dst)

    def stop(self) -> None:
        for node in self.nodes:
            node.stop()

    def __enter__(self) -> ClusterGroup:
        return self

    # -- internals

    def _form(self, masters: int, replicas: int, timeout: float) -> None:
        per = SLOTS // masters
        for i, node in enumerate(self.nodes[:masters]):
            end = SLOTS if i == masters - 1 else (i + 1) * per
            node.client().execute_command("CLUSTER", "ADDSLOTS", *range(i * per, end))
        first = self.nodes[0].client()
        for node in self.nodes[1:]:
            first.execute_command("CLUSTER", "MEET", HOST, node.port)
        deadline = time.monotonic() + timeout
        while not self._all_know(len(self.nodes)):
            self._before(deadline, "the nodes did not meet")
        for j, node in enumerate(self.nodes[masters:]):
            master_id = self.node_id(self.nodes[j % masters])
            while True:
                try:
                    node.client().execute_command("CLUSTER", "REPLICATE", master_id)
                    break
                except Exception:  # the replica has not learnt of that master yet
                    self._before(deadline, "a replica could not follow its master")
        while not (self._all_ok() and self._replicas_in_sync(masters * replicas)):
            self._before(deadline, "the cluster did not become ok")

    @staticmethod
    def _before(deadline: float, what: str) -> None:
        if time.monotonic() > deadline:
            raise RedisNodeError(what)
        time.sleep(0.05)

    def _all_know(self, count: int) -> bool:
        return all(
            int(n.client(decode_responses=True).info("cluster").get("cluster_enabled", 0)) == 1
            and _cluster_info(n).get("cluster_known_nodes") == str(count)
            for n in self.nodes
        )

    def _all_ok(self) -> bool:
        return all(
            _cluster_info(n).get("cluster_state") == "ok" for n in self.nodes if n.is_running
        )

    def _replicas_in_sync(self, count: int) -> bool:
        synced = 0
        for node in self.nodes:
            if not node.is_running:
                continue
            info = node.client(decode_responses=True).info("replication")
            synced += info["role"] == "slave" and info.get("master_link_status") == "up"
        return synced >= count


def _cluster_info(node: RedisNode) -> dict[str, str]:
    text = node.client(decode_responses=True).execute_command("CLUSTER", "INFO")
    if isinstance(text, dict):
        return {str(k): str(v) for k, v in text.items()}
    return dict(line.split(":", 1) for line in str(text).splitlines() if ":" in line)
