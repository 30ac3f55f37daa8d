"""A sentinel node's master SIGKILLed under the shop workload: Sentinel promotes the replica,
the engine finds it and quarantines it as a restarted node, then locking resumes."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from django_redlock.testing.sentinel import SentinelGroup
from tests.faults.conftest import LONG, TTL, Shop, assert_data_oracles
from tests.support.failover import (
    failover_anomalies,
    granted_fences,
    now,
    token_floor,
    wait_promoted,
)
from tests.support.shop_workload import WorkerPool, overlap_anomalies, token_anomalies

#: seconds the workload runs: before the kill, the failover (~2-3 s), the quarantine (TTL)
#: and a while after it
SECONDS = 30.0 if LONG else 9.0


def test_sentinel_master_killed_mid_workload(shop: Shop, report: Callable[..., None]) -> None:
    """8 workers sell through one sentinel node; the master is SIGKILLed a second in (once the
    replica holds the fence state of a granted lease). No oversold item, no lost update, no
    duplicate or regressing token, no overlapping critical sections; the old master granted
    nothing sent after the kill, the promoted replica nothing before one TTL after its
    promotion (judged as in tests/support/failover.py); sales resume."""
    marks: dict[str, Any] = {}
    fence = f"{shop.prefix}__fence__"
    with SentinelGroup.start() as group:

        def crash(pool: WorkerPool) -> None:
            time.sleep(1.0)
            old = group.master
            (replica,) = (n for n in group.servers if n is not old)
            deadline = time.monotonic() + 30
            while not granted_fences(old, [fence], cluster=False):  # a lease was granted
                assert time.monotonic() < deadline, "the workload granted nothing"
                time.sleep(0.05)
            group.wait_replicated()  # ... and the replica has it: it is quarantined
            marks["floor"] = token_floor()
            group.kill_master()
            marks["killed"] = now()  # reaped: the old master grants nothing more
            marks["promoted_after"] = wait_promoted(replica, marks["killed"])
            marks["new"] = group.wait_failover(old)
            marks["settled"] = now()

        run = shop.run(
            shop.settings([group.node_setting()]),
            stock=10_000,
            duration=SECONDS,
            during=crash,
        )
        killed, promoted_after = marks["killed"], marks["promoted_after"]
        anomalies, by_new = failover_anomalies(
            run.history.granted,
            floor=marks["floor"],
            killed=killed,
            promoted_after=promoted_after,
            quarantine=TTL,
            judged=lambda e: True,
        )
        granted = sorted(e["acquired"] for e in run.history.granted)
        before = [t for t in granted if t < killed]
        first = min((e["acquired"] for e in by_new), default=None)
        report(
            "sentinel master killed",
            run,
            failover_s=round((marks["settled"] - killed) / 1e9, 2),
            promotion_s=round((promoted_after - killed) / 1e9, 2),
            outage_s=first and round((first - killed) / 1e9, 2),
            granted_before=len(before),
            granted_by_promoted=len(by_new),
        )
        assert_data_oracles(run)
        assert token_anomalies(run.history) == []
        assert overlap_anomalies(run.history) == []
        assert anomalies == []
        assert before and by_new, "sales must run before the kill and resume after it"
        assert marks["new"].client().hget(fence, "run_id") is not None
