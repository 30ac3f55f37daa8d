"""The subcommands of ``manage.py redlock`` that run work: ``run`` and ``leader`` (a command
under a lease), ``scheduler`` (REDLOCK_SCHEDULE) and ``schedule`` (its report)."""

from __future__ import annotations

import contextlib
import json
import math
import os
import signal
import sys
from collections.abc import Callable
from typing import Any

from django.core.management.base import BaseCommand, CommandError

from ..checks import schedule_errors
from ..jobs import front
from ..jobs.runner import RunRequest
from ..locking.registry import locks
from ..schedules.entries import schedule_setting
from ..schedules.report import entry_report, report_lines
from ..schedules.scheduler import Scheduler
from ..validation import check_max_hold, check_name, check_timeout, check_ttl
from .failures import Failure


def run_command(
    options: dict[str, Any], one_alias: Callable[[str], str], *, exiting: bool = False
) -> None:
    """``run NAME -- COMMAND``: exits with the command's status (see docs/jobs.md).
    ``leader NAME -- COMMAND`` is a run that waits for ever for the name (the election),
    then holds it while the command runs (docs/leaders.md)."""
    what = f"redlock {options['subcommand']}"
    command = list(options["command"])
    if not command:
        raise CommandError(f"{what}: give the command after --", returncode=2)
    kill_after = options["kill_after"]
    if not (math.isfinite(kill_after) and kill_after >= 0):
        raise CommandError(f"{what}: --kill-after must be a number >= 0", returncode=2)
    try:
        alias = one_alias(options["using"])
    except Failure as exc:
        status = 2 if exc.code == "unknown_alias" else 1  # a typo, or broken settings
        raise CommandError(f"{what}: {exc}", returncode=status) from exc
    manager = locks[alias]
    campaign = options["subcommand"] == "leader"
    request = RunRequest(
        name=options["name"],
        command=command,
        ttl=options["ttl"],
        timeout=None if campaign else options["timeout"],
        skip_busy=False if campaign else options["skip_busy"],
        kill_after=kill_after,
        min_hold=None if campaign else options["min_hold"],
    )
    try:  # checked before anything runs, so that nothing is taken
        check_name(request.name)
        check_max_hold(request.min_hold, "--min-hold")
        if request.ttl is not None:
            check_ttl(request.ttl, manager.config.drift_factor)
        check_timeout(request.timeout)
    except (TypeError, ValueError) as exc:
        raise CommandError(f"{what}: {exc}", returncode=2) from exc
    status_file: str | None = options["status_file"]
    if status_file:  # a file left from an earlier run must not be mistaken for this one's
        with contextlib.suppress(FileNotFoundError):
            os.unlink(status_file)
    outcome = front.run(manager, request, exiting=exiting)
    if status_file:
        outcome.write_status(status_file)
    if outcome.message is not None:
        raise CommandError(f"{what}: {outcome.message}", returncode=outcome.status)
    if outcome.status:
        sys.exit(outcome.status)


def scheduler(command: BaseCommand, options: dict[str, Any]) -> None:
    """``scheduler [--for SECONDS]``: run the schedule until stopped."""
    seconds = options["seconds"]
    if seconds is not None and not (math.isfinite(seconds) and seconds > 0):
        raise CommandError("redlock scheduler: --for must be a number > 0", returncode=2)
    try:
        entries = schedule_setting()
    except (TypeError, ValueError) as exc:
        raise CommandError(f"redlock scheduler: {exc}", returncode=2) from exc
    if not entries:
        raise CommandError("redlock scheduler: REDLOCK_SCHEDULE has no entries", returncode=2)
    errors = schedule_errors()  # E040-E042: an unknown alias, a CALL that does not import
    if errors:
        raise CommandError(
            "redlock scheduler: " + " ".join(f"({e.id}) {e.msg}" for e in errors),
            returncode=2,
        )
    running = Scheduler(entries, say=lambda line: command.stdout.write(line))
    stop = lambda *_: running.stop()  # noqa: E731
    previous = {sig: signal.signal(sig, stop) for sig in (signal.SIGTERM, signal.SIGINT)}
    command.stdout.write(
        f"redlock scheduler {running.host}: {len(entries)} entr"
        f"{'y' if len(entries) == 1 else 'ies'}: {', '.join(e.name for e in entries)}"
    )
    try:
        running.run(seconds)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def schedule(command: BaseCommand, options: dict[str, Any]) -> None:
    """``schedule [--json]``: each entry's last tick, outcome, host and next tick."""
    try:
        entries = schedule_setting()
    except (TypeError, ValueError) as exc:
        raise Failure(exc, "bad_settings") from exc
    reports = [entry_report(entry) for entry in entries]
    if options["json"]:
        command.stdout.write(json.dumps(reports))
    else:
        for line in report_lines(reports):
            command.stdout.write(line)
