"""``simulate()`` where it meets the other stage-3 tools: ``limits()`` and the lock-order
checker run in memory too (the aliases' nodes are traps: nothing may connect)."""

from __future__ import annotations

import asyncio
import threading

import pytest
from django.test import override_settings

from django_redlock import locks
from django_redlock.exceptions import LockNotAcquired, NodesUnavailable
from django_redlock.locking import ordering
from django_redlock.locking.ordering import shared
from django_redlock.testing import simulate

pytestmark = pytest.mark.usefixtures("traps")


def test_limits_take_a_permit_of_each_or_none() -> None:
    """A busy glob on one semaphore of the set: nothing of the set is taken; a full semaphore
    refuses the set; the counts are each semaphore's own."""
    with simulate(busy=["api:tenant:9"]) as simulation:
        manager = locks["default"]
        with pytest.raises(LockNotAcquired), manager.limits({"api": 2, "api:tenant:9": 1}):
            pass
        assert simulation.held() == []
        with manager.limits({"api": 2, "api:tenant:1": 1}) as held:
            assert sorted(held.leases) == ["api", "api:tenant:1"]
            with pytest.raises(LockNotAcquired):
                manager.acquire_limits({"api": 2, "api:tenant:1": 1}, timeout=0)
            with (
                manager.limits({"api": 2, "api:tenant:2": 1}, timeout=0),
                pytest.raises(LockNotAcquired),
            ):
                manager.acquire_limits({"api": 2, "api:tenant:3": 1}, timeout=0)
        assert simulation.held() == []


def test_limits_unavailable_and_async() -> None:
    """``unavailable`` refuses a set with NodesUnavailable; ``alimits`` waits for a permit
    that another task gives back."""
    with simulate(unavailable=True), pytest.raises(NodesUnavailable):
        locks["multi"].acquire_limits({"a": 1, "b": 1}, timeout=1)

    async def main() -> list[str]:
        manager, order = locks["default"], []

        async def first() -> None:
            async with manager.alimits({"a": 1, "b": 2}):
                order.append("first in")
                await asyncio.sleep(0.05)
                order.append("first out")

        async def second() -> None:
            await asyncio.sleep(0.01)
            async with manager.alimits({"b": 2, "a": 1}, timeout=5):
                order.append("second in")

        await asyncio.gather(first(), second())
        return order

    with simulate():
        assert asyncio.run(main()) == ["first in", "first out", "second in"]


def test_the_order_checker_records_in_memory_and_warns() -> None:
    """With the checker on, a simulated inversion across two threads warns, and its records
    stay in the simulation (the nodes are never asked)."""
    manager = locks["default"]
    with override_settings(REDLOCK_CHECK_ORDER=True), simulate():
        ordering.reset()
        try:
            with manager.lock("sim:order:1"), manager.lock("sim:audit:1"):
                pass
            caught: list[str] = []

            def inverted() -> None:
                with (
                    pytest.warns(RuntimeWarning) as warned,
                    manager.lock("sim:audit:2"),
                    manager.lock("sim:order:2"),
                ):
                    pass
                caught.extend(str(w.message) for w in warned)

            thread = threading.Thread(target=inverted)
            thread.start()
            thread.join()
            assert any("sim:order:{n}" in text and "sim:audit:{n}" in text for text in caught)
            edges, errors = shared.read_all(manager.engine)  # what `redlock order` reads
            assert not errors
            assert {(r.edge[0][1], r.edge[1][1]) for r in edges} == {
                ("sim:order:{n}", "sim:audit:{n}"),
                ("sim:audit:{n}", "sim:order:{n}"),
            }
        finally:
            ordering.reset()
