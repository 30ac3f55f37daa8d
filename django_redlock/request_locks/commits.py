"""Whether the transactions a request ran in were committed, seen from outside them.

Under ``ATOMIC_REQUESTS`` Django wraps the *view* in ``atomic()``; a rule's
``RequestLockMiddleware`` runs outside it, and by the time it keeps the response the
transaction has ended, committed or rolled back (``transaction.set_rollback(True)``, a
caught database error) without a trace. :class:`CommitWatch` is a database execute wrapper:
on the queries run inside an atomic block it registers an ``on_commit`` hook (once per
savepoint level), so afterwards a transaction with queries whose hooks never ran was rolled
back.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.db import connections, transaction


def atomic_aliases() -> list[str]:
    """The databases whose requests Django wraps in a transaction (``ATOMIC_REQUESTS``)."""
    return [alias for alias in connections if connections[alias].settings_dict["ATOMIC_REQUESTS"]]


class CommitWatch:
    """An execute wrapper noting the transactions queries ran in and whether one committed."""

    def __init__(self, aliases: list[str]) -> None:
        self.aliases = aliases
        self._seen: set[tuple[str, tuple[str, ...]]] = set()
        self.committed = False

    def __call__(
        self, execute: Callable[..., Any], sql: str, params: Any, many: bool, context: Any
    ) -> Any:
        connection = context["connection"]
        if connection.in_atomic_block:
            level = (connection.alias, tuple(connection.savepoint_ids))
            if level not in self._seen:
                self._seen.add(level)
                transaction.on_commit(self._commit, using=connection.alias)
        return execute(sql, params, many, context)

    def _commit(self) -> None:
        self.committed = True

    @property
    def rolled_back(self) -> bool:
        """Queries ran in a transaction, and none of it committed."""
        return bool(self._seen) and not self.committed

    def install(self) -> None:
        """Watch this thread's connections (call in the thread that runs the view)."""
        for alias in self.aliases:
            connections[alias].execute_wrappers.append(self)

    def remove(self) -> None:
        for alias in self.aliases:
            wrappers = connections[alias].execute_wrappers
            if self in wrappers:
                wrappers.remove(self)
