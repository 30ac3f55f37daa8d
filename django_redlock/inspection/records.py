"""What inspection returns: held locks merged over an alias's nodes, node health (read by
:mod:`..nodes.probe`), errors.

Lock owners are secrets (whoever knows one can release or extend that lease): nothing here
carries more than their first four hex characters, or a one-way fingerprint.
"""

from __future__ import annotations

import dataclasses
import datetime
import hashlib
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from ..engine import LockValue, quorum


class InspectionError(Exception):
    """Base class of the errors an operator sees (one line, no secrets)."""


class NotHeld(InspectionError):
    """The lock name is not held on any reachable node."""


class HolderChanged(InspectionError):
    """The lock is now held by another lease than the one the operator saw."""


class Unreachable(InspectionError):
    """No reachable node holds the lock, but a node could not be read: it may hold it."""


def mask_owner(owner: str) -> str:
    """The first four characters of an owner and an ellipsis."""
    return f"{owner[:4]}…" if owner else ""


def lease_id(owner: str) -> str:
    """A public fingerprint of one lease: 16 hex chars of the SHA-256 of its owner.

    The owner is 128 random bits, so the fingerprint reveals nothing usable, yet it tells one
    lease from the next even when their tokens print alike.
    """
    return hashlib.sha256(owner.encode()).hexdigest()[:16]


def readers_id(owners: Iterable[str]) -> str:
    """The :func:`lease_id` of a set of read leases: it changes when a reader comes or goes,
    so a force-release naming the readers listed leaves readers that changed alone."""
    return lease_id(" ".join(sorted(owners)))


@dataclass(frozen=True)
class NodeError:
    """A node that could not be read."""

    alias: str
    node: str
    message: str

    def __str__(self) -> str:
        return f"alias {self.alias!r}: node {self.node} unreachable ({self.message})"


@dataclass(frozen=True)
class LockInfo:
    """One held lock merged over the alias's nodes.

    ``nodes_held`` counts the nodes holding the main holder's lease (the owner on most nodes);
    ``nodes_other`` counts nodes holding a different owner's value (a stale minority copy).
    ``ttl_ms`` is the smallest remaining TTL among the holding nodes, the moment the first copy
    expires (-1: no expiry). ``token`` is the lease's token (:func:`lease_value`).
    ``lease_id`` tells the lease apart from any later one (see :func:`lease_id`).
    ``waiters`` counts the callers waiting for the name now (registrations still ahead on a
    node's clock; the largest count over the nodes).
    """

    alias: str
    name: str
    nodes_held: int
    nodes_total: int
    ttl_ms: int
    token: int
    owner: str
    acquired_at: datetime.datetime | None
    host: str
    pid: int | None
    lease_id: str
    nodes_other: int = 0
    waiters: int = 0
    #: "lock", "semaphore", "read" (the read leases of a read-write lock) or "write" (its
    #: write lease)
    kind: str = "lock"
    #: a semaphore's number of permits (None for other kinds)
    permits: int | None = None
    #: every lease holding the name: a lock's one, a semaphore's permits, the read leases;
    #: each a dict of slot (a permit's; None otherwise), token (None for readers), owner
    #: (masked), lease_id, ttl_ms, nodes_held (see :func:`holder_of`)
    holders: tuple[dict[str, Any], ...] = ()

    @property
    def quorum_held(self) -> bool:
        return self.nodes_held >= quorum(self.nodes_total)

    @property
    def kind_label(self) -> str:
        """What the admin shows: "lock", "semaphore 2/3 permits", "read: 3 readers", "write"."""
        if self.kind == "semaphore":
            return f"semaphore {len(self.holders)}/{self.permits} permits"
        if self.kind == "read":
            return f"read: {len(self.holders)} reader{'s' if len(self.holders) != 1 else ''}"
        return self.kind

    def as_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (``acquired_at`` as ISO 8601)."""
        acquired = self.acquired_at.isoformat() if self.acquired_at else None
        return {**dataclasses.asdict(self), "acquired_at": acquired}


@dataclass
class LockPage:
    """One page of locks over one or more aliases and the nodes that could not be read."""

    locks: list[LockInfo]
    has_more: bool
    errors: list[NodeError]


def main_holder(held: Sequence[tuple[LockValue, int]]) -> list[tuple[LockValue, int]]:
    """The entries of the owner on most nodes (ties: the highest token)."""
    groups: dict[str, list[tuple[LockValue, int]]] = {}
    for entry in held:
        groups.setdefault(entry[0].owner, []).append(entry)
    return max(groups.values(), key=lambda group: (len(group), max(v.token for v, _ in group)))


def lease_value(values: Sequence[LockValue], total: int) -> LockValue:
    """The value of one holder's lease among its nodes' (``total`` in the alias) that carries
    the lease's token: as the acquire chose it, the highest token a quorum of the nodes
    holds, else the highest (the nodes that granted from further on hold their own, higher
    one; a write-back writes the lease's token into the values it raised)."""
    counts = Counter(value.token for value in values)
    agreed = [token for token, count in counts.items() if count >= quorum(total)]
    token = max(agreed) if agreed else max(counts)
    return next(value for value in values if value.token == token)


def merge(
    alias: str,
    name: str,
    total: int,
    per_node: Sequence[tuple[LockValue, int] | None],
    waiters: int = 0,
) -> LockInfo | None:
    held = [entry for entry in per_node if entry is not None]
    if not held:
        return None
    main = main_holder(held)
    values = [value for value, _ in main]
    ttls = [pttl for _, pttl in main if pttl >= 0]
    first = lease_value(values, total)
    acquired = min((v.acquired_ms for v in values if v.acquired_ms is not None), default=None)
    return LockInfo(
        alias=alias,
        name=name,
        nodes_held=len(main),
        nodes_total=total,
        ttl_ms=min(ttls) if ttls else -1,
        token=first.token,
        owner=mask_owner(first.owner),
        acquired_at=None
        if acquired is None
        else datetime.datetime.fromtimestamp(acquired / 1000, tz=datetime.UTC),
        host=first.host,
        pid=first.pid,
        lease_id=lease_id(first.owner),
        nodes_other=len(held) - len(main),
        waiters=waiters,
        kind="write" if first.write else "lock",
        holders=(holder_of(first.token, first.owner, min(ttls) if ttls else -1, len(main)),),
    )


def holder_of(
    token: int | None, owner: str, ttl_ms: int, nodes_held: int, slot: int | None = None
) -> dict[str, Any]:
    """One lease holding a name, as listed (the owner masked); every kind's holders have the
    same keys (``slot`` is a semaphore permit's slot, None for a lock or a reader)."""
    return {
        "slot": slot,
        "token": token,
        "owner": mask_owner(owner),
        "lease_id": lease_id(owner),
        "ttl_ms": ttl_ms,
        "nodes_held": nodes_held,
    }


def merge_semaphore(
    alias: str,
    name: str,
    total: int,
    permits: int,
    slots: Sequence[Sequence[tuple[LockValue, int] | None]],
    waiters: int = 0,
) -> LockInfo | None:
    """One row for a semaphore: its held permits (one merged lock per slot) as ``holders``;
    the row's token, owner, host and lease are the newest permit's, ``nodes_held`` that of
    its best-replicated permit and ``ttl_ms`` the longest time a permit has left."""
    held = [(k, merge(alias, name, total, per_node)) for k, per_node in enumerate(slots)]
    permits_held = [(k, info) for k, info in held if info is not None]
    if not permits_held:
        return None
    newest = max((info for _, info in permits_held), key=lambda info: info.token)
    holders = tuple({**info.holders[0], "slot": k} for k, info in permits_held)
    return dataclasses.replace(
        newest,
        nodes_held=max(info.nodes_held for _, info in permits_held),
        nodes_other=0,
        ttl_ms=max(info.ttl_ms for _, info in permits_held),
        waiters=waiters,
        kind="semaphore",
        permits=permits,
        holders=holders,
    )


def merge_readers(
    alias: str, name: str, total: int, readers: Sequence[dict[str, int] | None], waiters: int = 0
) -> LockInfo | None:
    """One row for a read-write lock's readers: ``readers`` per node maps owner -> ms left.
    Its ``lease_id`` is :func:`readers_id` of them, ``token`` 0 (readers' tokens are not kept
    on the nodes)."""
    counts: dict[str, list[int]] = {}
    for per_node in readers:
        for owner, left in (per_node or {}).items():
            counts.setdefault(owner, []).append(left)
    if not counts:
        return None
    holders = tuple(
        holder_of(None, owner, min(lefts), len(lefts)) for owner, lefts in sorted(counts.items())
    )
    return LockInfo(
        alias=alias,
        name=name,
        nodes_held=max(h["nodes_held"] for h in holders),
        nodes_total=total,
        ttl_ms=max(h["ttl_ms"] for h in holders),
        token=0,
        owner="",
        acquired_at=None,
        host="",
        pid=None,
        lease_id=readers_id(counts),
        waiters=waiters,
        kind="read",
        holders=holders,
    )
