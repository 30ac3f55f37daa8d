"""Notes: short strings kept on every node of an alias next to its locks (the markers of unique
tasks, ``django_redlock.jobs.notes``), changed by one Lua call per node that compares the id
a note names.

A note lives at ``<prefix>__unique__:<name>`` (a bookkeeping key: lock names cannot start with
``__``), holds ``"<state>|<id>"`` and expires on its own (``PX``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from ..keyspace import RESERVED_MARK
from ..replies import Call, NodeFailure, Request
from ..scripts.script import Script
from ..state import AliasState, NodeView, Plan

#: ``ARGV[1]`` the operation (``get``, ``set``, ``replace``, ``delete``), ``ARGV[2]`` the id a
#: change expects (compared with the text after the ``|``), ``ARGV[3]`` a new value,
#: ``ARGV[4]`` its lifetime in ms. ``replace`` also writes where there is no note.
NOTE = Script(
    "note",
    """
local current = redis.call('GET', KEYS[1])
local op = ARGV[1]
if op == 'get' then return current end
if op == 'set' or (op == 'replace' and not current) then
  redis.call('SET', KEYS[1], ARGV[3], 'PX', ARGV[4])
  return 1
end
if not current then return 0 end
local bar = string.find(current, '|', 1, true)
if not bar or string.sub(current, bar + 1) ~= ARGV[2] then return 0 end
if op == 'replace' then
  redis.call('SET', KEYS[1], ARGV[3], 'PX', ARGV[4])
elseif op == 'delete' then
  redis.call('DEL', KEYS[1])
end
return 1
""",
)


@dataclass
class NoteReplies:
    """The nodes' replies to one note call: ``values`` (None where a node gave none) and
    ``errors`` (node label -> why it gave none)."""

    values: list[Any]
    errors: dict[str, str] = field(default_factory=dict)

    @property
    def answered(self) -> int:
        return len(self.values) - len(self.errors)

    @classmethod
    def of(cls, labels: Sequence[str], replies: Sequence[Any]) -> NoteReplies:
        """One call's replies, one per node (a :class:`~..replies.NodeFailure` where a node
        gave none), by the nodes' ``labels``."""
        outcome = cls([None if isinstance(r, NodeFailure) else r for r in replies])
        for label, reply in zip(labels, replies, strict=True):
            if isinstance(reply, NodeFailure):
                outcome.errors[label] = str(reply)
        return outcome


class NoteHolder(Protocol):
    """What holds notes: an :class:`~.core.Engine` (or a simulated one, which keeps them in
    memory: ``django_redlock.testing.simulate``)."""

    state: AliasState

    def note(
        self, name: str, op: str, expected: str = "", value: str = "", ttl: float = 0.0
    ) -> NoteReplies: ...


def note_key(engine: NoteHolder, name: str) -> str:
    """The key of the note ``name``."""
    return f"{engine.state.keys.prefix}{RESERVED_MARK}unique__:{name}"


def note_plan(
    state: AliasState, name: str, op: str, expected: str, value: str, ttl: float
) -> Callable[[Sequence[NodeView]], Plan[list[Any]]]:
    """The plan of one note operation on every node (its replies, one per node)."""
    key = f"{state.keys.prefix}{RESERVED_MARK}unique__:{name}"
    ms = max(1, int(ttl * 1000))
    timeout = state.node_timeout * 4

    def plan(nodes: Sequence[NodeView]) -> Plan[list[Any]]:
        calls: list[Call | None] = [
            None if node.run_id is None else Call(NOTE, (key,), (op, expected, value, ms))
            for node in nodes
        ]
        replies = yield Request(calls, timeout, None)
        return replies

    return plan


def call_note(
    engine: NoteHolder,
    name: str,
    op: str,
    expected: str = "",
    value: str = "",
    ttl: float = 0.0,
) -> NoteReplies:
    """Run one note operation on every node of ``engine``."""
    return engine.note(name, op, expected, value, ttl)
