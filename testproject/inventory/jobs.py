"""The scheduled job of ``manage.py nightly --scheduler``: a report for its tick."""

from __future__ import annotations

import os
import time
from pathlib import Path

from django_redlock.schedules import current_tick


def report(directory: str, work: float = 0.5) -> None:
    """Mark the start (``start-<tick>-<pid>``), work, then write ``report-<tick>-<pid>.txt``."""
    tick = current_tick()
    stamp = tick.strftime("%H%M%S") if tick is not None else "untimed"
    Path(directory, f"start-{stamp}-{os.getpid()}").touch()
    time.sleep(work)
    Path(directory, f"report-{stamp}-{os.getpid()}.txt").write_text("report")
