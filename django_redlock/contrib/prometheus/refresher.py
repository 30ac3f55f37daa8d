"""The gauges' background refresher: one daemon thread per process reads every alias's count
of waiting calls from its engine (no I/O) every ``waiters_interval`` seconds, and probes its
nodes (``PING``, ``INFO``, all at once, each within its alias's socket timeout, through
:mod:`django_redlock.nodes.probe`) every ``nodes_interval`` seconds.

No lock call ever waits for a probe. The thread starts at the first lock event of a process
(after a fork too: a gunicorn worker starts its own), so a process that takes no lock, such as
``manage.py migrate``, never probes anything.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from typing import Protocol

from prometheus_client import Gauge

from ... import inspection
from ...locking.registry import locks
from ..nodes import public_label


class Gauges(Protocol):
    """The gauges a refresher sets (``RedlockMetrics`` has them)."""

    waiters: Gauge
    node_up: Gauge
    node_rtt: Gauge


# docs/index.md: one logger name (records carry .module)
logger = logging.getLogger("django_redlock")


class Refresher:
    """Sets ``redlock_waiters``, ``redlock_node_up`` and ``redlock_node_rtt_seconds``."""

    def __init__(self, metrics: Gauges, waiters_interval: float, nodes_interval: float) -> None:
        self._metrics = metrics
        self.waiters_interval = waiters_interval
        self.nodes_interval = nodes_interval
        self._pid = 0
        self._stop = threading.Event()
        self._mutex = threading.Lock()
        #: this process's thread (None before the first lock event and after :meth:`stop`)
        self.thread: threading.Thread | None = None

    def ensure_running(self) -> None:
        """Start the thread unless this process runs one (one attribute check when it does)."""
        if self._pid == os.getpid():
            return
        with self._mutex:
            if self._pid == os.getpid():
                return
            self._pid = os.getpid()
            self._stop = threading.Event()
            self.thread = threading.Thread(
                target=self._run, args=(self._stop,), name="redlock-metrics", daemon=True
            )
            self.thread.start()

    def stop(self) -> None:
        """Stop this process's thread (waiting for a round in progress)."""
        self._stop.set()
        thread, self.thread, self._pid = self.thread, None, 0
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=10)

    def _run(self, stop: threading.Event) -> None:
        probe_at, failed = 0.0, ""
        while not stop.is_set():
            try:
                self.refresh_waiters()
                if time.monotonic() >= probe_at:
                    probe_at = time.monotonic() + self.nodes_interval
                    self.refresh_nodes()
                failed = ""
            except Exception as exc:  # a broken setting must not end the thread silently
                if repr(exc) != failed:  # logged once, not every round
                    failed = repr(exc)
                    logger.exception("Refreshing the django_redlock gauges failed")
            stop.wait(self.waiters_interval)

    def refresh(self) -> None:
        """One full round now: waiters and nodes."""
        self.refresh_waiters()
        self.refresh_nodes()

    def refresh_waiters(self) -> None:
        """Every alias's engine's count of waiting calls (no I/O)."""
        for alias in list(locks):
            self._metrics.waiters.labels(alias).set(
                sum(engine.waiters.value for engine in locks[alias].shards)
            )

    def refresh_nodes(self) -> None:
        """Probe every node of every alias: up (1/0) and the probe's round-trip time. An
        alias under ``simulate`` is skipped: nothing may reach its nodes."""
        metrics = self._metrics
        aliases = [alias for alias in locks if not locks[alias].simulated]
        if not aliases:
            return
        for health in inspection.node_health(aliases):  # every node at once
            alias = health.alias
            node = public_label(locks[alias].config.nodes[health.index])
            metrics.node_up.labels(alias, node).set(1 if health.up else 0)
            if health.latency_ms is not None:
                metrics.node_rtt.labels(alias, node).set(health.latency_ms / 1000)
