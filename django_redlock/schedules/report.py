"""What ``manage.py redlock schedule`` shows: each entry's last tick, its outcome, who ran
it, the next tick and the missed ticks (docs/schedules.md)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from .entries import Entry
from .model import MISSED, ScheduledTick
from .scheduler import from_db, utcnow


def entry_report(entry: Entry, now: datetime | None = None) -> dict[str, Any]:
    """One entry's state, as JSON-ready values (times in ISO 8601, UTC)."""
    now = now or utcnow()
    rows = ScheduledTick.objects.filter(entry=entry.name)
    last = rows.exclude(outcome=MISSED).order_by("-tick").first()
    last_missed = rows.filter(outcome=MISSED).order_by("-tick").first()
    return {
        "entry": entry.name,
        "schedule": entry.describe(),
        "call": entry.call,
        "using": entry.using,
        "last_tick": None if last is None else from_db(last.tick).isoformat(),
        "outcome": None if last is None else last.outcome,
        "ran_by": None if last is None else last.host,
        "token": None if last is None else last.token,
        "note": None if last is None else last.note or None,
        "next_tick": entry.next_tick(now).isoformat(),
        "missed": rows.filter(outcome=MISSED).count(),
        "last_missed": None if last_missed is None else from_db(last_missed.tick).isoformat(),
    }


def report_lines(reports: list[dict[str, Any]]) -> list[str]:
    """The human form: one block per entry."""
    if not reports:
        return ["No REDLOCK_SCHEDULE entries."]
    lines = []
    for r in reports:
        last = "never" if r["last_tick"] is None else f"{r['last_tick']} {r['outcome']}"
        by = f" by {r['ran_by']} (token {r['token']})" if r["ran_by"] else ""
        lines.append(f"{r['entry']}: {r['schedule']} -> {r['call']} (alias {r['using']})")
        lines.append(f"  last tick: {last}{by}")
        if r["note"]:
            lines.append(f"  note: {r['note']}")
        lines.append(f"  next tick: {r['next_tick']}")
        if r["missed"]:
            lines.append(f"  missed: {r['missed']} tick(s), the last {r['last_missed']}")
    return lines
