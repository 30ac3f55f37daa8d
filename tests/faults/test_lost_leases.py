"""A lease lost while its holder still uses it: ``extend()`` of a lease an operator
force-released, and the watchdog's renewal (``auto_extend=True``) failing while a quorum of
nodes is paused. The holder must learn it (``LockLost``, the ``lock_lost`` signal, validity 0)
and a newer holder's token must win in the database.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest
from django.db import transaction

from django_redlock.exceptions import LockLost, StaleTokenError
from django_redlock.locking.manager import LockManager
from django_redlock.testing import RedisNodes

Nodes = Callable[..., RedisNodes]
Alias = Callable[..., LockManager]


def test_extend_of_a_taken_lease_raises_lock_lost(
    redis_node_factory: Nodes, redlock_alias: Alias
) -> None:
    """The smallest reproduction: a lease force-released by an operator (still valid on the
    client's clock) is extended: every node answers "not yours" and extend() must raise
    LockLost (and mark the lease lost), not a TypeError."""
    nodes = redis_node_factory(3)
    manager = redlock_alias(nodes, TTL=30.0)
    lease = manager.acquire("taken", timeout=0)
    assert manager.force_release("taken") == 3
    with pytest.raises(LockLost):
        lease.extend()
    assert lease.lost and lease.validity == 0


@pytest.mark.django_db(transaction=True)
def test_watchdog_renewal_failing_loses_the_lease(
    redis_node_factory: Nodes, redlock_alias: Alias, lost_signals: list[dict[str, Any]]
) -> None:
    """A holder with ``auto_extend=True`` renews every TTL/3; a quorum of nodes is paused, so
    a renewal fails: ``lock_lost`` is sent, ``lease.validity == 0``, a newer holder gets the
    lock once the keys expire and writes the row, the old holder's later fenced write is
    rejected, and leaving the old block raises ``LockLost``. Control: while the nodes answer,
    the watchdog keeps the lease valid well past its TTL."""
    from testproject.inventory.models import Product

    ttl = 0.6
    nodes = redis_node_factory(3)
    manager = redlock_alias(nodes, TTL=ttl, NODE_TIMEOUT=0.1)
    product = Product.objects.create(name="dog", stock=10)
    with pytest.raises(LockLost), manager.lock("dog", auto_extend=True, timeout=0) as lease:
        time.sleep(ttl * 2)  # control: renewed, still valid past its TTL
        assert lease.validity > 0 and not lost_signals
        with transaction.atomic():
            row = Product.objects.claim(pk=product.pk)
        for node in nodes[:2]:
            node.pause()
        try:
            deadline = time.monotonic() + 3
            while not lost_signals and time.monotonic() < deadline:
                time.sleep(0.02)
        finally:
            for node in nodes[:2]:
                node.resume()
        assert lost_signals and lost_signals[0]["lease"] is lease
        assert lease.validity == 0
        newer = manager.acquire("dog", timeout=10)
        assert newer.token > lease.token
        with transaction.atomic():
            fresh = Product.objects.claim(pk=product.pk, token=newer.token)
            fresh.stock = 3
            fresh.save(fence_token=newer.token)
        row.stock = 9
        with pytest.raises(StaleTokenError), transaction.atomic():
            row.save()  # the old lease's token (from the context)
        assert newer.release() is True
    assert Product.objects.get(pk=product.pk).stock == 3
