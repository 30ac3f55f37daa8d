"""What the health check reads and decides: one probe of every node of an alias (``PING``,
``INFO`` for the role, eviction policy and run id, the fence hash's mark; see
:mod:`django_redlock.nodes.probe`), and whether a quorum can vote."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass
from typing import Any

from ...engine import Keyspace
from ...inspection import aliases
from ...locking.registry import locks
from ...nodes.probe import NodeHealth, Reading, Target, probe


@dataclass(frozen=True)
class NodeStatus:
    """One node as the health check sees it; ``votes``: it can count toward a quorum.

    ``evicts`` and ``replica`` are the probe's verdicts (:class:`NodeHealth`): a policy other
    than ``noeviction`` can evict lock keys (a policy no reading could give, "unknown", is
    not held against the node; ``check --deploy`` warns, W006), and a replica refuses the lock
    scripts' writes."""

    index: int
    up: bool
    quarantined: bool
    eviction_policy: str | None
    latency_ms: float | None
    #: ``master``, or ``slave`` for a replica
    role: str | None = None
    evicts: bool = False
    replica: bool = False
    #: answered the PING but refused the probe's INFO or fence-hash reading (an ACL user
    #: without ``+info``): not up for the health check, but not unreachable either
    refused: bool = False

    @property
    def votes(self) -> bool:
        return self.up and not self.quarantined and not self.evicts and not self.replica

    def problem(self) -> str | None:
        """Why the node cannot vote (no address: this line may be public); None if it can."""
        if not self.up and self.refused:
            return (
                f"node {self.index} answered but refused the health probe's INFO or fence "
                "reading (its ACL user needs +info and read access to the alias's keys)"
            )
        if not self.up:
            return f"node {self.index} unreachable"
        if self.quarantined:
            return f"node {self.index} in the restart quarantine"
        if self.replica:
            return f"node {self.index} is a replica"
        if self.evicts:
            return f"node {self.index} has maxmemory-policy {self.eviction_policy}"
        return None


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
        return [line for line in (node.problem() for node in self.nodes) if line is not None]

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready; nodes by index, never their addresses."""
        return {
            "alias": self.alias,
            "healthy": self.healthy,
            "quorum": self.quorum,
            "voting": self.voting,
            "problems": self.problems(),
            "nodes": [
                {**asdict(node), "evicts": node.evicts, "votes": node.votes} for node in self.nodes
            ],
        }


def alias_status(alias: str) -> AliasStatus:
    """:func:`statuses` of one alias."""
    return statuses([alias])[0]


def statuses(using: Iterable[str] | None = None) -> list[AliasStatus]:
    """Probe every node of ``using``'s aliases (default: every configured alias), all at the
    same time, each within the alias's socket timeout; a spread cluster alias's nodes through
    every shard (each shard's master has its own fence mark)."""
    names = aliases() if using is None else list(using)
    shards: list[list[Target]] = []
    for alias in names:
        manager = locks[alias]
        configs = manager.config.shard_configs
        shards.append(
            [Target(c, len(manager.shards), fence=Keyspace(c.key_prefix).fence) for c in configs]
        )
    readings = iter(probe([target for targets in shards for target in targets]))
    report = []
    for alias, targets in zip(names, shards, strict=True):
        per_shard = [next(readings) for _ in targets]
        report.append(_status(alias, per_shard))
    return report


def _status(alias: str, per_shard: list[list[Reading]]) -> AliasStatus:
    """An alias's status from each shard's readings of its nodes."""
    used = [any(r.fence_mark is not None and r.fence_mark[1] > 0 for r in s) for s in per_shard]
    first = per_shard[0]
    nodes = tuple(
        NodeStatus(
            index=reading.health.index,
            up=all(_answered(shard[i]) for shard in per_shard),
            refused=all(shard[i].health.up for shard in per_shard)
            and not all(_answered(shard[i]) for shard in per_shard),
            quarantined=any(
                _quarantined(shard[i], fresh) for shard, fresh in zip(per_shard, used, strict=True)
            ),
            eviction_policy=reading.health.maxmemory_policy,
            latency_ms=reading.health.latency_ms,
            role=reading.health.role,
            evicts=reading.health.evicts,
            replica=reading.health.replica,
        )
        for i, reading in enumerate(first)
    )
    return AliasStatus(alias, locks[alias].config.quorum, nodes)


def _answered(reading: Reading) -> bool:
    """The node answered the probe, its run id and its fence hash included."""
    health: NodeHealth = reading.health
    return health.up and health.run_id is not None and reading.fence_mark is not None


def _quarantined(reading: Reading, used: bool) -> bool:
    """A node of a set that has granted leases (``used``: a set that never did is brand new,
    its first acquire initialises every node at once, engine/trust.py) whose fence mark lacks
    its current run id."""
    mark = reading.fence_mark
    return _answered(reading) and mark is not None and used and mark[0] != reading.health.run_id
