"""``LocksPanel``: a django-debug-toolbar panel listing the locks a request took (name, alias,
token, wait, hold, the nodes that voted), as the SQL panel lists queries. Add it to
``DEBUG_TOOLBAR_PANELS`` (needs ``django-debug-toolbar``, the ``debug-toolbar`` extra)::

    DEBUG_TOOLBAR_PANELS = [*debug_toolbar.settings.PANELS_DEFAULTS,
                            "django_redlock.contrib.debug_toolbar.LocksPanel"]

Failed acquisitions are listed too. The panel records through the lock signals while the
toolbar's middleware runs (a context variable marks the request), so locks taken by other
requests or threads are never mixed in.
"""

from __future__ import annotations

import contextvars
from typing import Any

from debug_toolbar.panels import Panel
from django.http import HttpRequest, HttpResponse
from django.utils.translation import gettext_lazy as _
from django.utils.translation import ngettext

from .. import signals


class _Recording:
    """The locks of one request: a row per acquire call, and the leases of the won ones."""

    def __init__(self) -> None:
        self.rows: list[dict[str, Any]] = []
        self.leases: dict[int, Any] = {}

    def row(
        self, alias: str, name: str, outcome: str, waited: float, attempts: int
    ) -> dict[str, Any]:
        row: dict[str, Any] = {
            "name": name,
            "alias": alias,
            "outcome": outcome,
            "token": None,
            "waited_ms": round(waited * 1000, 3),
            "attempts": attempts,
            "held_ms": None,
            "still_held": False,
            "voters": [],
            "lost": False,
        }
        self.rows.append(row)
        return row

    def finished(self) -> list[dict[str, Any]]:
        """The rows with their hold times (until now for a lease still held)."""
        for index, lease in self.leases.items():
            self.rows[index]["held_ms"] = round(lease.held * 1000, 3)
            self.rows[index]["still_held"] = not lease.released
        return self.rows


#: The recording of the request being handled (None outside a toolbar request).
_current: contextvars.ContextVar[_Recording | None] = contextvars.ContextVar(
    "django_redlock_toolbar", default=None
)


def _on_acquired(*, alias: str, name: str, lease: Any, waited: float, **_: Any) -> None:
    recording = _current.get()
    if recording is not None:
        recording.leases[len(recording.rows)] = lease
        row = recording.row(alias, name, "acquired", waited, lease.attempts)
        row.update(token=lease.token, voters=lease.voters)


def _on_failed(
    *, alias: str, name: str, reason: str, waited: float, attempts: int, **_: Any
) -> None:
    recording = _current.get()
    if recording is not None:
        recording.row(alias, name, reason, waited, attempts)


def _on_lost(*, lease: Any, **_: Any) -> None:
    recording = _current.get()
    if recording is not None:
        for index, held in recording.leases.items():
            if held is lease:
                recording.rows[index]["lost"] = True


_OBSERVERS = (
    (signals.lock_acquired, _on_acquired),
    (signals.lock_failed, _on_failed),
    (signals.lock_lost, _on_lost),
)


class LocksPanel(Panel):
    """The locks of one request."""

    title = _("Locks")
    template = "django_redlock/debug_toolbar/locks.html"
    is_async = True
    _recording: _Recording | None = None
    _token: contextvars.Token[_Recording | None] | None = None

    @property
    def nav_subtitle(self) -> str:
        stats: dict[str, Any] = self.get_stats()  # type: ignore[no-untyped-call]
        count = len(stats.get("locks", []))
        text = ngettext("%(n)d lock, %(ms).1f ms waited", "%(n)d locks, %(ms).1f ms waited", count)
        return text % {"n": count, "ms": stats.get("waited_ms", 0.0)}

    def enable_instrumentation(self) -> None:
        for signal, observer in _OBSERVERS:  # added once per process
            signals.observe(signal, observer)
        self._recording = _Recording()
        self._token = _current.set(self._recording)

    def disable_instrumentation(self) -> None:
        if self._token is not None:
            _current.reset(self._token)
            self._token = None

    def generate_stats(self, request: HttpRequest, response: HttpResponse) -> None:
        rows = self._recording.finished() if self._recording is not None else []
        waited = round(sum(row["waited_ms"] for row in rows), 3)
        self.record_stats({"locks": rows, "waited_ms": waited})  # type: ignore[no-untyped-call]
