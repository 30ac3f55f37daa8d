"""Three ``manage.py redlock scheduler`` processes on real nodes (docs/schedules.md): one is
SIGKILLed in the middle of a run, another SIGSTOPped past the entry's TTL and resumed. Counted
outside the library, from what the job itself wrote: every tick of the run started once and
none twice, the killed one never ended (and is recorded interrupted), and no tick was missed
while schedulers were alive."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from datetime import datetime
from pathlib import Path

import pytest
from django.conf import settings
from django.db import connection

from django_redlock.models import ScheduledTick
from django_redlock.schedules.entries import parse_schedule
from django_redlock.schedules.scheduler import db_time

ROOT = Path(__file__).resolve().parent.parent.parent
pytestmark = pytest.mark.django_db(transaction=True)


def _lines(log: Path) -> list[tuple[str, str, int]]:
    rows = []
    for line in log.read_text().splitlines() if log.exists() else []:
        what, tick, pid = line.split()
        rows.append((what, tick, int(pid)))
    return rows


def _until(test: object, seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while not test():  # type: ignore[operator]
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def _scheduler_env(schedule: dict[str, object], log: Path) -> dict[str, str]:
    """The environment of a ``manage.py redlock scheduler`` process of these tests."""
    return {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "tests.support.subprocess_settings",
        "REDLOCK_JSON": json.dumps(settings.REDLOCK),
        "REDLOCK_SCHEDULE_JSON": json.dumps(schedule),
        "TEST_DATABASE_NAME": str(connection.settings_dict["NAME"]),
        "PYTHONPATH": str(ROOT),
        "SCHEDULE_LOG": str(log),
    }


def test_three_schedulers_run_each_tick_once_through_a_kill_and_a_pause(
    tmp_path: Path, unique_name: str
) -> None:
    entry = unique_name.replace(":", "-")
    schedule = {
        entry: {
            "CALL": "tests.support.schedule_jobs.record",
            "EVERY": 1,
            "TTL": 1.5,
            "KWARGS": {"seconds": 0.6},
        }
    }
    log = tmp_path / "runs"
    env = _scheduler_env(schedule, log)
    argv = [sys.executable, "-m", "django", "redlock", "scheduler", "--for", "30"]
    procs = {}
    for _ in range(3):
        proc = subprocess.Popen(
            argv, env=env, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
        )
        procs[proc.pid] = proc
    killed = stopped = None
    try:
        # SIGKILL the scheduler that is in the middle of a run
        _until(lambda: any(w == "start" for w, _, _ in _lines(log)), 30)
        what, killed_tick, killed = _lines(log)[-1]
        assert what == "start"
        os.kill(killed, signal.SIGKILL)
        procs[killed].wait(10)
        # then SIGSTOP the next one that starts a run, past the TTL, and resume it
        _until(lambda: any(w == "start" and p != killed for w, _, p in _lines(log)), 10)
        _, stopped_tick, stopped = [r for r in _lines(log) if r[0] == "start"][-1]
        os.kill(stopped, signal.SIGSTOP)
        time.sleep(3.0)  # twice the TTL: the third scheduler goes on meanwhile
        os.kill(stopped, signal.SIGCONT)
        time.sleep(3.0)
    finally:
        for pid, proc in procs.items():
            if proc.poll() is None:
                os.kill(pid, signal.SIGCONT)
                proc.terminate()
        for proc in procs.values():
            proc.communicate(timeout=40)

    lines = _lines(log)
    starts = Counter(tick for what, tick, _ in lines if what == "start")
    ends = Counter(tick for what, tick, _ in lines if what == "end")
    assert set(starts.values()) == {1}, starts  # no tick started twice
    assert killed_tick not in ends  # the killed run never ended ...
    assert set(ends) == set(starts) - {killed_tick}  # ... and every other one did
    assert stopped_tick in ends  # the paused run finished when resumed
    # every tick from the first to the last ran: none missed while schedulers were alive
    [parsed] = parse_schedule(schedule)
    first, last = (datetime.fromisoformat(t) for t in (min(starts), max(starts)))
    expected = {t.isoformat() for t in [first, *parsed.ticks_between(first, last)]}
    assert set(starts) == expected
    row = ScheduledTick.objects.get(entry=entry, tick=db_time(datetime.fromisoformat(killed_tick)))
    assert row.outcome == "interrupted"
    assert not ScheduledTick.objects.filter(entry=entry, outcome="missed").exists()


def test_an_outage_of_every_scheduler_is_reported_missed_and_made_up_once(
    tmp_path: Path, unique_name: str
) -> None:
    """One scheduler process runs an EVERY 1 s entry with CATCH_UP, is SIGTERMed, and no
    scheduler runs for 5 s; a new process then starts. ``manage.py redlock schedule --json``,
    another process, reports the ticks of the outage missed, and the new scheduler made up
    the last of them once; counted from what the job wrote, no tick ran twice."""
    entry = unique_name.replace(":", "-")
    schedule = {
        entry: {
            "CALL": "tests.support.schedule_jobs.record",
            "EVERY": 1,
            "TTL": 1,
            "CATCH_UP": True,
            "KWARGS": {"seconds": 0.05},
        }
    }
    log = tmp_path / "runs"
    env = _scheduler_env(schedule, log)
    argv = [sys.executable, "-m", "django", "redlock", "scheduler", "--for", "30"]

    def scheduler() -> subprocess.Popen[str]:
        return subprocess.Popen(
            argv, env=env, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
        )

    first = scheduler()
    try:
        _until(lambda: sum(w == "end" for w, _, _ in _lines(log)) >= 2, 30)
    finally:
        first.terminate()
        _, errors = first.communicate(timeout=30)
    assert first.returncode == 0, errors
    before = {tick for what, tick, _ in _lines(log) if what == "start"}
    time.sleep(5.0)  # the outage: no scheduler anywhere
    second = scheduler()
    try:
        _until(lambda: len([w for w, _, _ in _lines(log) if w == "end"]) >= len(before) + 2, 30)
    finally:
        second.terminate()
        _, errors = second.communicate(timeout=30)
    assert second.returncode == 0, errors

    shown = subprocess.run(
        [sys.executable, "-m", "django", "redlock", "schedule", "--json"],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    [report] = [r for r in json.loads(shown.stdout) if r["entry"] == entry]
    starts = Counter(tick for what, tick, _ in _lines(log) if what == "start")
    assert set(starts.values()) == {1}, starts  # no tick ran twice
    caught = list(ScheduledTick.objects.filter(entry=entry, outcome="caught-up"))
    assert len(caught) == 1  # the outage made up by one run ...
    assert caught[0].tick.isoformat() in starts  # ... which the job ran for that tick
    # every tick since the first scheduler's last ran (late, within its late limit), or is
    # recorded missed or made up: none silently lost
    outcomes = {r.tick.isoformat(): r.outcome for r in ScheduledTick.objects.filter(entry=entry)}
    [parsed] = parse_schedule(schedule)
    last_before, last = (datetime.fromisoformat(t) for t in (max(before), max(starts)))
    since = [t.isoformat() for t in parsed.ticks_between(last_before, last)]
    assert all(t in starts or outcomes.get(t) in ("missed", "caught-up") for t in since)
    # 5 s without a scheduler, a late limit of 2 s (TTL 1 + a period): some were past it
    beyond = [t for t in since if outcomes.get(t) in ("missed", "caught-up")]
    assert len(beyond) >= 2, (since, outcomes)
    assert report["missed"] == len(beyond) - 1, report  # all but the one made up
    assert report["last_missed"] is not None
    missed = {t for t, outcome in outcomes.items() if outcome == "missed"}
    assert not missed & set(starts)  # a tick reported missed was not run
