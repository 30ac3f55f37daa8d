"""What the observability apps cost per lock (docs/observability.md): prints a table.

One process makes acquire (one attempt, ``timeout=0``) + release pairs back to back, on one
node and on three, in interleaved rounds of five cases:

1. bare: no receiver on the lock signals;
2. ``contrib.prometheus``: the metrics in prometheus-client's default registry (and its
   background refresher running);
3. ``contrib.prometheus`` + ``contrib.otel`` with the OpenTelemetry SDK configured (a
   ``TracerProvider`` whose ``BatchSpanProcessor`` hands every span to an exporter that drops
   it): each pair records a ``redlock.acquire`` and a ``redlock.hold`` span;
4. the same with the SDK sampling 10% of the traces (``ParentBased(TraceIdRatioBased(0.1))``,
   as production tracing usually runs);
5. ``contrib.prometheus`` + ``contrib.otel`` without an SDK (the API's no-op tracer).

A case's observers are registered for its rounds only (as the apps' ``ready()`` registers
them); the metrics' background refresher runs throughout, as in a process with the app.
pairs/s is the median over the rounds (the SDK case includes flushing its spans); "cost" is
bare's pairs/s over the case's. "CPU us/pair" is this process's CPU time per pair
(``time.process_time()``, the exporter thread's included): what the apps add whatever the
network and the other processes on the machine do.

    .venv/bin/python benchmarks/observability_overhead.py [--pairs 1000] [--rounds 12]
    PROMETHEUS_MULTIPROC_DIR=$(mktemp -d) .venv/bin/python benchmarks/observability_overhead.py

(the second form measures prometheus-client's multiprocess mode, as under gunicorn: every
observation is written to a memory-mapped file). Starts its own redis-server processes on
free loopback ports and stops them at the end.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def run_pairs(manager: Any, pairs: int, offset: int) -> None:
    for i in range(offset, offset + pairs):
        manager.acquire(f"bench:obs:{i}", timeout=0).release()


Case = tuple[Callable[[], None], Callable[[], None], Callable[[], None]]


def observers() -> dict[str, Case]:
    """case -> (connect, flush, disconnect); flush runs inside the timed part."""
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult
    from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased

    from django_redlock import signals
    from django_redlock.contrib.otel.spans import LockSpans
    from django_redlock.contrib.prometheus.metrics import default_metrics

    class Discard(SpanExporter):
        def export(self, spans: Sequence[Any]) -> SpanExportResult:
            return SpanExportResult.SUCCESS

    metrics = default_metrics()
    # started once, as in a process that runs the app: its probe every 5 s is a background
    # cost every case shares (restarting it per case would charge a probe to each round)
    metrics.refresher.ensure_running()

    def case(*spans: LockSpans, flush: Callable[[], None] = lambda: None) -> Case:
        pairs = [*metrics.observers(), *(pair for s in spans for pair in s.observers())]

        def connect() -> None:
            for signal, observer in pairs:
                signals.observe(signal, observer)

        def disconnect() -> None:
            for signal, observer in pairs:
                signals.unobserve(signal, observer)

        return connect, flush, disconnect

    def tracing(sampler: Any = None) -> tuple[LockSpans, Callable[[], None]]:
        provider = TracerProvider() if sampler is None else TracerProvider(sampler=sampler)
        provider.add_span_processor(BatchSpanProcessor(Discard()))
        # the exporter thread's work stays inside the case's time
        return LockSpans(provider.get_tracer("django_redlock")), lambda: provider.force_flush()

    recording, flush_all = tracing()
    tenth, flush_tenth = tracing(ParentBased(TraceIdRatioBased(0.1)))
    noop = LockSpans(trace.get_tracer("django_redlock"))  # no global provider: no-op
    nothing = (lambda: None, lambda: None, lambda: None)
    return {
        "bare": nothing,
        "prometheus": case(),
        "prometheus + otel (SDK)": case(recording, flush=flush_all),
        "prometheus + otel (SDK, 10%)": case(tenth, flush=flush_tenth),
        "prometheus + otel (no SDK)": case(noop),
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--pairs", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=12)
    args = parser.parse_args()

    from django_redlock.testing import RedisNodes

    with RedisNodes.start(3) as nodes:
        import django
        from django.conf import settings

        settings.configure(
            INSTALLED_APPS=["django_redlock"],
            REDLOCK={
                "one": {"NODES": nodes.urls[:1], "KEY_PREFIX": "one:"},
                "three": {"NODES": nodes.urls, "KEY_PREFIX": "three:"},
            },
        )
        django.setup()
        from django_redlock import locks

        cases = observers()
        results: dict[tuple[str, str], list[float]] = {}
        cpu_results: dict[tuple[str, str], list[float]] = {}
        offset = 0
        for alias in ("one", "three"):
            run_pairs(locks[alias], 300, offset)  # warm up connections and scripts
            offset += 300
            names = list(cases)
            for round_ in range(args.rounds):  # interleaved and rotated: same machine for all
                shift = round_ % len(names)
                for case in names[shift:] + names[:shift]:
                    connect, flush, disconnect = cases[case]
                    connect()
                    try:
                        started, cpu = time.perf_counter(), time.process_time()
                        run_pairs(locks[alias], args.pairs, offset)
                        flush()
                        rate = args.pairs / (time.perf_counter() - started)
                        cpu_us = (time.process_time() - cpu) / args.pairs * 1e6
                    finally:
                        disconnect()
                    offset += args.pairs
                    results.setdefault((alias, case), []).append(rate)
                    cpu_results.setdefault((alias, case), []).append(cpu_us)

    header = f"{'nodes':<7}{'case':<32}{'pairs/s':>10}{'us/pair':>10}{'cost':>8}"
    print(f"{header}{'CPU us/pair':>14}{'CPU cost':>10}")
    for alias, count in (("one", 1), ("three", 3)):
        bare = statistics.median(results[(alias, "bare")])
        bare_cpu = statistics.median(cpu_results[(alias, "bare")])
        for case in cases:
            rate = statistics.median(results[(alias, case)])
            cpu = statistics.median(cpu_results[(alias, case)])
            print(
                f"{count:<7}{case:<32}{rate:>10.0f}{1e6 / rate:>10.1f}{bare / rate:>7.2f}x"
                f"{cpu:>14.1f}{cpu / bare_cpu:>9.2f}x"
            )


if __name__ == "__main__":
    main()
