"""django_redlock.contrib.otel (docs/observability.md) with the OpenTelemetry SDK and its in-memory
exporter:
the spans, their parents and attributes, on real nodes; nothing recorded without a provider."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator

import pytest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode, Tracer

from django_redlock import locks
from django_redlock.contrib.otel.spans import LockSpans
from django_redlock.exceptions import LockLost, LockNotAcquired
from tests.support.waiting import release_once_waited_for


@pytest.fixture
def traced() -> Iterator[tuple[Tracer, InMemorySpanExporter]]:
    """A tracer of the test's own provider, wired to the lock signals; the finished spans."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("tests")
    spans = LockSpans(provider.get_tracer("django_redlock"))
    spans.connect()
    yield tracer, exporter
    spans.disconnect()
    provider.shutdown()


def by_name(exporter: InMemorySpanExporter, name: str) -> list[ReadableSpan]:
    return [s for s in exporter.get_finished_spans() if s.name == name]


def test_acquire_and_hold_are_children_of_the_current_span(
    traced: tuple[Tracer, InMemorySpanExporter], unique_name: str
) -> None:
    """A lock taken inside a "request" span after a wait of at least 0.2 s (the holder
    releases 0.2 s after the waiter is seen waiting, so after its call began): a
    redlock.acquire span covering that wait and a redlock.hold span, both children of the
    request span, with the alias, the lease's token and votes, the wait in ms and the
    attempts; the hold ends at the release."""
    tracer, exporter = traced
    manager = locks["multi"]
    holder = manager.acquire(unique_name, timeout=0)
    with tracer.start_as_current_span("request") as request:
        releaser = release_once_waited_for(manager, unique_name, holder, 0.2)
        with manager.lock(unique_name, timeout=30) as lease:
            time.sleep(0.05)
    releaser.join()
    parent = request.get_span_context()
    acquires = by_name(exporter, "redlock.acquire")
    assert len(acquires) == 2  # the holder's (no parent) and the waiter's
    waited = next(s for s in acquires if s.parent is not None)
    assert waited.parent.span_id == parent.span_id
    assert waited.context.trace_id == parent.trace_id
    attrs = dict(waited.attributes or {})
    assert attrs["redlock.alias"] == "multi" and attrs["redlock.token"] == lease.token
    assert attrs["redlock.votes"] >= 2 and attrs["redlock.attempts"] >= 2  # a quorum of 3
    assert attrs["redlock.waited_ms"] >= 200
    # the span is backdated by the wait: it lasts exactly the wait (to the nanosecond)
    duration_ns = waited.end_time - waited.start_time
    assert abs(duration_ns - attrs["redlock.waited_ms"] * 1e6) <= 1
    holds = [s for s in by_name(exporter, "redlock.hold") if s.parent is not None]
    assert len(holds) == 1 and holds[0].parent.span_id == parent.span_id
    hold_attrs = dict(holds[0].attributes or {})
    assert hold_attrs["redlock.token"] == lease.token and hold_attrs["redlock.held_ms"] >= 50
    assert holds[0].start_time >= waited.end_time
    for span in exporter.get_finished_spans():  # lock names may hold user data: never in spans
        assert not any(unique_name in str(v) for v in (span.attributes or {}).values())


def test_a_failed_acquire_is_an_error_span(
    traced: tuple[Tracer, InMemorySpanExporter], unique_name: str
) -> None:
    """A busy name: redlock.acquire with an error status, the outcome, 0 votes; no hold."""
    tracer, exporter = traced
    manager = locks["multi"]
    holder = manager.acquire(unique_name, timeout=0)
    exporter.clear()
    with tracer.start_as_current_span("request"), pytest.raises(LockNotAcquired):
        manager.acquire(unique_name, timeout=0.1)
    holder.release()
    failed = by_name(exporter, "redlock.acquire")[0]
    assert failed.status.status_code is StatusCode.ERROR
    attrs = dict(failed.attributes or {})
    assert attrs["redlock.outcome"] == "timeout" and attrs["redlock.votes"] == 0
    assert attrs["redlock.attempts"] >= 2 and attrs["redlock.waited_ms"] >= 100
    assert "redlock.token" not in attrs
    assert [s.name for s in exporter.get_finished_spans()].count("redlock.hold") == 1  # holder


def test_a_lost_lease_marks_its_hold_span(
    traced: tuple[Tracer, InMemorySpanExporter], unique_name: str
) -> None:
    """Force-released while held: the hold span gets a redlock.lost event and an error status."""
    _, exporter = traced
    manager = locks["multi"]
    with pytest.raises(LockLost), manager.lock(unique_name, timeout=0) as lease:
        manager.force_release(unique_name)
        lease.extend()
    (hold,) = by_name(exporter, "redlock.hold")
    assert [e.name for e in hold.events] == ["redlock.lost"]
    assert hold.status.status_code is StatusCode.ERROR


def test_asyncio_locks_are_traced_in_their_task_context(
    traced: tuple[Tracer, InMemorySpanExporter], unique_name: str
) -> None:
    """alock inside a span of a task: acquire and hold are children of that span."""
    tracer, exporter = traced

    async def main() -> int:
        with tracer.start_as_current_span("task") as task:
            async with locks["multi"].alock(unique_name, timeout=1):
                pass
            return task.get_span_context().span_id

    parent = asyncio.run(main())
    spans = by_name(exporter, "redlock.acquire") + by_name(exporter, "redlock.hold")
    assert len(spans) == 2 and all(s.parent and s.parent.span_id == parent for s in spans)


def test_nothing_is_recorded_without_a_tracer_provider(unique_name: str) -> None:
    """The default tracer with no SDK provider configured (none is, in this test process): no
    hold span is kept, nothing is exported; the lock works as ever."""
    spans = LockSpans()
    spans.connect()
    try:
        with locks["multi"].lock(unique_name, timeout=0):
            assert spans.open_holds == 0
    finally:
        spans.disconnect()
