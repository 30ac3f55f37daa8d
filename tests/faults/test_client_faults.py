"""Client-side faults: a worker process frozen (SIGSTOP) past its lease's TTL, and the
client's own clocks going wrong.

The frozen worker ("zombie") still believes it holds the lock when it wakes up. Redlock cannot
stop it; the fencing token must make the database refuse its write. Each scenario runs once
with the guard (fenced) and once without it (a plain read and a raw SQL write under the same
lock), and the unguarded run must show the lost update, so the fault is proven to bite.

The clock faults patch ``time.monotonic`` or ``time.time`` in the test process: a monotonic
jump in the middle of an acquisition must never give a granted lease, and a garbage wall
clock must leave tokens and exclusion alone.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from collections.abc import Callable
from typing import Any

import pytest

from django_redlock.exceptions import LockNotAcquired
from django_redlock.locking.manager import LockManager
from django_redlock.testing import RedisNodes
from tests.faults.conftest import SEEDS, Shop, is_postgres, keys_of
from tests.support.shop_workload import (
    History,
    WorkerPool,
    conservation_anomalies,
    errors_of,
    purchase_log_anomalies,
    token_anomalies,
    wait_no_lock_keys,
    wait_stopped,
)

Nodes = Callable[..., RedisNodes]
Alias = Callable[..., LockManager]

ZOMBIE_TTL = 1.0


def freeze_past_ttl(pool: WorkerPool) -> None:
    """Wait for the zombie to stop itself inside its lease, keep it frozen past the TTL."""
    pid = pool.pids[0]
    wait_stopped(pid)
    time.sleep(ZOMBIE_TTL + 1.0)
    os.kill(pid, signal.SIGCONT)


def zombie_event(history: History) -> dict[str, Any]:
    return next(e for e in history.events if e["w"] == 0 and e["op"] == 1)


def newer_holders(history: History, zombie: dict[str, Any]) -> list[dict[str, Any]]:
    """Leases of the zombie's product granted while it was frozen."""
    return [
        e
        for e in history.granted
        if e["pk"] == zombie["pk"]
        and e is not zombie
        and zombie["acquired"] < e["acquired"]
        and e["acquired"] < zombie["t"]
    ]


def run_zombie(shop: Shop, nodes: RedisNodes, mode: str, where: str, seed: int) -> Any:
    return shop.run(
        shop.settings(nodes),
        mode=mode,
        items=3,
        stock=100,
        seed=seed,
        ttl=ZOMBIE_TTL,
        duration=ZOMBIE_TTL + 1.5,
        zombie={"where": where},
        during=freeze_past_ttl,
        # claim in one transaction and save in another is two writes with one token
        oracle=False if mode != "fenced" else "strict" if where == "in_txn" else "lax",
    )


@pytest.mark.parametrize("seed", SEEDS)
def test_zombie_past_ttl_write_is_rejected(
    shop: Shop,
    redis_node_factory: Callable[..., RedisNodes],
    report: Callable[..., None],
    seed: int,
) -> None:
    """A worker claims a product, is SIGSTOPped past its TTL while others buy it, wakes up and
    saves: the database rejects the write (StaleTokenError), stock is conserved, tokens stay
    in real-time order. Without the guard the same run loses an update."""
    nodes = redis_node_factory(3)
    run = run_zombie(shop, nodes, "fenced", "between", seed)
    zombie = zombie_event(run.history)
    newer = newer_holders(run.history, zombie)
    report("zombie, fenced", run, newer_holders=len(newer), zombie=zombie["type"])
    assert newer, "nobody took the product while the zombie was frozen: the fault did not bite"
    assert zombie["type"] == "fail" and "StaleTokenError" in zombie["error"], zombie
    assert errors_of(run.history) == []
    assert conservation_anomalies(run.initial, run.history) == []
    assert purchase_log_anomalies(run.initial) == []
    assert token_anomalies(run.history) == []
    assert all(e["token"] > zombie["token"] for e in newer)
    assert wait_no_lock_keys([n.client() for n in nodes], shop.prefix, ZOMBIE_TTL + 1) == []

    control = run_zombie(shop, nodes, "unfenced", "between", seed)
    zombie = zombie_event(control.history)
    anomalies = conservation_anomalies(control.initial)
    report("zombie, guard disabled", control, anomalies=anomalies)
    assert newer_holders(control.history, zombie)
    assert anomalies, "the unguarded zombie wrote nothing wrong: the control proves nothing"


@pytest.mark.parametrize("seed", SEEDS)
def test_zombie_frozen_inside_open_postgres_transaction(
    shop: Shop,
    redis_node_factory: Callable[..., RedisNodes],
    report: Callable[..., None],
    seed: int,
) -> None:
    """PostgreSQL only: the zombie freezes *inside* its transaction, right after claim() (so it
    holds the row lock). Newer holders block on the row until it wakes; whatever order the
    commits take, the strict oracle trigger (every write raises the token) and stock
    conservation hold, and the zombie learns it ran unprotected (LockLost) if it committed.
    Without the guard the frozen plain read is written back and an update is lost."""
    if not is_postgres():
        pytest.skip("an open transaction holding a row lock is a PostgreSQL scenario")
    nodes = redis_node_factory(3)
    run = run_zombie(shop, nodes, "fenced", "in_txn", seed)
    zombie = zombie_event(run.history)
    newer = newer_holders(run.history, zombie)
    report("zombie in txn, fenced", run, newer_holders=len(newer), zombie=zombie["type"])
    assert newer, "nobody took the lock while the zombie was frozen: the fault did not bite"
    assert errors_of(run.history) == []
    assert zombie["type"] == "fail" or zombie.get("lost"), zombie
    assert conservation_anomalies(run.initial, run.history) == []
    assert purchase_log_anomalies(run.initial) == []
    assert token_anomalies(run.history) == []

    control = run_zombie(shop, nodes, "unfenced", "in_txn", seed)
    anomalies = conservation_anomalies(control.initial)
    report("zombie in txn, guard disabled", control, anomalies=anomalies)
    assert anomalies, "the unguarded zombie wrote nothing wrong: the control proves nothing"


_READS_VALIDITY_CLOCK = ("attempt_round", "acquire_plan", "fan_round", "quorum_record")


def test_monotonic_jump_mid_acquire_is_never_granted(
    redis_node_factory: Nodes, redlock_alias: Alias, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The client's monotonic clock jumps forward by more than the TTL between the acquire's
    first write and its validity check (patched ``time.monotonic``, the fault being the
    client's clock): validity <= 0, so the lease is not granted, and the keys the nodes set
    are deleted at once (TTL 30 s: released, not expired). Control: no jump, granted."""
    nodes = redis_node_factory(3)
    manager = redlock_alias(nodes, TTL=30.0, NODE_TIMEOUT=0.5)
    lease = manager.acquire("clock", timeout=0)  # control
    assert lease.validity > 0 and lease.release() is True
    real = time.monotonic
    state = {"calls": 0, "offset": 0.0}

    def jumping() -> float:
        # the attempt round (or the lane) reads the clock before sending, acquire_plan (or
        # the lane's quorum_record) after the replies
        if sys._getframe(1).f_code.co_name in _READS_VALIDITY_CLOCK:
            state["calls"] += 1
            if state["calls"] == 2:  # the validity check, after the replies came in
                state["offset"] = 60.0
        return real() + state["offset"]

    monkeypatch.setattr(time, "monotonic", jumping)
    with pytest.raises(LockNotAcquired):
        manager.acquire("clock", ttl=30, timeout=0)
    assert state["offset"] == 60.0  # the jump happened mid-acquire
    monkeypatch.undo()
    assert wait_no_lock_keys([n.client() for n in nodes], manager.config.key_prefix, 3) == []
    lease = manager.acquire("clock", timeout=0)
    assert lease.release() is True


@pytest.mark.parametrize("wall", [0.0, -1e9, 1e12], ids=["epoch", "negative", "far-future"])
def test_wall_clock_garbage_leaves_tokens_alone(
    redis_node_factory: Nodes, redlock_alias: Alias, monkeypatch: pytest.MonkeyPatch, wall: float
) -> None:
    """A garbage wall clock (``time.time`` patched to 0, a negative value or the year 33658)
    changes nothing for an initialised cluster: tokens keep increasing from the counters,
    locks are exclusive and release works. (Fencing uses the wall clock only as a floor when
    a cluster initialises or a quorum lost its data.)"""
    nodes = redis_node_factory(3)
    manager = redlock_alias(nodes, TTL=5.0)
    first = manager.acquire("wall", timeout=0)
    first.release()
    monkeypatch.setattr(time, "time", lambda: wall)
    tokens = [first.token]
    for _ in range(3):
        lease = manager.acquire("wall", timeout=0)
        assert lease.token > tokens[-1]
        tokens.append(lease.token)
        with pytest.raises(LockNotAcquired):
            manager.acquire("wall", timeout=0)
        assert lease.release() is True
    assert tokens[-1] - tokens[0] < 1000  # counted, not derived from the clock
    monkeypatch.undo()
    assert keys_of(manager, nodes) == []
