"""``redlock.acquire`` and ``redlock.hold`` spans, made from the lock signals.

The acquire span is recorded once the call has ended, backdated to its start (``waited``
seconds earlier), so a lock call costs no tracing work while it waits. The hold span starts at
the acquisition and ends at the release. Attributes: ``redlock.alias``, ``redlock.token``,
``redlock.votes``, ``redlock.waited_ms``, ``redlock.attempts``; a failed acquire also has
``redlock.outcome`` (busy, timeout, unavailable) and an error status. No span carries the lock
name, which may hold user data.
"""

from __future__ import annotations

import time
import weakref
from typing import Any

from opentelemetry import trace
from opentelemetry.trace import Span, SpanKind, Status, StatusCode, Tracer

from ..observers import LockObserver

TRACER_NAME = "django_redlock"


class LockSpans(LockObserver):
    """Signal observers (:meth:`connect`/:meth:`disconnect`) making spans on ``tracer``
    (default: the global tracer provider's, looked up at each span, so a provider configured
    later is used)."""

    def __init__(self, tracer: Tracer | None = None) -> None:
        self._tracer = tracer if tracer is not None else trace.get_tracer(TRACER_NAME)
        #: the global tracer: nothing to do while no tracer provider is configured
        self._global = tracer is None
        self._holds: weakref.WeakKeyDictionary[Any, Span] = weakref.WeakKeyDictionary()

    @property
    def open_holds(self) -> int:
        """How many hold spans are open (leases held and traced)."""
        return len(self._holds)

    def _off(self) -> bool:
        """True while the global tracer has no provider (the API alone: nothing to record)."""
        return self._global and isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider)

    def _acquire_span(self, waited: float, attributes: dict[str, Any]) -> tuple[Span, int] | None:
        """An acquire span that started ``waited`` s ago (the caller ends it); None when not
        recording (no SDK configured, or not sampled)."""
        now = time.time_ns()
        span = self._tracer.start_span(
            "redlock.acquire",
            kind=SpanKind.INTERNAL,
            attributes=attributes,  # given at the start: one copy, no per-attribute calls
            start_time=now - int(waited * 1e9),
        )
        return (span, now) if span.is_recording() else None

    def on_acquired(
        self, *, alias: str, lease: Any, waited: float, attempts: int, **_: Any
    ) -> None:
        if self._off():
            return
        attributes = {
            "redlock.alias": alias,
            "redlock.token": lease.token,
            "redlock.votes": lease.votes,
            "redlock.waited_ms": waited * 1000,
            "redlock.attempts": attempts,
        }
        started = self._acquire_span(waited, attributes)
        if started is None:
            return
        span, now = started
        span.end(end_time=now)
        self._holds[lease] = self._tracer.start_span(
            "redlock.hold", kind=SpanKind.INTERNAL, attributes=attributes, start_time=now
        )

    def on_failed(
        self, *, alias: str, reason: str, waited: float, attempts: int, votes: int, **_: Any
    ) -> None:
        if self._off():
            return
        attributes = {
            "redlock.alias": alias,
            "redlock.votes": votes,
            "redlock.waited_ms": waited * 1000,
            "redlock.attempts": attempts,
            "redlock.outcome": reason,
        }
        started = self._acquire_span(waited, attributes)
        if started is None:
            return
        span, now = started
        span.set_status(Status(StatusCode.ERROR, f"not acquired: {reason}"))
        span.end(end_time=now)

    def on_released(self, *, lease: Any, **_: Any) -> None:
        if not self._holds:
            return
        hold = self._holds.pop(lease, None)
        if hold is not None:
            hold.set_attribute("redlock.held_ms", lease.held * 1000)
            hold.end()

    def on_lost(self, *, lease: Any, **_: Any) -> None:
        hold = self._holds.get(lease) if self._holds else None
        if hold is not None:
            hold.add_event("redlock.lost")
            hold.set_status(Status(StatusCode.ERROR, "lease lost while held"))
