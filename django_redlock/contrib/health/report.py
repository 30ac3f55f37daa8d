"""What the health check reads and decides: one probe of every node of an alias (``PING``,
``INFO``, ``maxmemory-policy``, the fence hash's mark), and whether a quorum can vote."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass
from typing import Any

from ...inspection import AliasInspector, NodeHealth, aliases, inspectors_of
from ...registry import locks

#: Policies under which Redis never evicts keys, so a lock key lives until its TTL. Nodes that
#: deny ``CONFIG`` report "unknown": not counted against them (``check --deploy`` warns, W006).
SAFE_POLICIES = ("noeviction", "unknown")


@dataclass(frozen=True)
class NodeStatus:
    """One node as the health check sees it; ``votes``: it can count toward a quorum."""

    index: int
    up: bool
    quarantined: bool
    eviction_policy: str | None
    latency_ms: float | None

    @property
    def votes(self) -> bool:
        return self.up and not self.quarantined and self.eviction_policy in SAFE_POLICIES


@dataclass(frozen=True)
class AliasStatus:
    """One alias: healthy when at least ``quorum`` of its nodes can vote."""

    alias: str
    quorum: int
    nodes: tuple[NodeStatus, ...]

    @property
    def voting(self) -> int:
        return sum(1 for node in self.nodes if node.votes)

    @property
    def healthy(self) -> bool:
        return self.voting >= self.quorum

    def problems(self) -> list[str]:
        """One line per node that cannot vote (no addresses: these lines may be public)."""
        lines = []
        for node in self.nodes:
            if not node.up:
                lines.append(f"node {node.index} unreachable")
            elif node.quarantined:
                lines.append(f"node {node.index} in the restart quarantine")
            elif not node.votes:
                lines.append(f"node {node.index} has maxmemory-policy {node.eviction_policy}")
        return lines

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready; nodes by index, never their addresses."""
        return {
            "alias": self.alias,
            "healthy": self.healthy,
            "quorum": self.quorum,
            "voting": self.voting,
            "problems": self.problems(),
            "nodes": [{**asdict(node), "votes": node.votes} for node in self.nodes],
        }


def alias_status(alias: str) -> AliasStatus:
    """Probe every node of ``alias`` (each within the alias's node timeout); a spread cluster
    alias's nodes through every shard (each shard's master has its own fence mark)."""
    manager = locks[alias]
    shards = [_probe(inspector) for inspector in inspectors_of(manager)]
    first = shards[0][0]
    nodes = tuple(
        NodeStatus(
            index=node.index,
            up=all(health[i].up and marks[i] is not None for health, marks, _ in shards),
            quarantined=any(
                _quarantined(health[i], marks[i], used) for health, marks, used in shards
            ),
            eviction_policy=node.maxmemory_policy,
            latency_ms=node.latency_ms,
        )
        for i, node in enumerate(first)
    )
    return AliasStatus(alias, manager.config.quorum, nodes)


def _probe(
    inspector: AliasInspector,
) -> tuple[list[NodeHealth], list[tuple[str, int] | None], bool]:
    """One shard's node health, fence marks, and whether any of its nodes ever granted a
    lease (a set that never did is brand new: its first acquire initialises every node at
    once, engine/trust.py, so none is quarantined yet)."""
    with inspector:
        health = inspector.health()
        marks = inspector.fence_marks()
    return health, marks, any(mark is not None and mark[1] > 0 for mark in marks)


def _quarantined(node: NodeHealth, mark: tuple[str, int] | None, used: bool) -> bool:
    return node.up and mark is not None and used and mark[0] != node.run_id


def statuses(using: Iterable[str] | None = None) -> list[AliasStatus]:
    """:func:`alias_status` of ``using``'s aliases (default: every configured alias)."""
    return [alias_status(alias) for alias in (aliases() if using is None else using)]
