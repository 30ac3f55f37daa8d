"""``simulate()`` under asyncio: ``async with``, tasks waiting for each other, the faults."""

from __future__ import annotations

import asyncio

import pytest

from django_redlock import locks
from django_redlock.exceptions import LockLost, LockNotAcquired, NodesUnavailable
from django_redlock.pytest_plugin import SimulateFixture
from django_redlock.testing import simulate

pytestmark = pytest.mark.usefixtures("traps")


def test_async_with_and_tasks_exclude_each_other() -> None:
    """Tasks of one loop wait for each other on one name; ``async with simulate()``."""

    async def scenario() -> list[bool]:
        inside: list[int] = []
        overlap: list[bool] = []

        async def worker(n: int) -> None:
            async with locks["default"].alock("shared", timeout=10):
                inside.append(n)
                overlap.append(len(inside) > 1)
                await asyncio.sleep(0.01)
                inside.remove(n)

        async with simulate():
            await asyncio.gather(*(worker(n) for n in range(4)))
        return overlap

    assert asyncio.run(scenario()) == [False] * 4


def test_async_faults() -> None:
    """Busy globs, an outage and a lost lease, each seen by asyncio code."""

    async def scenario() -> None:
        manager = locks["multi"]
        with simulate(busy=["b:*"]):
            with pytest.raises(LockNotAcquired):
                await manager.aacquire("b:1", timeout=30)
            lease = await manager.aacquire("a:1", timeout=0)
            assert await lease.arelease() is True
            held = await manager.aacquire_many(["a:1", "a:2"], timeout=0)
            for each in held.leases.values():
                await each.arelease()
        with simulate(unavailable=True), pytest.raises(NodesUnavailable):
            await manager.aacquire("a:1")
        with simulate(lost_after=0.02), pytest.raises(LockLost):
            async with manager.alock("a:1", ttl=5):
                await asyncio.sleep(0.05)

    asyncio.run(scenario())


def test_fixture_is_undone_at_test_end(redlock_simulate: SimulateFixture) -> None:
    """The fixture's simulation replaces the one before it; ``current`` is the active one."""
    first = redlock_simulate(busy=["x"])
    second = redlock_simulate()
    assert redlock_simulate.current is second and first is not second
    locks["default"].acquire("x", timeout=0).release()
