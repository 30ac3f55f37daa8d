"""How long a health probe takes with paused nodes: prints a table.

Five nodes in one alias; 0 to 3 of them SIGSTOPped (a paused node accepts the connection and
never answers, so each probe of it waits out the socket timeout: four times ``NODE_TIMEOUT``,
at least 0.2 s). For each count, the median over ``--rounds`` of the time the health view's
reading (``contrib.health.report.statuses``) and the admin's and ``redlock nodes``' reading
(``inspection.node_health``) take, at ``NODE_TIMEOUT`` 0.05 s (socket timeout 0.2 s) and
0.25 s (1 s). Every paused node is resumed (SIGCONT) before the next count and at the end.

    .venv/bin/python benchmarks/health_probe.py [--rounds 5]

Starts its own redis-server processes on free loopback ports and stops them at the end.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

TIMEOUTS = (0.05, 0.25)


def timed(call: Callable[[], Any], rounds: int) -> float:
    """Median seconds of ``call`` over ``rounds`` calls."""
    seconds = []
    for _ in range(rounds):
        started = time.perf_counter()
        call()
        seconds.append(time.perf_counter() - started)
    return statistics.median(seconds)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()

    from django_redlock.testing import RedisNodes

    with RedisNodes.start(5) as nodes:
        import django
        from django.conf import settings

        settings.configure(
            INSTALLED_APPS=["django_redlock"],
            REDLOCK={
                f"t{timeout}": {"NODES": nodes.urls, "NODE_TIMEOUT": timeout}
                for timeout in TIMEOUTS
            },
        )
        django.setup()
        from django_redlock import inspection
        from django_redlock.contrib.health.report import statuses

        print(f"{'NODE_TIMEOUT':>13}{'paused':>8}{'health view s':>15}{'nodes/admin s':>15}")
        for timeout in TIMEOUTS:
            alias = f"t{timeout}"
            for paused in range(4):
                for node in nodes[1 : 1 + paused]:
                    node.pause()
                try:
                    view = timed(lambda alias=alias: statuses([alias]), args.rounds)
                    admin = timed(lambda alias=alias: inspection.node_health([alias]), args.rounds)
                finally:
                    for node in nodes[1 : 1 + paused]:
                        node.resume()
                print(f"{timeout:>13}{paused:>8}{view:>15.3f}{admin:>15.3f}")


if __name__ == "__main__":
    main()
