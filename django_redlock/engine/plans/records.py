"""The plans of fenced records (:mod:`..scripts.records`): write one beside a held lease's lock
on every node it reached, read one from every node. Both await every node's reply (until the
node timeout), not only a quorum's."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from ..keyspace import quorum
from ..replies import Call, NodeFailure, Request, node_errors
from ..scripts.records import READ_RECORD, STORE_RECORD, STORED
from ..state import AliasState, LeaseRecord, NodeView, Plan


@dataclass(frozen=True)
class RecordRead:
    """A record as read from the nodes: the values of the highest token (``token`` None and no
    values when no node has it), and how many nodes answered of how many."""

    token: int | None
    values: tuple[bytes, ...]
    answered: int
    total: int
    #: per node label, why it gave no answer
    errors: dict[str, str] = field(default_factory=dict)

    @property
    def quorate(self) -> bool:
        """True when a quorum answered: a record written on a quorum is then seen."""
        return self.answered >= quorum(self.total)


def store_record_plan(
    state: AliasState,
    nodes: Sequence[NodeView],
    lease: LeaseRecord,
    fields: Sequence[tuple[str, bytes | str]],
    ttl: float,
) -> Plan[int]:
    """Write the record of ``lease.name`` on every node the lease reached, where it still
    holds the lock and no newer token's record is; returns on how many nodes it was written."""
    args: list[Any] = [lease.owner, lease.token, max(1, round(ttl * 1000))]
    for name, value in fields:
        args += [name, value]
    call = Call(STORE_RECORD, (lease.key, state.keys.record(lease.name)), tuple(args))
    reached = lease.reached or (True,) * len(nodes)
    calls: list[Call | None] = [
        call if node.run_id is not None and reached[i] else None for i, node in enumerate(nodes)
    ]
    replies = yield Request(calls, state.node_timeout)
    return sum(1 for reply in replies if reply == STORED)


def read_record_plan(
    state: AliasState, nodes: Sequence[NodeView], name: str, fields: Sequence[str]
) -> Plan[RecordRead]:
    """Read the record of ``name`` from every node; the highest token's values win."""
    call = Call(READ_RECORD, (state.keys.record(name),), tuple(fields))
    calls: list[Call | None] = [call if node.run_id is not None else None for node in nodes]
    replies = yield Request(calls, state.node_timeout)
    answers = [reply for reply in replies if not isinstance(reply, NodeFailure)]
    best: tuple[int, tuple[bytes, ...]] | None = None
    for token, *values in answers:
        if token is not None and (best is None or int(token) > best[0]):
            best = (int(token), tuple(bytes(v or b"") for v in values))
    return RecordRead(
        token=None if best is None else best[0],
        values=() if best is None else best[1],
        answered=len(answers),
        total=len(nodes),
        errors=node_errors(nodes, replies),
    )
