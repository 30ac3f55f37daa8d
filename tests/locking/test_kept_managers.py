"""A manager kept across a change of ``REDLOCK`` (``override_settings``, the ``settings``
fixture, a module's ``manager = locks["default"]``): the change closes its engine, which opens
again on its next call, with its background give-backs (``tests/faults/test_broken_releases.py``
checks a straggler's release given back after a reset), and later changes leave it alone."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from django.conf import settings
from django.test import override_settings

from django_redlock import locks
from django_redlock.exceptions import LockError
from django_redlock.locking.manager import LockManager
from django_redlock.testing import RedisNodes

Nodes = Callable[..., RedisNodes]
Alias = Callable[..., LockManager]


def test_a_kept_manager_keeps_handing_a_name_over_while_the_settings_change(
    redis_node_factory: Nodes, redlock_alias: Alias
) -> None:
    """Three threads hand one name to each other on a kept manager while the main thread
    changes ``REDLOCK`` every 10 ms: no acquire times out and every release is confirmed. When
    every change closed the kept manager's engine again, calls in flight failed ("closed"),
    waiters missed their wake-ups and timed out, and the hand-offs nearly stopped (an outside
    attack: 71 sections in 3 s against 4,098 with the engine left open)."""
    kept = redlock_alias(redis_node_factory(3), TTL=5.0)
    failures: list[str] = []
    sections = [0]
    stop = time.monotonic() + 2.0

    def hand_over() -> None:
        while time.monotonic() < stop:
            try:
                with kept.lock("shared", timeout=1.0) as lease:
                    sections[0] += 1
                if lease.release_unconfirmed:
                    failures.append("a release not confirmed")
            except LockError as exc:  # LockNotAcquired, NodesUnavailable, LockLost
                failures.append(repr(exc))

    threads = [threading.Thread(target=hand_over) for _ in range(3)]
    for thread in threads:
        thread.start()
    changes = 0
    while time.monotonic() < stop:
        with override_settings(REDLOCK=dict(settings.REDLOCK)):  # resets the registry
            changes += 1
        time.sleep(0.01)
    for thread in threads:
        thread.join()
    assert changes > 20, "the settings hardly changed: the test proves nothing"
    assert failures == []
    assert sections[0] > 0  # the failures above are the check; no pace is asserted
    assert locks[kept.alias] is not kept  # the registry made a new one meanwhile
