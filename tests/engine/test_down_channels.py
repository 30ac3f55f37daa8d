"""A pooled channel whose connection could not be made (its node did not answer the handshake
in time, and it waits out its backoff) fails every call at once, so it is free again at once:
it must not become the channel every call takes while healthy ones sit idle beside it. A
release or an extend makes one attempt, and would report "not confirmed" for a node that
answers on every other connection of the pool."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

from django_redlock.exceptions import NodesUnavailable
from django_redlock.locking.manager import LockManager
from django_redlock.testing import RedisNodes

HELD = 4


@pytest.mark.parametrize("count", [1, 3])
def test_releases_skip_an_asyncio_channel_that_could_not_connect(
    redis_node_factory: Callable[..., RedisNodes],
    redlock_alias: Callable[..., LockManager],
    count: int,
) -> None:
    nodes = redis_node_factory(count)
    manager = redlock_alias(nodes, MAX_CONNECTIONS=100, TTL=10.0)

    async def main() -> list[bool]:
        # HELD channels, open and idle, each of which took one of the leases
        leases = await asyncio.gather(
            *(manager.aacquire(f"down:{i}", timeout=5) for i in range(HELD))
        )
        for node in nodes:
            node.pause()
        try:
            # every pooled channel busy with an attempt, and one more: a new channel, whose
            # handshake times out while the nodes stand still
            refused = await asyncio.gather(
                *(manager.aacquire(f"other:{i}", timeout=0) for i in range(HELD + 1)),
                return_exceptions=True,
            )
            assert all(isinstance(e, NodesUnavailable) for e in refused)
        finally:
            for node in nodes:
                node.resume()
        fresh = await manager.aacquire("down:fresh", timeout=0)  # one attempt
        released = [await lease.arelease() for lease in [*leases, fresh]]
        for i in range(30):  # single calls for 0.3 s, past the failed channel's backoff
            await (await manager.aacquire(f"down:one:{i}", timeout=0)).arelease()
            await asyncio.sleep(0.01)
        # a burst that needs every channel: the one passed over reconnected meanwhile
        burst = await asyncio.gather(
            *(manager.aacquire(f"down:burst:{i}", timeout=0) for i in range(HELD + 1))
        )
        return released + [await lease.arelease() for lease in burst]

    assert asyncio.run(main()) == [True] * (2 * HELD + 2)
    for node in nodes:
        assert node.client().keys("*down:*") == []


@pytest.mark.parametrize("count", [1, 3])
def test_releases_skip_a_channel_that_could_not_connect(
    redis_node_factory: Callable[..., RedisNodes],
    redlock_alias: Callable[..., LockManager],
    count: int,
) -> None:
    nodes = redis_node_factory(count)
    manager = redlock_alias(nodes, MAX_CONNECTIONS=100, TTL=10.0)
    leases = []
    taken = threading.Barrier(HELD)

    def hold(i: int) -> None:
        taken.wait()
        leases.append(manager.acquire(f"down:{i}", timeout=5))
        taken.wait()  # every thread holds its channel until all have one: HELD channels

    _run_threads(hold, HELD)
    assert len(leases) == HELD
    for node in nodes:
        node.pause()
    try:
        attempts = threading.Barrier(HELD + 1)

        def attempt(i: int) -> None:
            attempts.wait()
            with pytest.raises(NodesUnavailable):  # the nodes stand still
                manager.acquire(f"other:{i}", timeout=0)

        _run_threads(attempt, HELD + 1)
    finally:
        for node in nodes:
            node.resume()
    fresh = manager.acquire("down:fresh", timeout=0)  # one attempt
    assert [lease.release() for lease in [*leases, fresh]] == [True] * (HELD + 1)
    for i in range(30):  # single calls for 0.3 s, past the failed channel's backoff
        manager.acquire(f"down:one:{i}", timeout=0).release()
        time.sleep(0.01)
    # a burst that needs every channel: the one passed over reconnected meanwhile
    burst: list[Any] = []
    together = threading.Barrier(HELD + 1)

    def take(i: int) -> None:
        together.wait(10)
        try:
            burst.append(manager.acquire(f"down:burst:{i}", timeout=0))
        finally:
            together.wait(10)  # every thread holds its channel until all have one

    _run_threads(take, HELD + 1)
    assert len(burst) == HELD + 1
    assert [lease.release() for lease in burst] == [True] * (HELD + 1)
    for node in nodes:
        assert node.client().keys("*down:*") == []


def _run_threads(target: Callable[[int], None], count: int) -> None:
    threads = [threading.Thread(target=target, args=(i,)) for i in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
