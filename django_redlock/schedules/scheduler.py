"""The scheduler ``manage.py redlock scheduler`` runs on every server (docs/schedules.md).

Each round it visits every entry. An entry is handled by one scheduler at a time, under the
lock ``schedule:<entry>`` (auto-extended, taken without waiting: a busy entry is another
scheduler's this round). The handler looks at what the ticks' rows say, then:

* a row left ``running`` belongs to a scheduler that lost the entry (killed, or paused past
  its TTL): the tick's ledger effect says whether it finished; if not it is ``interrupted``
  and never run again (it may have happened);
* each tick due since the last one recorded runs once, as the effect
  ``schedule:<entry>:<tick>`` of the entry's lease (a tick another scheduler began is seen in
  the ledger, never run twice), in order, late if need be;
* a tick later than :func:`~.entries.late_limit` was missed (no scheduler was there): it is
  recorded and logged, and with ``CATCH_UP`` the missed ticks are made up by one run.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import socket
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING

from django.conf import settings
from django.db import close_old_connections, connections

from ..exceptions import LockError, LockNotAcquired, NodesUnavailable, StaleTokenError
from ..locking.registry import locks
from .context import reset_tick, set_tick
from .entries import Entry, late_limit, tick_key
from .model import (
    CAUGHT_UP,
    DONE,
    FAILED,
    INTERRUPTED,
    MISSED,
    RUNNING,
    ScheduledTick,
)

if TYPE_CHECKING:
    from ..locking.lease import Lease

logger = logging.getLogger("django_redlock")

#: How often a scheduler visits its entries, seconds.
ROUND = 0.1
#: At most this many missed ticks of one entry get a row each (the most recent ones).
MAX_MISSED_ROWS = 100


def utcnow() -> datetime:
    return datetime.now(UTC)


def db_time(moment: datetime) -> datetime:
    """``moment`` as the database stores it (naive UTC without ``USE_TZ``)."""
    if settings.USE_TZ:
        return moment
    return moment.astimezone(UTC).replace(tzinfo=None)


def from_db(moment: datetime) -> datetime:
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)


class _Unfinished(Exception):
    """Leaves a settled tick's effect begun (see :meth:`Scheduler._settle_stale`)."""


def lock_name(entry: str) -> str:
    return f"schedule:{entry}"


class Scheduler:
    """Runs the due ticks of ``entries`` until :meth:`stop` (or ``seconds`` have passed)."""

    def __init__(self, entries: Sequence[Entry], *, say: Callable[[str], None] | None = None):
        self.entries = list(entries)
        self.host = f"{socket.gethostname()}:{os.getpid()}"
        self.started = utcnow()
        self._say = say or (lambda line: None)
        self._stop = threading.Event()
        self._running: dict[str, threading.Thread] = {}
        #: per entry, no tick is due before this (a cache: the rows decide)
        self._not_before: dict[str, datetime] = {}

    def stop(self) -> None:
        self._stop.set()

    def run(self, seconds: float | None = None, *, drain: float = 30.0) -> None:
        """Visit the entries every :data:`ROUND` until stopped; then wait up to ``drain``
        seconds for the runs under way."""
        deadline = None if seconds is None else time.monotonic() + seconds
        while not self._stop.is_set() and (deadline is None or time.monotonic() < deadline):
            for entry in self.entries:
                self.visit(entry)
            self._stop.wait(ROUND)
        for thread in list(self._running.values()):
            thread.join(drain)

    # -- one entry ---------------------------------------------------------------------------
    def visit(self, entry: Entry) -> None:
        """Take the entry and hand it to a thread if a tick may be due."""
        running = self._running.get(entry.name)
        if running is not None and running.is_alive():
            return
        now = utcnow()
        if self._not_before.get(entry.name, now) > now:
            return
        manager = locks[entry.using]
        ttl = entry.ttl if entry.ttl is not None else manager.config.ttl
        try:
            lease = manager.acquire(lock_name(entry.name), ttl=ttl, timeout=0, auto_extend=True)
        except LockNotAcquired:  # another scheduler handles it now: look again at the next
            # tick, or sooner (a quarter of the TTL) in case that scheduler dies holding it
            wait = timedelta(seconds=ttl / 4)
            self._not_before[entry.name] = min(entry.next_tick(now), now + wait)
            return
        except NodesUnavailable as exc:
            logger.warning("Schedule %r: no quorum to take the entry: %s", entry.name, exc)
            return
        thread = threading.Thread(
            target=self._handle,
            args=(entry, lease, ttl),
            name=f"redlock-schedule {entry.name}",
            daemon=True,
        )
        self._running[entry.name] = thread
        thread.start()

    def _handle(self, entry: Entry, lease: Lease, ttl: float) -> None:
        try:
            close_old_connections()
            self._settle_stale(entry, lease)
            last = ScheduledTick.objects.filter(entry=entry.name).order_by("-tick").first()
            first = self.started - timedelta(milliseconds=1)  # no history: from our start on
            after = from_db(last.tick) if last is not None else first
            now = utcnow()
            missed, count, due = self._due(entry, after, now, ttl)
            if missed:
                self._missed(entry, lease, missed, count)
            for tick in due:
                if lease.lost or self._stop.is_set():  # stopping: only the run under way ends
                    break
                self._run(entry, lease, tick, DONE)
            self._not_before[entry.name] = entry.next_tick(utcnow())
        except LockError as exc:
            logger.warning("Schedule %r: the entry's lease ended: %s", entry.name, exc)
        except Exception:
            logger.exception("Schedule %r: handling the entry failed", entry.name)
        finally:
            with contextlib.suppress(LockError):
                lease.release()
            connections.close_all()

    def _due(
        self, entry: Entry, after: datetime, now: datetime, ttl: float
    ) -> tuple[list[datetime], int, list[datetime]]:
        """(the most recent :data:`MAX_MISSED_ROWS` missed ticks, how many were missed in all;
        ticks to run). After a long outage an ``EVERY`` entry's missed ticks are counted by
        arithmetic, not one by one; a ``CRON`` entry ticks at most once a minute."""
        count = 0
        if entry.every is not None:
            step = entry.every
            cutoff = now - late_limit(entry, ttl, entry.next_tick(now))  # a tick: one period
            skip = math.floor(cutoff.timestamp() / step) - math.floor(after.timestamp() / step)
            skip -= MAX_MISSED_ROWS
            if skip > 0:  # all missed: jump to the last MAX_MISSED_ROWS before the cutoff
                count = skip
                after = datetime.fromtimestamp(
                    (math.floor(after.timestamp() / step) + skip) * step, UTC
                )
        missed: deque[datetime] = deque(maxlen=MAX_MISSED_ROWS)
        due: list[datetime] = []
        for tick in entry.ticks_after(after):
            if tick > now:
                break
            if now - tick > late_limit(entry, ttl, tick):
                count += 1
                missed.append(tick)
            else:
                due.append(tick)
        return list(missed), count, due

    def _settle_stale(self, entry: Entry, lease: Lease) -> None:
        """Rows left ``running`` by a scheduler that lost the entry: interrupted, unless the
        ledger says their run finished."""
        for row in ScheduledTick.objects.filter(entry=entry.name, outcome=RUNNING):
            tick = from_db(row.tick)
            # Beginning the effect under this lease fences the lost run's completion; leaving
            # the block by an exception keeps it begun: the ledger must never say done for a
            # run nobody finished (a later settle would report it done).
            with contextlib.suppress(_Unfinished), lease.once(tick_key(entry.name, tick)) as effect:
                outcome = DONE if effect.done else INTERRUPTED
                if outcome == INTERRUPTED:
                    raise _Unfinished
            ScheduledTick.objects.filter(pk=row.pk, outcome=RUNNING).update(
                outcome=outcome, finished_at=db_time(utcnow())
            )
            if outcome == INTERRUPTED:
                logger.warning(
                    "Schedule %r: tick %s was interrupted (begun by %s, which lost the entry); "
                    "it is not run again",
                    entry.name,
                    tick.isoformat(),
                    row.host,
                )

    def _missed(self, entry: Entry, lease: Lease, missed: list[datetime], count: int) -> None:
        logger.warning(
            "Schedule %r: %d tick(s) missed (no scheduler ran them in time), the last %s%s",
            entry.name,
            count,
            missed[-1].isoformat(),
            "; catching up with one run" if entry.catch_up else "",
        )
        self._say(f"{entry.name}: {count} tick(s) missed, the last {missed[-1]}")
        for tick in missed[:-1] if entry.catch_up else missed:
            ScheduledTick.objects.get_or_create(
                entry=entry.name,
                tick=db_time(tick),
                defaults={"outcome": MISSED, "host": self.host, "token": lease.token},
            )
        if entry.catch_up:
            self._run(entry, lease, missed[-1], CAUGHT_UP, note=f"made up {count} tick(s)")

    def _run(self, entry: Entry, lease: Lease, tick: datetime, ran: str, note: str = "") -> None:
        """Run ``tick`` once: the ledger effect decides; the row reports."""
        started = utcnow()
        row, created = ScheduledTick.objects.get_or_create(
            entry=entry.name,
            tick=db_time(tick),
            defaults={
                "outcome": RUNNING,
                "host": self.host,
                "token": lease.token,
                "started_at": db_time(started),
                "note": note,
            },
        )
        if not created:  # recorded already (by another handler): nothing to do
            return
        outcome, error = ran, note
        try:
            with lease.once(tick_key(entry.name, tick)) as effect:
                if effect.done:
                    outcome = DONE
                elif effect.interrupted:
                    outcome = INTERRUPTED
                else:
                    self._say(f"{entry.name}: running tick {tick.isoformat()}")
                    outcome, error = self._call(entry, tick, ran, note)
        except StaleTokenError:  # paused past the TTL: a newer handler settled the tick
            error = "finished after the entry's lease was lost (it ran once, here)"
            logger.warning("Schedule %r: tick %s %s", entry.name, tick.isoformat(), error)
        ScheduledTick.objects.filter(pk=row.pk).update(
            outcome=outcome, finished_at=db_time(utcnow()), note=error
        )

    def _call(self, entry: Entry, tick: datetime, ran: str, note: str) -> tuple[str, str]:
        token = set_tick(tick)
        try:
            entry.function()(*entry.args, **entry.kwargs)
        except BaseException as exc:  # sys.exit() or KeyboardInterrupt from a job: it failed
            logger.exception("Schedule %r: tick %s failed", entry.name, tick.isoformat())
            return FAILED, f"{type(exc).__name__}: {exc}"[:2000]
        finally:
            reset_tick(token)
        return ran, note
