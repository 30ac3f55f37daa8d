"""Jobs for the scheduler tests (tests/schedules): each appends to the file named by
``SCHEDULE_LOG`` what it ran, for which tick and in which process, so the test counts runs
outside the library."""

from __future__ import annotations

import os
import time

from django_redlock.schedules import current_tick


def _write(line: str) -> None:
    log = os.open(os.environ["SCHEDULE_LOG"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(log, f"{line}\n".encode())
    finally:
        os.close(log)


def record(seconds: float = 0.3) -> None:
    """``start TICK PID``, a pause of ``seconds``, then ``end TICK PID``."""
    tick = current_tick()
    assert tick is not None
    _write(f"start {tick.isoformat()} {os.getpid()}")
    time.sleep(seconds)
    _write(f"end {tick.isoformat()} {os.getpid()}")


def fail() -> None:
    _write(f"fail {current_tick()} {os.getpid()}")
    raise RuntimeError("the job failed on purpose")


def exit_job() -> None:
    """Calls ``sys.exit(3)``: a ``BaseException`` the scheduler must record as a failed run."""
    _write(f"exit {current_tick()} {os.getpid()}")
    raise SystemExit(3)


def interrupt() -> None:
    """Raises ``KeyboardInterrupt`` (a ``BaseException``) from the job itself."""
    _write(f"interrupt {current_tick()} {os.getpid()}")
    raise KeyboardInterrupt
