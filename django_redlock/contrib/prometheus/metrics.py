"""The metrics of docs/observability.md and the signal observers that feed them.

``redlock_acquire_seconds`` (histogram; ``alias``, ``outcome``): how long acquire calls took,
by how they ended (``acquired``; ``busy`` for busy and timed-out calls; ``unavailable``).
``redlock_hold_seconds`` (histogram; ``alias``): from acquisition to release.
``redlock_lost_total`` (counter; ``alias``): leases found lost. ``redlock_waiters`` and the
node gauges are set by :mod:`.refresher`, away from the request path.
"""

from __future__ import annotations

import functools
import threading
from typing import Any

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge, Histogram

from ...locking.registry import locks
from ..observers import LockObserver
from .refresher import Refresher

#: Acquire durations: a free name takes about a millisecond; waits run to the timeout.
ACQUIRE_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
#: Hold durations: from a fast critical section to a long job under auto-extend.
HOLD_BUCKETS = (0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 10.0, 30.0, 60.0, 300.0, 3600.0)
#: ``lock_failed`` reasons -> the ``outcome`` label (a timeout is a busy name that stayed busy).
OUTCOMES = {"busy": "busy", "timeout": "busy", "unavailable": "unavailable"}


class RedlockMetrics(LockObserver):
    """The metrics in ``registry`` and their signal observers (:meth:`connect`/:meth:`disconnect`).

    Gauges get a multiprocess mode, so prometheus-client's multiprocess mode (gunicorn) adds
    up the waiters of the live workers and keeps the freshest node reading."""

    def __init__(
        self,
        registry: CollectorRegistry = REGISTRY,
        waiters_interval: float = 0.5,
        nodes_interval: float = 5.0,
    ) -> None:
        self.acquire = Histogram(
            "redlock_acquire_seconds",
            "Seconds an acquire call took, by outcome (acquired, busy, unavailable).",
            ["alias", "outcome"],
            buckets=ACQUIRE_BUCKETS,
            registry=registry,
        )
        self.hold = Histogram(
            "redlock_hold_seconds",
            "Seconds from acquiring a lease to releasing it.",
            ["alias"],
            buckets=HOLD_BUCKETS,
            registry=registry,
        )
        self.lost = Counter(
            "redlock_lost", "Leases found lost while held.", ["alias"], registry=registry
        )
        self.waiters = Gauge(
            "redlock_waiters",
            "Acquire calls waiting for a busy name now.",
            ["alias"],
            registry=registry,
            multiprocess_mode="livesum",
        )
        node_gauge = functools.partial(
            Gauge,
            labelnames=["alias", "node"],
            registry=registry,
            multiprocess_mode="livemostrecent",
        )
        self.node_up = node_gauge(
            "redlock_node_up", "1 when the node answered the last health probe, else 0."
        )
        self.node_rtt = node_gauge(
            "redlock_node_rtt_seconds", "Round-trip time of the last health probe of the node."
        )
        self.refresher = Refresher(self, waiters_interval, nodes_interval)
        #: the label children of the hot path, per alias
        self._acquired: dict[str, Any] = {}
        self._held: dict[str, Any] = {}

    def connect(self) -> None:
        """Observe the lock signals (the gauges start refreshing at the first lock event).

        Every configured alias's lost-lease counter is exported from the start, at 0, so an
        alert on its increase fires on the first lost lease."""
        super().connect()
        for alias in locks:
            self.lost.labels(alias)

    def disconnect(self) -> None:
        super().disconnect()
        self.refresher.stop()

    def on_acquired(self, *, alias: str, waited: float, **_: Any) -> None:
        self.refresher.ensure_running()
        child = self._acquired.get(alias)
        if child is None:  # labels() takes a lock and builds a key: once per alias
            child = self._acquired[alias] = self.acquire.labels(alias, "acquired")
        child.observe(waited)

    def on_failed(self, *, alias: str, reason: str, waited: float, **_: Any) -> None:
        self.refresher.ensure_running()
        self.acquire.labels(alias, OUTCOMES.get(reason, "busy")).observe(waited)

    def on_released(self, *, alias: str, lease: Any, **_: Any) -> None:
        child = self._held.get(alias)
        if child is None:
            child = self._held[alias] = self.hold.labels(alias)
        child.observe(lease.held)

    def on_lost(self, *, alias: str, **_: Any) -> None:
        self.lost.labels(alias).inc()


_default: RedlockMetrics | None = None
_default_mutex = threading.Lock()


def default_metrics() -> RedlockMetrics:
    """The metrics of the default registry (created once per process)."""
    global _default
    with _default_mutex:
        if _default is None:
            _default = RedlockMetrics()
        return _default
