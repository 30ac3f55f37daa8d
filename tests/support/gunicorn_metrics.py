"""gunicorn config of the metrics test server: prometheus-client's multiprocess mode drops a
dead worker's live gauges (``mark_process_dead``), as its documentation asks."""

from __future__ import annotations

from typing import Any


def child_exit(server: Any, worker: Any) -> None:
    from prometheus_client import multiprocess

    multiprocess.mark_process_dead(worker.pid)
