"""Constants and helpers every part of the benchmark shares (main and worker processes)."""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Sequence
from typing import Any

#: Same bound for every library in the paused-node scenario (our ``NODE_TIMEOUT``), seconds.
NODE_TIMEOUT = 0.05
#: Socket timeout of the other libraries' clients when every node is healthy, seconds.
HEALTHY_SOCKET_TIMEOUT = 1.0
TTL = 10
WORKERS = 8


def percentile(values: Sequence[float], q: float) -> float | None:
    """Nearest-rank percentile (``q`` in 0..100); None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[min(rank, len(ordered)) - 1]


def describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"[:90]


def quiet_logging(*loggers: str) -> None:
    """No lastResort noise from libraries; ``loggers`` only log critical records."""
    logging.getLogger().addHandler(logging.NullHandler())
    for name in loggers:
        logging.getLogger(name).setLevel(logging.CRITICAL)


def setup_django(url1: str, urls5: Sequence[str]) -> None:
    import django
    from django.conf import settings

    if not settings.configured:
        extra: dict[str, Any] = {}
        if "BENCH_BUSY_POLL" in os.environ:  # e.g. BENCH_BUSY_POLL=0 to compare without it
            extra["REDLOCK_BUSY_POLL"] = float(os.environ["BENCH_BUSY_POLL"])
        settings.configure(
            INSTALLED_APPS=["django_redlock"],
            **extra,
            REDLOCK={
                "one": {"NODES": [url1]},
                # the same node without busy polling (switched off below), for comparison
                "one-no-spin": {"NODES": [url1], "KEY_PREFIX": "nospin:"},
                "five": {"NODES": list(urls5), "NODE_TIMEOUT": NODE_TIMEOUT},
            },
        )
        django.setup()


def redis_client(url: str, timeout: float) -> Any:
    import redis

    return redis.Redis.from_url(url, socket_timeout=timeout, socket_connect_timeout=timeout)
