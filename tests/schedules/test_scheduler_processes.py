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
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "tests.support.subprocess_settings",
        "REDLOCK_JSON": json.dumps(settings.REDLOCK),
        "REDLOCK_SCHEDULE_JSON": json.dumps(schedule),
        "TEST_DATABASE_NAME": str(connection.settings_dict["NAME"]),
        "PYTHONPATH": str(ROOT),
        "SCHEDULE_LOG": str(log),
    }
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
