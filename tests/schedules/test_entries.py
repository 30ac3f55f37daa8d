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
        assert "django_redlock.E031" in [m.id for m in check_settings()]
    bad_alias = {"a": {"CALL": JOB, "EVERY": 1, "USING": "nope"}}
    with override_settings(REDLOCK_SCHEDULE=bad_alias):
        assert "django_redlock.E032" in [m.id for m in check_settings()]
    with override_settings(REDLOCK_SCHEDULE={"a": {"CALL": "tests.nowhere.job", "EVERY": 1}}):
        messages = check_settings()
        assert [m.id for m in messages if m.level >= checks.ERROR] == ["django_redlock.E033"]
    with override_settings(REDLOCK_SCHEDULE={"a": {"CALL": JOB, "EVERY": 1}}):
        assert check_settings() == []
