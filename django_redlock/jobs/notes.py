"""Short notes kept on an alias's nodes: the marker of a unique task (which queued or running
task holds a key, and until when).

A note is one string at ``<prefix>__unique__:<name>``, written on every node and expiring on
its own (``PX``); it reads as the value a quorum of the nodes agree on, so a note survives the
loss of a minority of nodes as a lock does. Its value is ``"<state>|<id>"``. Every change is a
compare on the id in one Lua call, so a worker that renews or deletes a note never touches one
that a later enqueue wrote for another task.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ..engine import Engine
from ..engine.keyspace import RESERVED_MARK, quorum
from ..engine.replies import Call, NodeFailure, Request
from ..engine.scripts.script import Script
from ..engine.state import AliasState, NodeView
from ..exceptions import NodesUnavailable

#: One script for every operation on a note: ``ARGV[1]`` the operation, ``ARGV[2]`` the id a
#: change expects (compared with the id after the ``|``), ``ARGV[3]`` a new value,
#: ``ARGV[4]`` its lifetime in ms.
NOTE = Script(
    "unique_note",
    """
local current = redis.call('GET', KEYS[1])
local op = ARGV[1]
if op == 'get' then return current end
if op == 'set' then
  redis.call('SET', KEYS[1], ARGV[3], 'PX', ARGV[4])
  return 1
end
if op == 'replace' and not current then
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


@dataclass(frozen=True)
class Note:
    """What a note says: ``state`` (``"queued"`` or ``"running"``) and the task's ``id``."""

    state: str
    id: str

    @classmethod
    def parse(cls, value: Any) -> Note | None:
        if value is None or isinstance(value, NodeFailure):
            return None
        text = value.decode() if isinstance(value, bytes) else str(value)
        state, bar, ident = text.partition("|")
        return cls(state, ident) if bar else None

    def __str__(self) -> str:
        return f"{self.state}|{self.id}"


class Notes:
    """The notes of one alias's engine (``engine``: the one that holds the note's name)."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    def key(self, name: str) -> str:
        return f"{self.engine.state.keys.prefix}{RESERVED_MARK}unique__:{name}"

    def read(self, name: str) -> Note | None:
        """The note at ``name`` a quorum of the nodes agree on, or None."""
        replies = self._call(name, "get")
        values = Counter(r for r in replies if not isinstance(r, NodeFailure))
        answered = sum(values.values())
        self._check(name, answered, replies)
        for value, count in values.most_common(1):
            if count >= quorum(len(replies)):
                return Note.parse(value)
        return None

    def write(self, name: str, note: Note, ttl: float) -> None:
        """Put ``note`` at ``name`` for ``ttl`` seconds, whatever was there."""
        self._changed(name, self._call(name, "set", "", str(note), ttl))

    def replace(self, name: str, expected_id: str, note: Note, ttl: float) -> bool:
        """Put ``note`` for ``ttl`` seconds if there is none or the one there is
        ``expected_id``'s (never over another task's note); True if a quorum of the nodes
        took it."""
        return self._changed(name, self._call(name, "replace", expected_id, str(note), ttl))

    def delete(self, name: str, expected_id: str) -> bool:
        """Delete the note at ``name`` if it is ``expected_id``'s."""
        return self._changed(name, self._call(name, "delete", expected_id))

    # -- internals -------------------------------------------------------------------------
    def _call(
        self, name: str, op: str, expected: str = "", value: str = "", ttl: float = 0.0
    ) -> list[Any]:
        key = self.key(name)
        ms = max(1, int(ttl * 1000))
        state: AliasState = self.engine.state

        def plan(nodes: Sequence[NodeView]) -> Any:
            calls: list[Call | None] = [
                None if node.run_id is None else Call(NOTE, (key,), (op, expected, value, ms))
                for node in nodes
            ]
            replies = yield Request(calls, state.node_timeout * 4, None)
            return replies

        replies: list[Any] = self.engine._run(plan)[0]
        return replies

    def _changed(self, name: str, replies: list[Any]) -> bool:
        answered = sum(1 for r in replies if not isinstance(r, NodeFailure))
        self._check(name, answered, replies)
        return sum(1 for r in replies if r == 1) >= quorum(len(replies))

    def _check(self, name: str, answered: int, replies: list[Any]) -> None:
        need = quorum(len(replies))
        if answered < need:
            errors = {
                self.engine.labels[i]: str(r)
                for i, r in enumerate(replies)
                if isinstance(r, NodeFailure)
            }
            raise NodesUnavailable(
                name, answered=answered, quorum=need, total=len(replies), errors=errors
            )
