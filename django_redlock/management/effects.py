"""The rows of ``manage.py redlock effects``: the effect ledger, read from the database."""

from __future__ import annotations

from typing import Any

from ..effects.model import BEGUN, DONE, Effect

EFFECT_HEADERS = ("KEY", "STATE", "TOKEN", "ATTEMPTS", "ALIAS", "LOCK", "BEGAN", "BY", "DONE")


def ledger_rows(database: str, *, pending: bool, prefix: str, limit: int | None) -> list[Effect]:
    """The effects of ``database``, newest begin first: only those not done if ``pending``."""
    rows = Effect.objects.using(database).order_by("-began_at", "-pk")
    if pending:
        rows = rows.filter(state=BEGUN)
    if prefix:
        rows = rows.filter(key__startswith=prefix)
    return list(rows if limit is None else rows[:limit])


def _state(row: Effect) -> str:
    """``done``, or ``begun`` (running now, or interrupted: the ledger cannot tell which)."""
    return DONE if row.state == DONE else BEGUN


def effect_row(row: Effect) -> tuple[str, ...]:
    """One line of the table (``table`` makes each cell printable)."""
    done = row.done_at.isoformat(timespec="seconds") if row.done_at else ""
    return (
        row.key,
        _state(row),
        str(row.token),
        str(row.attempts),
        row.alias,
        row.lock_name,
        row.began_at.isoformat(timespec="seconds"),
        row.began_by,
        done,
    )


def effect_document(row: Effect) -> dict[str, Any]:
    """One effect of ``--json``."""
    return {
        "key": row.key,
        "state": _state(row),
        "token": row.token,
        "attempts": row.attempts,
        "alias": row.alias,
        "lock_name": row.lock_name,
        "began_at": row.began_at.isoformat(),
        "began_by": row.began_by,
        "done_at": row.done_at.isoformat() if row.done_at else None,
    }
