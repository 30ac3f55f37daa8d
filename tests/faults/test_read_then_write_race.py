"""The read-then-write race: a holder reads a row under its lease, is evicted (an operator
force-releases the name), and writes after a newer holder has read the same row.

With ``claim()`` the newer holder's read stamps the row, so the stale writer's save is
rejected; each test runs a control with the guard disabled (a plain read, or a raw write) that
must lose an update, so the eviction is shown to bite. Two leases in one process, the race
across 8 worker processes of the shop workload, and its long profile (``slow``).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest
from django.db import transaction

from django_redlock.exceptions import StaleTokenError
from django_redlock.locking.manager import LockManager
from django_redlock.testing import RedisNodes
from tests.faults.conftest import DURATION, SEEDS, Shop
from tests.support.shop_workload import (
    conservation_anomalies,
    errors_of,
    overlap_anomalies,
    purchase_log_anomalies,
    token_anomalies,
)

Nodes = Callable[..., RedisNodes]
Alias = Callable[..., LockManager]

# -- two leases, one row -------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("claim", [True, False], ids=["claim", "plain-read"])
def test_read_then_write_race_rejects_the_stale_writer(
    redis_node_factory: Nodes, redlock_alias: Alias, claim: bool
) -> None:
    """A reads the row under its lease, then is evicted (force-release); B acquires (larger
    token) and reads the row *before* A writes. With ``claim()`` B's read stamps the row, so
    A's late write is rejected and B's goes in: the stale writer loses, one sale, one
    decrement. The control reads with a plain ``get()``: both writes are accepted (A's row
    token did not change, so B's loaded token still matches) and one of the two decrements is
    lost: the race that ``claim()`` closes."""
    from testproject.inventory.models import Product

    nodes = redis_node_factory(3)
    manager = redlock_alias(nodes, TTL=30.0)
    product = Product.objects.create(name="raced", stock=10)
    a = manager.acquire("product", timeout=0)
    with transaction.atomic():
        a_row = Product.objects.claim(pk=product.pk, token=a.token)
    assert manager.force_release("product") >= 2  # A is evicted but does not know it
    b = manager.acquire("product", timeout=0)
    assert b.token > a.token
    if claim:
        with transaction.atomic():
            b_row = Product.objects.claim(pk=product.pk, token=b.token)
    else:
        b_row = Product.objects.get(pk=product.pk)
    a_row.stock -= 1
    b_row.stock -= 1
    if claim:
        with pytest.raises(StaleTokenError), transaction.atomic():
            a_row.save(fence_token=a.token)  # the stale writer is rejected
        b_row.save(fence_token=b.token)
        assert Product.objects.get(pk=product.pk).fence_token == b.token
    else:
        a_row.save(fence_token=a.token)  # the stale write goes in...
        b_row.save(fence_token=b.token)  # ...and B's, computed from the same stock
    # claim: one accepted sale, one decrement; control: two accepted sales, one decrement
    assert Product.objects.get(pk=product.pk).stock == 9
    assert a.release() is False and b.release() is True


# -- the race under the workload -----------------------------------------------------------


def stale_rejections(history: Any) -> tuple[int, list[str]]:
    """Every StaleTokenError of the run must hit the *stale* writer: some lease on the same
    product with a larger token was granted before the rejection. Returns (rejections,
    anomalies)."""
    anomalies = []
    rejected = [e for e in history.of("fail") if "StaleTokenError" in e.get("error", "")]
    for event in rejected:
        newer = [
            g
            for g in history.granted
            if g["pk"] == event["pk"] and g["token"] > event["token"] and g["acquired"] < event["t"]
        ]
        if not newer:
            anomalies.append(
                f"op {event['op']} of worker {event['w']} rejected without a newer lease"
            )
    return len(rejected), anomalies


def test_read_then_write_race_in_the_workload(
    shop: Shop, redis_node_factory: Nodes, redlock_alias: Alias, report: Callable[..., None]
) -> None:
    """The race across 8 processes: an operator force-releases held product locks every
    20 ms, so evicted holders (who already read) overlap newer holders. With ``claim()``
    every rejected write is a stale one (a newer lease on that product was granted first),
    stock is conserved and the purchase log is in token order. Control: the same eviction
    with the guard disabled (plain read, raw write) overlaps and loses updates."""
    nodes = redis_node_factory(3)
    manager = redlock_alias(nodes, KEY_PREFIX=shop.prefix, TTL=2.0)
    admin = nodes[0].client()
    released: list[int] = []

    def evict(pool: Any) -> None:
        deadline = time.monotonic() + 2.0
        while time.monotonic() < deadline:
            for key in admin.scan_iter(match=f"{shop.prefix}product:*", count=100):
                released.append(manager.force_release(key.decode()[len(shop.prefix) :]))
            time.sleep(0.02)

    kwargs: dict[str, Any] = {"stock": 100, "items": 3, "think": (0.01, 0.04), "during": evict}
    run = shop.run(shop.settings(nodes), **kwargs)
    rejected, anomalies = stale_rejections(run.history)
    report("race, claim", run, evicted=sum(1 for r in released if r), rejected=rejected)
    assert sum(1 for r in released if r) > 0  # the fault bit
    assert anomalies == []
    assert errors_of(run.history) == []
    assert conservation_anomalies(run.initial, run.history) == []
    assert purchase_log_anomalies(run.initial) == []
    assert token_anomalies(run.history) == []
    released.clear()
    control = shop.run(shop.settings(nodes), mode="unfenced", oracle=False, **kwargs)
    lost = conservation_anomalies(control.initial)
    report("race, guard disabled", control, evicted=sum(1 for r in released if r), anomalies=lost)
    assert overlap_anomalies(control.history), "no overlap: the eviction did not bite"
    assert lost, "the unguarded race lost no update: the control proves nothing"


# -- long profile --------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("seed", SEEDS)
def test_long_read_then_write_race_in_the_workload(
    shop: Shop,
    redis_node_factory: Nodes,
    redlock_alias: Alias,
    report: Callable[..., None],
    seed: int,
) -> None:
    """Long profile of ``test_read_then_write_race_in_the_workload``: per seed, a DURATION run
    of 8 processes while an operator force-releases held product locks every 20 ms. Every
    StaleTokenError hits a stale writer, stock is conserved, the purchase log and tokens are
    in order. Control (shorter): the guard disabled overlaps and loses updates."""
    nodes = redis_node_factory(3)
    manager = redlock_alias(nodes, KEY_PREFIX=shop.prefix, TTL=2.0)
    admin = nodes[0].client()
    released: list[int] = []

    def evict_for(seconds: float) -> Callable[[Any], None]:
        def evict(pool: Any) -> None:
            deadline = time.monotonic() + seconds
            while time.monotonic() < deadline:
                for key in admin.scan_iter(match=f"{shop.prefix}product:*", count=100):
                    released.append(manager.force_release(key.decode()[len(shop.prefix) :]))
                time.sleep(0.02)

        return evict

    kwargs: dict[str, Any] = {"stock": 100 * max(1, int(DURATION / 2)), "items": 3,
                              "think": (0.01, 0.04), "seed": seed}  # fmt: skip
    run = shop.run(shop.settings(nodes), during=evict_for(DURATION), **kwargs)
    rejected, anomalies = stale_rejections(run.history)
    evicted = sum(1 for r in released if r)
    report(f"long race, seed {seed}", run, evicted=evicted, rejected=rejected)
    assert evicted > 0
    assert anomalies == []
    assert errors_of(run.history) == []
    assert conservation_anomalies(run.initial, run.history) == []
    assert purchase_log_anomalies(run.initial) == []
    assert token_anomalies(run.history) == []
    released.clear()
    control = shop.run(shop.settings(nodes), mode="unfenced", oracle=False, duration=2.0,
                       during=evict_for(2.0), **kwargs)  # fmt: skip
    report(f"long race control, seed {seed}", control)
    assert overlap_anomalies(control.history), "no overlap: the eviction did not bite"
    assert conservation_anomalies(control.initial), "the unguarded race lost no update"
