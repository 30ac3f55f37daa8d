"""The markers of unique tasks: one note per key on the alias's nodes (see
:mod:`django_redlock.engine.plans.notes`), which reads as the value a quorum of the nodes agree on,
so a marker survives the loss of a minority of the nodes as a lock does.

A marker's value is ``"<state>|<id>"``. Every change compares the id in one Lua call, so a
worker that renews or deletes its task's marker never touches one that a later enqueue wrote
for another task.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any

from ..engine import NoteHolder, NoteReplies, call_note, note_key, quorum
from ..exceptions import NodesUnavailable


@dataclass(frozen=True)
class Note:
    """What a marker says: ``state`` (``"queued"`` or ``"running"``) and the task's ``id``."""

    state: str
    id: str

    @classmethod
    def parse(cls, value: Any) -> Note | None:
        if value is None:
            return None
        text = value.decode() if isinstance(value, bytes) else str(value)
        state, bar, ident = text.partition("|")
        return cls(state, ident) if bar else None

    def __str__(self) -> str:
        return f"{self.state}|{self.id}"


class Notes:
    """The markers held on one engine (the one that holds their names)."""

    def __init__(self, engine: NoteHolder) -> None:
        self.engine = engine

    def key(self, name: str) -> str:
        return note_key(self.engine, name)

    def read(self, name: str) -> Note | None:
        """The marker at ``name`` a quorum of the nodes agree on, or None."""
        replies = self._checked(name, call_note(self.engine, name, "get"))
        values = Counter(v for v in replies.values if v is not None)
        for value, count in values.most_common(1):
            if count >= quorum(len(replies.values)):
                return Note.parse(value)
        return None

    def write(self, name: str, note: Note, ttl: float) -> None:
        """Put ``note`` at ``name`` for ``ttl`` seconds, whatever was there."""
        self._changed(name, call_note(self.engine, name, "set", "", str(note), ttl))

    def replace(self, name: str, expected_id: str, note: Note, ttl: float) -> bool:
        """Put ``note`` for ``ttl`` seconds if there is none or the one there is
        ``expected_id``'s (never over another task's marker); True if a quorum took it."""
        replies = call_note(self.engine, name, "replace", expected_id, str(note), ttl)
        return self._changed(name, replies)

    def delete(self, name: str, expected_id: str) -> bool:
        """Delete the marker at ``name`` if it is ``expected_id``'s."""
        return self._changed(name, call_note(self.engine, name, "delete", expected_id))

    def _changed(self, name: str, replies: NoteReplies) -> bool:
        self._checked(name, replies)
        return sum(1 for v in replies.values if v == 1) >= quorum(len(replies.values))

    @staticmethod
    def _checked(name: str, replies: NoteReplies) -> NoteReplies:
        need = quorum(len(replies.values))
        if replies.answered < need:
            raise NodesUnavailable(
                name,
                answered=replies.answered,
                quorum=need,
                total=len(replies.values),
                errors=replies.errors,
            )
        return replies
