"""An idempotent request's kept response, on the nodes of its lock's alias.

The record sits beside the lock (``<KEY_PREFIX>__record__:<name>``, so under the alias's
prefix and, on a cluster, in the lock's hash slot). It is written by the engine's own
connections (:meth:`~django_redlock.engine.Engine.on_each_node`, the script
``STORE_RECORD``) on every node the lease reached, and only where that lease still holds the
lock and no record of a newer token is there: a holder whose lease expired, or was
overtaken, can never replace what a later holder stored.

Reading asks every node and keeps the record of the highest token; it needs a quorum of
answers (as the lock did), so a record written on a quorum is always seen: any two
quorums share a node.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..engine import quorum
from ..engine.replies import Call, NodeFailure, node_errors
from ..engine.scripts.records import READ_RECORD, STORE_RECORD, STORED
from ..exceptions import NodesUnavailable

if TYPE_CHECKING:
    from ..engine import Engine, LeaseRecord
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


def _parts(lease: Lease) -> tuple[Engine, LeaseRecord, str]:
    engine: Engine = lease._engine
    record: LeaseRecord = lease._record
    return engine, record, engine.state.keys.record(record.name)


def _store_call(lease: Lease, values: Sequence[bytes | str], ttl: float) -> Call:
    _, record, key = _parts(lease)
    pairs: list[str | int | bytes] = []
    for field, value in zip(FIELDS, values, strict=True):
        pairs += [field, value]
    args = (record.owner, record.token, max(1, round(ttl * 1000)), *pairs)
    return Call(STORE_RECORD, (record.key, key), args)  # type: ignore[arg-type]


def store(lease: Lease, values: Sequence[bytes | str], ttl: float) -> int:
    """Keep ``values`` (one per :data:`FIELDS`) for ``ttl`` seconds on every node where
    ``lease`` still holds its lock; returns on how many nodes it was written."""
    engine, record, _ = _parts(lease)
    call = _store_call(lease, values, ttl)
    replies = engine.on_each_node(call, record.reached, record.pinned)
    return sum(1 for reply in replies if reply == STORED)


async def astore(lease: Lease, values: Sequence[bytes | str], ttl: float) -> int:
    """Asyncio twin of :func:`store`."""
    engine, record, _ = _parts(lease)
    call = _store_call(lease, values, ttl)
    replies = await engine.aon_each_node(call, record.reached, record.pinned)
    return sum(1 for reply in replies if reply == STORED)


def read(lease: Lease) -> Record | None:
    """The record kept for ``lease``'s name (highest token of all nodes), or None."""
    engine, record, key = _parts(lease)
    replies = engine.on_each_node(Call(READ_RECORD, (key,), FIELDS), (), record.pinned)
    return _newest(engine, record.name, replies)


async def aread(lease: Lease) -> Record | None:
    """Asyncio twin of :func:`read`."""
    engine, record, key = _parts(lease)
    replies = await engine.aon_each_node(Call(READ_RECORD, (key,), FIELDS), (), record.pinned)
    return _newest(engine, record.name, replies)


def _newest(engine: Engine, name: str, replies: Sequence[Any]) -> Record | None:
    """The record of the highest token among the replies; NodesUnavailable without a quorum
    of answers (a record written on a quorum might be on the nodes that did not answer)."""
    answers = [reply for reply in replies if not isinstance(reply, NodeFailure)]
    needed = quorum(len(replies))
    if len(answers) < needed:
        raise NodesUnavailable(
            name,
            answered=len(answers),
            quorum=needed,
            total=len(replies),
            errors=node_errors([_Label(label) for label in engine.labels], replies),
        )
    best: Record | None = None
    for token, fingerprint, meta, body in answers:
        if token is None:
            continue
        found = Record(int(token), _text(fingerprint), bytes(meta or b""), bytes(body or b""))
        if best is None or found.token > best.token:
            best = found
    return best


def _text(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value or "")


@dataclass
class _Label:
    label: str
