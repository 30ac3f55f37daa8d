"""Which tick the scheduler runs now, for the job it calls."""

from __future__ import annotations

import contextvars
from datetime import datetime

_tick: contextvars.ContextVar[datetime | None] = contextvars.ContextVar(
    "redlock_schedule_tick", default=None
)


def current_tick() -> datetime | None:
    """The tick (an aware UTC datetime) the scheduler runs the calling job for, or None
    outside a scheduled run: a job that needs its tick's time (a report's day) reads it here."""
    return _tick.get()


def set_tick(tick: datetime | None) -> contextvars.Token[datetime | None]:
    return _tick.set(tick)


def reset_tick(token: contextvars.Token[datetime | None]) -> None:
    _tick.reset(token)
