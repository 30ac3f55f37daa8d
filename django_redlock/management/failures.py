"""The one-line errors of ``manage.py redlock`` and their ``--json`` codes."""

from __future__ import annotations

from collections.abc import Sequence

from django.core.management.base import CommandError

from ..inspection import NodeError


class Failure(CommandError):
    """A one-line error; ``code`` names its kind in the ``--json`` error document:
    ``unknown_alias``, ``bad_settings``, ``unreachable``, ``not_held``, ``holder_changed``,
    ``simulated`` or ``usage``."""

    def __init__(self, message: object, code: str) -> None:
        super().__init__(" ".join(str(message).split()))
        self.code = code


def first_failure(problems: Sequence[NodeError | Failure]) -> Failure | None:
    """The first problem as one line (``(and N more)``), or None."""
    if not problems:
        return None
    first = problems[0]
    more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
    return Failure(f"{first}{more}", first.code if isinstance(first, Failure) else "unreachable")
