"""A sentinel node's master SIGKILLed under the shop workload: Sentinel promotes the replica,
the engine finds it and quarantines it as a restarted node, then locking resumes."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from django_redlock.testing.sentinel import SentinelGroup
from tests.faults.conftest import LONG, TTL, Shop, assert_data_oracles
from tests.support.shop_workload import WorkerPool, overlap_anomalies, token_anomalies

#: seconds the workload runs: before the kill, the failover (~2-3 s), the quarantine (TTL)
#: and a while after it
SECONDS = 30.0 if LONG else 9.0


def test_sentinel_master_killed_mid_workload(shop: Shop, report: Callable[..., None]) -> None:
    """8 workers sell through one sentinel node; the master is SIGKILLed a second in. No
    oversold item, no lost update, no duplicate or regressing token, no overlapping critical
    sections; sales resume once the promoted replica's quarantine (one TTL) is over."""
    marks: dict[str, Any] = {}
    with SentinelGroup.start() as group:

        def crash(pool: WorkerPool) -> None:
            time.sleep(1.0)
            old = group.kill_master()
            marks["killed"] = time.monotonic_ns()  # reaped: the old master grants nothing more
            marks["new"] = group.wait_failover(old)
            marks["promoted"] = time.monotonic_ns()

        run = shop.run(
            shop.settings([group.node_setting()]),
            stock=10_000,
            duration=SECONDS,
            during=crash,
        )
        killed, promoted = marks["killed"], marks["promoted"]
        granted = sorted(e["acquired"] for e in run.history.granted)
        before = [t for t in granted if t < killed]
        after = [t for t in granted if t > killed]
        outage = (after[0] - killed) / 1e9 if after else None
        report(
            "sentinel master killed",
            run,
            failover_s=round((promoted - killed) / 1e9, 2),
            outage_s=outage and round(outage, 2),
            granted_before=len(before),
            granted_after=len(after),
        )
        assert_data_oracles(run)
        assert token_anomalies(run.history) == []
        assert overlap_anomalies(run.history) == []
        assert before and after, "sales must run before the kill and resume after it"
        # the promoted replica, seen after the kill, granted nothing before its quarantine
        # (one TTL) was over
        assert after[0] - killed >= TTL * 0.9 * 1e9
        assert marks["new"].client().hget(f"{shop.prefix}__fence__", "run_id") is not None
