"""An idempotent request's kept response, on the nodes of its lock's alias.

The record sits beside the lock (``<KEY_PREFIX>__record__:<name>``, so under the alias's
prefix and, on a cluster, in the lock's hash slot). The engine writes it
(:meth:`~django_redlock.engine.Engine.store_record`, the Lua script ``STORE_RECORD``) on every
node the lease reached, and only where that lease still holds the lock and no record of a
newer token is there: a holder whose lease expired, or was overtaken, can never replace what
a later holder stored.

Reading asks every node and keeps the record of the highest token; it needs a quorum of
answers (as the lock did), so a record written on a quorum is always seen: any two quorums
share a node.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..engine import RecordRead, quorum
from ..exceptions import NodesUnavailable

if TYPE_CHECKING:
    from ..engine import Engine
    from ..locking.manager import Lease

#: The fields of a kept response (besides the token): the request's fingerprint, the
#: response's status and headers (JSON), its body.
FIELDS = ("fingerprint", "meta", "body")


@dataclass(frozen=True)
class Record:
    """A kept response as read back."""

    token: int
    fingerprint: str
    meta: bytes
    body: bytes


def _engine(lease: Lease) -> Engine:
    engine: Engine = lease.engine
    return engine


def node_count(lease: Lease) -> int:
    """How many nodes ``lease``'s alias (or shard) has."""
    return _engine(lease).node_count


def _fields(values: Sequence[bytes | str]) -> list[tuple[str, bytes | str]]:
    return list(zip(FIELDS, values, strict=True))


def store(lease: Lease, values: Sequence[bytes | str], ttl: float) -> int:
    """Keep ``values`` (one per :data:`FIELDS`) for ``ttl`` seconds on every node where
    ``lease`` still holds its lock; returns on how many nodes it was written."""
    return _engine(lease).store_record(lease.record, _fields(values), ttl)


async def astore(lease: Lease, values: Sequence[bytes | str], ttl: float) -> int:
    """Asyncio twin of :func:`store`."""
    return await _engine(lease).astore_record(lease.record, _fields(values), ttl)


def read(lease: Lease) -> Record | None:
    """The record kept for ``lease``'s name (highest token of all nodes), or None."""
    found = _engine(lease).read_record(lease.name, FIELDS, lease.record.pinned)
    return _record(lease.name, found)


async def aread(lease: Lease) -> Record | None:
    """Asyncio twin of :func:`read`."""
    found = await _engine(lease).aread_record(lease.name, FIELDS, lease.record.pinned)
    return _record(lease.name, found)


def _record(name: str, found: RecordRead) -> Record | None:
    """The record read, or None; NodesUnavailable without a quorum of answers (a record
    written on a quorum might be on the nodes that did not answer)."""
    if not found.quorate:
        raise NodesUnavailable(
            name,
            answered=found.answered,
            quorum=quorum(found.total),
            total=found.total,
            errors=found.errors,
        )
    if found.token is None:
        return None
    fingerprint, meta, body = found.values
    return Record(found.token, fingerprint.decode("utf-8", "replace"), meta, body)
