"""``REDLOCK_SCHEDULE``: its entries, checked, and their ticks (docs/schedules.md).

Ticks are instants every server computes alike, whatever its start time: an ``EVERY`` entry
ticks at the multiples of its period since the Unix epoch, a ``CRON`` entry at the times its
expression gives in its ``TIMEZONE`` (parsed by ``cronsim``, a maintained cron library).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from django.utils.module_loading import import_string

#: The keys an entry may have (contract: docs/schedules.md).
KEYS = ("CALL", "CRON", "EVERY", "ARGS", "KWARGS", "USING", "TTL", "TIMEZONE", "CATCH_UP")
#: The longest entry name (it goes into lock names and effect keys).
MAX_ENTRY_NAME = 100
#: The shortest and longest ``EVERY``, seconds.
MIN_EVERY = 0.5
MAX_EVERY = 366 * 24 * 3600.0
#: The longest ``TTL``: a killed scheduler's entry waits that long (and the lease's renewal
#: thread cannot wait much longer than ~9e9 s).
MAX_TTL = MAX_EVERY


@dataclass(frozen=True)
class Entry:
    """One checked entry of ``REDLOCK_SCHEDULE``."""

    name: str
    call: str
    cron: str | None = None
    every: float | None = None
    args: tuple[Any, ...] = ()
    kwargs: Mapping[str, Any] = field(default_factory=dict)
    using: str = "default"
    ttl: float | None = None
    timezone: str = "UTC"
    catch_up: bool = False

    @property
    def zone(self) -> ZoneInfo:
        return ZoneInfo(self.timezone)

    def describe(self) -> str:
        """The entry's schedule as written: ``cron 0 3 * * * (Europe/Paris)`` or ``every 30 s``."""
        if self.cron is not None:
            return f"cron {self.cron} ({self.timezone})"
        return f"every {self.every:g} s"

    def function(self) -> Callable[..., Any]:
        """The callable ``CALL`` names (imported now)."""
        found = import_string(self.call)
        if not callable(found):
            raise TypeError(f"{self.call} is not callable")
        return found  # type: ignore[no-any-return]

    # -- ticks -------------------------------------------------------------------------------
    def ticks_after(self, after: datetime) -> Iterator[datetime]:
        """The ticks strictly after ``after`` (aware), in order, as aware UTC datetimes."""
        if self.every is not None:
            step = self.every
            n = math.floor(after.timestamp() / step) + 1
            while True:
                yield datetime.fromtimestamp(n * step, UTC)
                n += 1
        from cronsim import CronSim

        assert self.cron is not None
        for tick in CronSim(self.cron, after.astimezone(self.zone)):
            if tick > after:  # cronsim starts at the minute: never the instant itself
                yield tick.astimezone(UTC)

    def ticks_between(self, after: datetime, until: datetime) -> list[datetime]:
        """The ticks in ``(after, until]``."""
        found = []
        for tick in self.ticks_after(after):
            if tick > until:
                break
            found.append(tick)
        return found

    def next_tick(self, after: datetime) -> datetime:
        return next(self.ticks_after(after))

    def period_at(self, tick: datetime) -> float:
        """Seconds from ``tick`` to the next one (a cron entry's gaps differ)."""
        return (self.next_tick(tick) - tick).total_seconds()


def tick_key(entry: str, tick: datetime) -> str:
    """The effect key of one tick: ``schedule:<entry>:<tick time, UTC, ISO 8601>``."""
    return f"schedule:{entry}:{tick.astimezone(UTC).isoformat(timespec='milliseconds')}"


def schedule_setting() -> list[Entry]:
    """The entries of the ``REDLOCK_SCHEDULE`` setting (none if unset); a ``CRON`` entry's
    ``TIMEZONE`` defaults to ``TIME_ZONE`` (UTC when that is unset)."""
    from django.conf import settings

    default_timezone = getattr(settings, "TIME_ZONE", None) or "UTC"
    return parse_schedule(getattr(settings, "REDLOCK_SCHEDULE", None), default_timezone)


def parse_schedule(setting: object, default_timezone: str = "UTC") -> list[Entry]:
    """The entries of ``REDLOCK_SCHEDULE`` (``setting``); ``ValueError`` or ``TypeError``
    naming the entry and the key for the first problem found."""
    if setting is None:
        return []
    if not isinstance(setting, Mapping):
        raise TypeError(
            f"REDLOCK_SCHEDULE must be a dict of entry names to entries, got "
            f"{type(setting).__name__}."
        )
    return [_entry(name, raw, default_timezone) for name, raw in setting.items()]


def _entry(name: object, raw: object, default_timezone: str) -> Entry:
    if not isinstance(name, str) or not name or len(name) > MAX_ENTRY_NAME or ":" in name:
        raise ValueError(
            f"REDLOCK_SCHEDULE: entry name {name!r} must be a str of 1 to {MAX_ENTRY_NAME} "
            "characters without ':'."
        )
    where = f"REDLOCK_SCHEDULE[{name!r}]"
    if not isinstance(raw, Mapping):
        raise TypeError(f"{where} must be a dict with CALL and CRON or EVERY.")
    unknown = sorted(str(k) for k in raw if k not in KEYS)
    if unknown:
        raise ValueError(f"{where}: unknown key {unknown[0]!r}; keys are {', '.join(KEYS)}.")
    call = raw.get("CALL")
    if not isinstance(call, str) or "." not in call:
        raise ValueError(f"{where}['CALL'] must be the dotted path of a callable, got {call!r}.")
    cron, every = raw.get("CRON"), raw.get("EVERY")
    if (cron is None) == (every is None):
        raise ValueError(f"{where}: give exactly one of CRON and EVERY.")
    if cron is not None:
        cron = _cron(where, cron)
    if every is not None:
        every = _every(where, every)
    args, kwargs = raw.get("ARGS", ()), raw.get("KWARGS", {})
    if not isinstance(args, list | tuple):
        raise TypeError(f"{where}['ARGS'] must be a list, got {type(args).__name__}.")
    if not isinstance(kwargs, Mapping) or not all(isinstance(k, str) for k in kwargs):
        raise TypeError(f"{where}['KWARGS'] must be a dict with str keys.")
    using = raw.get("USING", "default")
    if not isinstance(using, str) or not using:
        raise TypeError(f"{where}['USING'] must be an alias of REDLOCK, got {using!r}.")
    ttl = raw.get("TTL")
    if ttl is not None and (
        isinstance(ttl, bool) or not isinstance(ttl, int | float) or not 0 < ttl <= MAX_TTL
    ):
        raise ValueError(
            f"{where}['TTL'] must be a number of seconds > 0, at most a year, got {ttl!r}."
        )
    timezone = raw.get("TIMEZONE", default_timezone)
    try:
        ZoneInfo(timezone)
    except (ZoneInfoNotFoundError, ValueError, TypeError):
        raise ValueError(f"{where}['TIMEZONE'] is not a known time zone: {timezone!r}.") from None
    catch_up = raw.get("CATCH_UP", False)
    if not isinstance(catch_up, bool):
        raise TypeError(f"{where}['CATCH_UP'] must be True or False, got {catch_up!r}.")
    return Entry(
        name=name,
        call=call,
        cron=cron,
        every=every,
        args=tuple(args),
        kwargs=dict(kwargs),
        using=using,
        ttl=None if ttl is None else float(ttl),
        timezone=timezone,
        catch_up=catch_up,
    )


def _cron(where: str, cron: object) -> str:
    if not isinstance(cron, str) or len(cron.split()) != 5:
        raise ValueError(
            f"{where}['CRON'] must be a cron expression of five fields "
            f"(minute hour day month weekday), got {cron!r}."
        )
    try:
        from cronsim import CronSim, CronSimError
    except ImportError:  # pragma: no cover - the extra is installed in the tests
        raise ValueError(
            f"{where}['CRON'] needs the cronsim library: pip install 'django-redlock[schedule]'."
        ) from None
    try:
        CronSim(cron, datetime.now(UTC))
    except CronSimError as exc:
        raise ValueError(f"{where}['CRON'] {cron!r} is not valid: {exc}.") from None
    return " ".join(cron.split())


def _every(where: str, every: object) -> float:
    if isinstance(every, bool) or not isinstance(every, int | float):
        raise TypeError(f"{where}['EVERY'] must be a number of seconds, got {every!r}.")
    if not MIN_EVERY <= every <= MAX_EVERY:
        raise ValueError(f"{where}['EVERY'] must be from {MIN_EVERY:g} s to a year, got {every!r}.")
    return float(every)


def late_limit(entry: Entry, ttl: float, tick: datetime) -> timedelta:
    """How late a tick may still run: a scheduler killed while it held the entry keeps the
    others out for up to its TTL; later than that (plus one period, at most a minute, and a
    second of slack) nobody was there to run it: it is missed."""
    return timedelta(seconds=ttl + min(entry.period_at(tick), 60.0) + 1.0)
