"""Edges of the scheduler found by attacking it with real processes (docs/schedules.md): a job
that raises a ``BaseException`` is a failed run; a stopped scheduler starts no new run while it
drains; an outage of more than 100 ticks is counted whole; a settled interrupted tick stays
unfinished in the effect ledger; a schedule with an unknown alias or an uncallable ``CALL`` (or a
``TTL`` no lease can have) is refused before the scheduler starts."""

from __future__ import annotations

import threading
import time
from datetime import timedelta
from pathlib import Path

import pytest
from django.core.management import CommandError, call_command
from django.test import override_settings

from django_redlock import locks
from django_redlock.checks import check_settings
from django_redlock.models import Effect, ScheduledTick
from django_redlock.schedules.entries import parse_schedule, tick_key
from django_redlock.schedules.scheduler import MAX_MISSED_ROWS, Scheduler, db_time, utcnow

pytestmark = pytest.mark.django_db(transaction=True)
JOB = "tests.support.schedule_jobs.record"


def _lines(log: Path, what: str) -> list[str]:
    lines = log.read_text().splitlines() if log.exists() else []
    return [line.split()[1] for line in lines if line.startswith(f"{what} ")]


def _run(setting: dict[str, object], seconds: float) -> None:
    scheduler = Scheduler(parse_schedule(setting))
    thread = threading.Thread(target=scheduler.run, args=(seconds,))
    thread.start()
    thread.join(seconds + 30)


@pytest.mark.parametrize("job", ["exit_job", "interrupt"])
def test_a_job_raising_a_base_exception_is_a_failed_run(
    log: Path, unique_name: str, job: str
) -> None:
    entry = unique_name.replace(":", "-")
    _run({entry: {"CALL": f"tests.support.schedule_jobs.{job}", "EVERY": 1, "TTL": 2}}, 1.6)
    rows = list(ScheduledTick.objects.filter(entry=entry))
    assert rows and {r.outcome for r in rows} == {"failed"}, [(r.outcome, r.note) for r in rows]
    assert all(r.note.startswith(("SystemExit", "KeyboardInterrupt")) for r in rows)


def test_a_stopped_scheduler_starts_no_new_run(log: Path, unique_name: str) -> None:
    """Several ticks due at once (a job longer than its period): after stop() the run under way
    ends, and the next due ones are left to the other schedulers."""
    entry = unique_name.replace(":", "-")
    setting = {entry: {"CALL": JOB, "EVERY": 0.5, "TTL": 10, "KWARGS": {"seconds": 0.8}}}
    [parsed] = parse_schedule(setting)
    earlier = parsed.next_tick(utcnow() - timedelta(seconds=3))  # 5 ticks are due now
    ScheduledTick.objects.create(entry=entry, tick=db_time(earlier), outcome="done")
    scheduler = Scheduler([parsed])
    thread = threading.Thread(target=scheduler.run)
    thread.start()
    deadline = time.monotonic() + 20
    while not _lines(log, "start"):
        assert time.monotonic() < deadline, "no run started"
        time.sleep(0.01)
    scheduler.stop()
    thread.join(30)
    assert len(_lines(log, "start")) == 1
    assert _lines(log, "end") == _lines(log, "start")  # the run under way was waited for


def test_an_outage_of_more_than_a_hundred_ticks_is_counted_whole(
    log: Path, unique_name: str, caplog: pytest.LogCaptureFixture
) -> None:
    entry = unique_name.replace(":", "-")
    setting = {entry: {"CALL": JOB, "EVERY": 1, "TTL": 1, "CATCH_UP": True}}
    [parsed] = parse_schedule(setting)
    long_ago = parsed.next_tick(utcnow() - timedelta(seconds=300))
    ScheduledTick.objects.create(entry=entry, tick=db_time(long_ago), outcome="done")
    with caplog.at_level("WARNING", logger="django_redlock"):
        _run(setting, 1.0)
    assert ScheduledTick.objects.filter(entry=entry, outcome="missed").count() == (
        MAX_MISSED_ROWS - 1  # the last missed one is the caught-up run's
    )
    [caught] = ScheduledTick.objects.filter(entry=entry, outcome="caught-up")
    made_up = int(caught.note.split()[2])
    assert 290 <= made_up <= 300, caught.note
    assert f"{made_up} tick(s) missed" in caplog.text


def test_a_settled_interrupted_tick_stays_unfinished_in_the_ledger(
    log: Path, unique_name: str
) -> None:
    """The ledger must not say `done` for a run nobody finished: a second settle (its row
    update lost with the scheduler that settled it) would report it done."""
    entry = unique_name.replace(":", "-")
    [parsed] = parse_schedule({entry: {"CALL": JOB, "EVERY": 1, "TTL": 1}})
    tick = parsed.next_tick(utcnow() - timedelta(seconds=1))
    key = tick_key(entry, tick)
    block = locks["default"].lock(f"schedule:{entry}", ttl=1)
    with pytest.raises(RuntimeError), block as lease, lease.once(key):
        ScheduledTick.objects.create(
            entry=entry, tick=db_time(tick), outcome="running", host="gone:1", token=lease.token
        )
        raise RuntimeError("killed here")
    _run({entry: {"CALL": JOB, "EVERY": 1, "TTL": 1}}, 2.5)
    assert ScheduledTick.objects.get(entry=entry, tick=db_time(tick)).outcome == "interrupted"
    assert Effect.objects.get(key=key).state == "begun"
    # the row's update lost: a later settle still finds the run unfinished
    ScheduledTick.objects.filter(entry=entry, tick=db_time(tick)).update(outcome="running")
    _run({entry: {"CALL": JOB, "EVERY": 1, "TTL": 1}}, 1.2)
    assert ScheduledTick.objects.get(entry=entry, tick=db_time(tick)).outcome == "interrupted"
    assert tick.isoformat() not in _lines(log, "start")


@pytest.mark.parametrize(
    ("extra", "code"),
    [
        ({"USING": "no-such-alias"}, "E041"),
        ({"CALL": "tests.support.schedule_jobs.no_such_job"}, "E042"),
        ({"CALL": "tests.support.schedule_jobs.os"}, "E042"),
        ({"TTL": 0.0001}, "E040"),
        ({"TTL": 1e12}, "E040"),
    ],
)
def test_a_bad_schedule_is_refused_before_the_scheduler_starts(
    log: Path, unique_name: str, extra: dict[str, object], code: str
) -> None:
    entry = unique_name.replace(":", "-")
    setting = {entry: {"CALL": JOB, "EVERY": 1, **extra}}
    with override_settings(REDLOCK_SCHEDULE=setting):
        assert f"django_redlock.{code}" in {m.id for m in check_settings()}
        with pytest.raises(CommandError) as raised:
            call_command("redlock", "scheduler", "--for", "1.5")
    assert raised.value.returncode == 2
    assert entry in str(raised.value)
    assert not ScheduledTick.objects.filter(entry=entry).exists()
