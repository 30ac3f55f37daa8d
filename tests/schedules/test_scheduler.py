"""The scheduler in one process, on real nodes and the test database (docs/schedules.md):
two schedulers at once run each tick once; a failed run is recorded and not retried; a tick
left running by a scheduler that lost the entry is seen interrupted and never run again;
ticks nobody ran in time are reported missed, and made up by one run with CATCH_UP."""

from __future__ import annotations

import json
import threading
from collections import Counter
from datetime import timedelta
from pathlib import Path

import pytest
from django.core.management import call_command
from django.test import Client, override_settings

from django_redlock import locks
from django_redlock.models import Effect, ScheduledTick
from django_redlock.schedules.entries import parse_schedule, tick_key
from django_redlock.schedules.scheduler import Scheduler, db_time, utcnow

pytestmark = pytest.mark.django_db(transaction=True)
JOB = "tests.support.schedule_jobs.record"


def _runs(log: Path) -> Counter[str]:
    lines = log.read_text().splitlines() if log.exists() else []
    return Counter(line.split()[1] for line in lines if line.startswith("end "))


def _run_schedulers(entries: object, count: int, seconds: float) -> None:
    parsed = parse_schedule(entries)
    schedulers = [Scheduler(parsed) for _ in range(count)]
    threads = [threading.Thread(target=s.run, args=(seconds,)) for s in schedulers]
    for t in threads:
        t.start()
    for t in threads:
        t.join(seconds + 30)


def test_two_schedulers_run_each_tick_once(log: Path, unique_name: str) -> None:
    entry = unique_name.replace(":", "-")
    _run_schedulers({entry: {"CALL": JOB, "EVERY": 0.5, "KWARGS": {"seconds": 0.05}}}, 2, 3.2)
    runs = _runs(log)
    assert len(runs) >= 4 and set(runs.values()) == {1}  # every tick once, none twice
    rows = ScheduledTick.objects.filter(entry=entry)
    assert {r.outcome for r in rows} == {"done"}
    assert sorted(runs) == sorted(r.tick.isoformat() for r in rows)  # what the report says
    assert Effect.objects.filter(key__startswith=f"schedule:{entry}:", state="done").count() == (
        len(runs)
    )


def test_a_failed_run_is_recorded_and_not_retried(log: Path, unique_name: str) -> None:
    entry = unique_name.replace(":", "-")
    fail = "tests.support.schedule_jobs.fail"
    _run_schedulers({entry: {"CALL": fail, "EVERY": 1}}, 1, 1.6)
    rows = list(ScheduledTick.objects.filter(entry=entry))
    assert rows and {r.outcome for r in rows} == {"failed"}
    assert "the job failed on purpose" in rows[0].note
    fails = [line for line in log.read_text().splitlines() if line.startswith("fail ")]
    assert len(fails) == len(rows)


def test_a_tick_left_running_is_interrupted_and_never_run_again(
    log: Path, unique_name: str
) -> None:
    """As a SIGKILLed scheduler leaves it: its row says running, its effect begun."""
    entry = unique_name.replace(":", "-")
    [parsed] = parse_schedule({entry: {"CALL": JOB, "EVERY": 1, "TTL": 1}})
    tick = parsed.next_tick(utcnow() - timedelta(seconds=1))  # due within the second
    block = locks["default"].lock(f"schedule:{entry}", ttl=1)
    with pytest.raises(RuntimeError), block as lease, lease.once(tick_key(entry, tick)):
        ScheduledTick.objects.create(
            entry=entry, tick=db_time(tick), outcome="running", host="gone:1", token=lease.token
        )
        raise RuntimeError("killed here")  # the effect stays begun, the row running
    _run_schedulers({entry: {"CALL": JOB, "EVERY": 1, "TTL": 1}}, 1, 2.5)
    row = ScheduledTick.objects.get(entry=entry, tick=db_time(tick))
    assert row.outcome == "interrupted"
    assert tick.isoformat() not in _runs(log)  # not run again
    assert _runs(log) and set(_runs(log).values()) == {1}  # the later ticks ran, once each


@pytest.mark.parametrize("catch_up", [False, True])
def test_ticks_nobody_ran_are_missed_and_made_up_once_with_catch_up(
    log: Path, unique_name: str, catch_up: bool
) -> None:
    entry = unique_name.replace(":", "-")
    setting = {entry: {"CALL": JOB, "EVERY": 1, "TTL": 1, "CATCH_UP": catch_up}}
    [parsed] = parse_schedule(setting)
    long_ago = parsed.next_tick(utcnow() - timedelta(seconds=12))  # the fleet was down since
    ScheduledTick.objects.create(entry=entry, tick=db_time(long_ago), outcome="done")
    with override_settings(REDLOCK_SCHEDULE=setting):
        _run_schedulers(setting, 1, 1.5)
    missed = ScheduledTick.objects.filter(entry=entry, outcome="missed").count()
    caught = list(ScheduledTick.objects.filter(entry=entry, outcome="caught-up"))
    assert missed >= 6  # 12 s down, a tick may run up to 3 s late (TTL 1 + 1 s + 1 s)
    if catch_up:
        assert len(caught) == 1 and "made up" in caught[0].note
        assert caught[0].tick.isoformat() in _runs(log)
    else:
        assert caught == []
    assert set(_runs(log).values()) == {1}


def test_schedule_command_and_admin_report_the_ticks(
    log: Path, unique_name: str, admin_client: Client, capsys: pytest.CaptureFixture[str]
) -> None:
    entry = unique_name.replace(":", "-")
    setting = {entry: {"CALL": JOB, "EVERY": 1, "KWARGS": {"seconds": 0.01}}}
    _run_schedulers(setting, 1, 1.3)
    ran = ScheduledTick.objects.filter(entry=entry).first()
    assert ran is not None and ran.outcome == "done"
    with override_settings(REDLOCK_SCHEDULE=setting):
        call_command("redlock", "schedule", "--json")
        [report] = json.loads(capsys.readouterr().out)
        call_command("redlock", "schedule")
        text = capsys.readouterr().out
    assert report["entry"] == entry and report["outcome"] == "done"
    assert report["last_tick"] == ran.tick.isoformat() and report["ran_by"] == ran.host
    assert report["next_tick"] > report["last_tick"] and report["missed"] == 0
    assert f"{entry}: every 1 s -> {JOB}" in text and "last tick:" in text
    page = admin_client.get("/admin/django_redlock/scheduledtick/")
    assert page.status_code == 200 and entry in page.content.decode()
    assert admin_client.get("/admin/django_redlock/scheduledtick/add/").status_code == 403
    with override_settings(REDLOCK_SCHEDULE=setting):  # each entry summed up above its ticks
        summary = admin_client.get("/admin/django_redlock/scheduledtick/").content.decode()
    assert "REDLOCK_SCHEDULE entries" in summary and "every 1 s" in summary
    assert f"<td>{ran.host}</td>" in summary and f"<code>{JOB}</code>" in summary
    with override_settings(REDLOCK_SCHEDULE={entry: {"EVERY": 1}}):  # no CALL: said, not a 500
        bad = admin_client.get("/admin/django_redlock/scheduledtick/")
    assert bad.status_code == 200 and "CALL" in bad.content.decode()
