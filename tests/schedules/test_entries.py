"""``REDLOCK_SCHEDULE`` entries: checked with clear errors, and ticks every server computes
alike (I/O-free)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from django.core import checks
from django.test import override_settings

from django_redlock.checks import check_settings
from django_redlock.schedules.entries import late_limit, parse_schedule, tick_key

JOB = "tests.support.schedule_jobs.record"


def test_every_ticks_at_multiples_of_the_period_since_the_epoch() -> None:
    [entry] = parse_schedule({"sync": {"CALL": JOB, "EVERY": 30}})
    after = datetime(2026, 12, 5, 8, 0, 10, tzinfo=UTC)
    ticks = entry.ticks_between(after, after + timedelta(minutes=1))
    assert ticks == [
        datetime(2026, 12, 5, 8, 0, 30, tzinfo=UTC),
        datetime(2026, 12, 5, 8, 1, 0, tzinfo=UTC),
    ]
    assert entry.ticks_between(ticks[0], ticks[0]) == []  # strictly after
    assert entry.describe() == "every 30 s"


def test_cron_ticks_in_the_entry_time_zone_across_a_dst_change() -> None:
    [entry] = parse_schedule(
        {"nightly": {"CALL": JOB, "CRON": "0 3 * * *", "TIMEZONE": "Europe/Berlin"}}
    )
    after = datetime(2026, 10, 24, 12, 0, tzinfo=UTC)  # Berlin leaves summer time on the 25th
    first, second = entry.ticks_between(after, after + timedelta(days=2))
    assert first == datetime(2026, 10, 25, 2, 0, tzinfo=UTC)  # 03:00 CET
    assert second == datetime(2026, 10, 26, 2, 0, tzinfo=UTC)
    assert entry.next_tick(first) == second
    assert tick_key("nightly", first) == "schedule:nightly:2026-10-25T02:00:00.000+00:00"


def test_late_limit_is_the_ttl_plus_a_period_at_most_a_minute() -> None:
    [every, cron] = parse_schedule(
        {"a": {"CALL": JOB, "EVERY": 1}, "b": {"CALL": JOB, "CRON": "0 * * * *"}}
    )
    tick = datetime(2026, 1, 1, tzinfo=UTC)
    assert late_limit(every, 2.0, tick) == timedelta(seconds=4)
    assert late_limit(cron, 30.0, tick) == timedelta(seconds=91)


@pytest.mark.parametrize(
    ("setting", "message"),
    [
        (["x"], "must be a dict of entry names"),
        ({"a:b": {"CALL": JOB, "EVERY": 1}}, "without ':'"),
        ({"a": "x"}, "must be a dict with CALL"),
        ({"a": {"CALL": JOB, "EVERY": 1, "ARG": []}}, "unknown key 'ARG'"),
        ({"a": {"CALL": "record", "EVERY": 1}}, "dotted path"),
        ({"a": {"CALL": JOB}}, "exactly one of CRON and EVERY"),
        ({"a": {"CALL": JOB, "EVERY": 1, "CRON": "* * * * *"}}, "exactly one"),
        ({"a": {"CALL": JOB, "CRON": "0 3 * *"}}, "five fields"),
        ({"a": {"CALL": JOB, "CRON": "61 3 * * *"}}, "is not valid"),
        ({"a": {"CALL": JOB, "EVERY": 0.1}}, "from 0.5 s"),
        ({"a": {"CALL": JOB, "EVERY": True}}, "number of seconds"),
        ({"a": {"CALL": JOB, "EVERY": 1, "ARGS": "x"}}, "ARGS'] must be a list"),
        ({"a": {"CALL": JOB, "EVERY": 1, "KWARGS": {1: 2}}}, "str keys"),
        ({"a": {"CALL": JOB, "EVERY": 1, "TTL": 0}}, "TTL'] must be a number"),
        ({"a": {"CALL": JOB, "EVERY": 1, "TIMEZONE": "Mars/Base"}}, "not a known time zone"),
        ({"a": {"CALL": JOB, "EVERY": 1, "CATCH_UP": "yes"}}, "True or False"),
    ],
)
def test_bad_entries_are_refused_naming_the_entry_and_key(setting: object, message: str) -> None:
    with pytest.raises((TypeError, ValueError), match=message):
        parse_schedule(setting)


def test_system_checks_report_the_schedule() -> None:
    with override_settings(REDLOCK_SCHEDULE={"a": {"CALL": JOB, "CRON": "bad"}}):
        assert "django_redlock.E040" in [m.id for m in check_settings()]
    bad_alias = {"a": {"CALL": JOB, "EVERY": 1, "USING": "nope"}}
    with override_settings(REDLOCK_SCHEDULE=bad_alias):
        assert "django_redlock.E041" in [m.id for m in check_settings()]
    with override_settings(REDLOCK_SCHEDULE={"a": {"CALL": "tests.nowhere.job", "EVERY": 1}}):
        messages = check_settings()
        assert [m.id for m in messages if m.level >= checks.ERROR] == ["django_redlock.E042"]
    with override_settings(REDLOCK_SCHEDULE={"a": {"CALL": JOB, "EVERY": 1}}):
        assert check_settings() == []


def test_a_long_outage_is_counted_whole_and_keeps_the_last_missed_ticks() -> None:
    """Eight days without a scheduler, EVERY 0.5 s: 1.38 million missed ticks are counted
    (by arithmetic, at once), the last 100 kept for rows, and the recent ticks still due."""
    from django_redlock.schedules.scheduler import MAX_MISSED_ROWS, Scheduler

    [entry] = parse_schedule({"fast": {"CALL": JOB, "EVERY": 0.5}})
    now = datetime(2026, 12, 5, 8, 0, 0, 250000, tzinfo=UTC)
    after = now - timedelta(days=8)
    missed, count, due = Scheduler([entry])._due(entry, after, now, ttl=1.0)
    limit = late_limit(entry, 1.0, due[0])  # 2.5 s: the ticks of the last 2.5 s are still due
    assert limit == timedelta(seconds=2.5)
    assert len(due) == 5 and all(now - t <= limit for t in due)
    assert count == 8 * 86400 * 2 - 5  # every other tick of the eight days
    assert len(missed) == MAX_MISSED_ROWS and missed[-1] < due[0]
    assert missed == sorted(missed) and (due[0] - missed[-1]).total_seconds() == 0.5
