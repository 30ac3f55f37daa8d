"""Schedules that run once across the fleet (``REDLOCK_SCHEDULE``, ``manage.py redlock
scheduler``; docs/schedules.md)."""

from __future__ import annotations

from .context import current_tick

__all__ = ["current_tick"]
