"""Read held locks and node health from Redis; the only package the admin and command use.

Locks are found with ``SCAN MATCH <prefix>*`` (never ``KEYS``) on every node at once, stopping as
soon as enough names are known for the page asked for, so the cost of a page grows with the locks
shown, not the database size (a name prefix that few locks match is the exception: every node is
read to its end). The values and TTLs of one page are read with one pipelined ``GET``/``PTTL``
round trip per node (:mod:`.reader`); what comes back is described in :mod:`.records`.
:func:`all_locks` reads everything in one pass (the ``list`` command without ``--limit``).
"""

from __future__ import annotations

from collections.abc import Iterable

from ..engine import SEMAPHORE_MARKER, SemaphoreName, escape_glob
from ..locking.manager import LockManager
from ..locking.registry import locks
from ..nodes.probe import NodeHealth, Target, probe
from .reader import SCAN_COUNT, AliasInspector
from .records import (
    HolderChanged,
    InspectionError,
    LockInfo,
    LockPage,
    NodeError,
    NotHeld,
    Unreachable,
    lease_id,
    main_holder,
    mask_owner,
    merge,
)

__all__ = [
    "SCAN_COUNT",
    "AliasInspector",
    "HolderChanged",
    "InspectionError",
    "LockInfo",
    "LockPage",
    "NodeError",
    "NodeHealth",
    "NotHeld",
    "Unreachable",
    "aliases",
    "all_locks",
    "escape_glob",
    "force_release",
    "get_lock",
    "inspector_for",
    "inspectors_of",
    "lease_id",
    "list_locks",
    "mask_owner",
    "node_health",
]


def aliases(using: str | None = None) -> list[str]:
    """``[using]`` or every configured alias."""
    return [using] if using is not None else list(locks)


def list_locks(
    using: Iterable[str] | None = None, prefix: str = "", offset: int = 0, limit: int = 50
) -> LockPage:
    """Locks ``offset``..``offset + limit`` over the aliases in order, names starting with
    ``prefix``. Reads at most ``offset + limit + 1`` names per alias (and shard)."""
    wanted = offset + limit + 1
    found: list[tuple[AliasInspector, str]] = []
    opened: list[AliasInspector] = []
    try:
        for alias in aliases() if using is None else using:
            if len(found) >= wanted:
                break
            shards = inspectors_of(locks[alias])
            opened.extend(shards)
            found.extend(_scan_shards(shards, prefix, wanted - len(found)))
        page = found[offset : offset + limit]
        infos: list[LockInfo] = []
        for inspector in opened:
            names = [name for owner, name in page if owner is inspector]
            if names:
                infos.extend(inspector.lock_infos(names))
        errors = _errors_of(opened)
    finally:
        for inspector in opened:
            inspector.close()
    order = {(owner.alias, name): i for i, (owner, name) in enumerate(page)}
    infos.sort(key=lambda info: order[(info.alias, info.name)])
    return LockPage(infos, len(found) > offset + limit, errors)


def _scan_shards(
    shards: list[AliasInspector], prefix: str, need: int | None
) -> list[tuple[AliasInspector, str]]:
    """The names of one alias (each with the inspector of its shard), up to ``need``: in
    name order when every shard gave name order, else shard after shard."""
    found = [(shard, name) for shard in shards for name in shard.scan_names(prefix, need)]
    if len(shards) > 1 and all(shard.in_name_order for shard in shards):
        found.sort(key=lambda entry: entry[1])
    return found if need is None else found[:need]


def _errors_of(inspectors: Iterable[AliasInspector]) -> list[NodeError]:
    """Each failed node once (the shards of an alias share its nodes)."""
    return list(dict.fromkeys(error for inspector in inspectors for error in inspector.errors))


def inspectors_of(manager: LockManager) -> list[AliasInspector]:
    """One inspector per shard of ``manager``'s alias (one for an alias that is not spread)."""
    return [AliasInspector(manager, shard) for shard in range(len(manager.shards))]


def inspector_for(manager: LockManager, name: str) -> AliasInspector:
    """The inspector of the shard that holds ``name``."""
    return AliasInspector(manager, manager.shard_index(name))


def all_locks(
    alias: str, prefix: str = "", batch: int = 500
) -> tuple[list[LockInfo], list[NodeError]]:
    """Every held lock of ``alias`` whose name starts with ``prefix``, in listing order: one
    SCAN pass over the nodes, then the values read ``batch`` names at a time (paging with
    :func:`list_locks` would scan the names before each page again)."""
    shards = inspectors_of(locks[alias])
    try:
        found = _scan_shards(shards, prefix, None)
        infos: list[LockInfo] = []
        for start in range(0, len(found), batch):
            chunk = found[start : start + batch]
            for inspector in shards:
                names = [name for owner, name in chunk if owner is inspector]
                if names:
                    infos.extend(inspector.lock_infos(names))
        order = {name: i for i, (_, name) in enumerate(found)}
        infos.sort(key=lambda info: order[info.name])
        return infos, _errors_of(shards)
    finally:
        for inspector in shards:
            inspector.close()


def get_lock(alias: str, name: str) -> tuple[LockInfo | None, list[NodeError]]:
    """The merged state of one lock (None when no reachable node holds it)."""
    with inspector_for(locks[alias], name) as inspector:
        infos = inspector.lock_infos([name])
        return (infos[0] if infos else None), inspector.errors


def node_health(using: Iterable[str] | None = None) -> list[NodeHealth]:
    """Health of every node of the aliases (all of them by default), alias after alias; every
    node of every alias is read at the same time (see :mod:`..nodes.probe`)."""
    managers = [locks[alias] for alias in (aliases() if using is None else using)]
    targets = [Target(m.config.shard_configs[0], len(m.shards)) for m in managers]
    return [reading.health for readings in probe(targets) for reading in readings]


def force_release(
    alias: str, name: str, token: int | None = None, lease: str | None = None
) -> tuple[int, LockInfo]:
    """Delete ``name`` on every node, advancing the alias's fence counter; returns how many
    nodes deleted it and what was released.

    With ``token`` and/or ``lease`` (a :func:`lease_id`) only that lease is released: its
    per-node values are re-read and each is passed as the engine's ``expected_value``, so a
    lease acquired meanwhile is never touched (raises :class:`HolderChanged`). Without either,
    whatever holds the name is deleted. Raises :class:`NotHeld` when nothing holds it, and
    :class:`Unreachable` instead when a node that could hold it did not answer.
    """
    manager = locks[alias]
    with inspector_for(manager, name) as inspector:
        values, _, markers = inspector.read_page([name])
        per_node, errors = values[0], inspector.errors
        if markers[0] is not None and markers[0].startswith(SEMAPHORE_MARKER):
            return _force_release_semaphore(inspector, name, markers[0], token, lease)
        if markers[0] is not None:  # a read-write lock's readers
            return _force_release_readers(inspector, name, markers[0], token, lease)
    info = merge(alias, name, len(manager.config.nodes), per_node)
    if info is None and errors:
        more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
        raise Unreachable(
            f"{errors[0]}{more}; lock {name!r} is not held on the nodes that answered, "
            "nothing was released"
        )
    if info is None:
        raise NotHeld(f"lock {name!r} is not held on alias {alias!r}")
    if token is None and lease is None:
        try:
            return manager.force_release(name), info
        except SemaphoreName as exc:  # it became a semaphore's since it was read
            raise HolderChanged(
                f"{name!r} on alias {alias!r} is now held as a semaphore; nothing was released"
            ) from exc
    if (token is not None and info.token != token) or (
        lease is not None and info.lease_id != lease
    ):
        raise HolderChanged(
            f"lock {name!r} on alias {alias!r} is now held by another lease (token {info.token}); "
            "nothing was released"
        )
    raws = {value.raw for value, _ in main_holder([e for e in per_node if e is not None])}
    deleted = sum(manager.force_release(name, expected_value=raw) for raw in sorted(raws))
    return deleted, info


def _held_kind(inspector: AliasInspector, name: str, kind: str) -> LockInfo:
    """``name``'s merged row, which must be of ``kind`` (else :class:`HolderChanged`: it
    changed hands since the marker was read)."""
    infos = inspector.lock_infos([name])
    alias = inspector.alias
    if not infos:
        raise NotHeld(f"{name!r} is not held on alias {alias!r}")
    if infos[0].kind != kind:
        raise HolderChanged(
            f"{name!r} on alias {alias!r} is now held as kind {infos[0].kind!r}; nothing "
            "was released"
        )
    return infos[0]


def _force_release_readers(
    inspector: AliasInspector, name: str, marker: str, token: int | None, lease: str | None
) -> tuple[int, LockInfo]:
    """Force-release every read lease of the read-write lock ``name``: the engine deletes its
    readers' marker (``marker``, as read) and, with it, the readers, advancing the fence
    counter, so no reader can renew afterwards. ``lease`` names the readers listed (their
    :func:`~.records.readers_id`): once a reader came or went, nothing is released. Returns
    how many nodes the readers were deleted on."""
    info = _held_kind(inspector, name, "read")
    if (token is not None and info.token != token) or (
        lease is not None and info.lease_id != lease
    ):
        raise HolderChanged(
            f"read-write lock {name!r} on alias {inspector.alias!r} is held by other readers "
            "now; nothing was released"
        )
    return inspector.engine.force_release(name, marker), info


def _force_release_semaphore(
    inspector: AliasInspector, name: str, marker: str, token: int | None, lease: str | None
) -> tuple[int, LockInfo]:
    """Force-release every permit of the semaphore ``name`` (each slot holder's exact values,
    with the engine's ``key=``), then its marker; ``token``/``lease`` name the row's newest
    permit, as listed. Returns the most nodes any permit was deleted on.

    The marker (``marker``, as read) is deleted only if it is still that value and no slot was
    taken again meanwhile: a permit granted in between keeps its marker, so the name cannot be
    taken as a lock while that permit is valid."""
    info = _held_kind(inspector, name, "semaphore")
    alias = inspector.alias
    if (token is not None and info.token != token) or (
        lease is not None and info.lease_id != lease
    ):
        raise HolderChanged(
            f"semaphore {name!r} on alias {alias!r} has another newest permit now (token "
            f"{info.token}); nothing was released"
        )
    engine = inspector.engine
    permits = info.permits or 0
    deleted = 0
    for slot, per_node in enumerate(inspector.read_slots(name, permits)):
        held = [entry for entry in per_node if entry is not None]
        key = inspector.keys.permit(name, slot)
        for raw in sorted({value.raw for value, _ in main_holder(held)} if held else ()):
            deleted = max(deleted, engine.force_release(name, raw, key=key))
    if not any(any(per_node) for per_node in inspector.read_slots(name, permits)):
        engine.force_release(name, marker)  # the name is free for any kind again
    return deleted, info
