"""An event loop that stands still (a sync call in an async view, a collector pass over a large
heap, a cold import, a burst of tasks) is not a node that does not answer: connects under way
and calls on open connections read the replies that arrived meanwhile instead of calling a
healthy node down. The stalls are real: a task blocks the loop with ``time.sleep``."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

import pytest

from django_redlock.locking.manager import LockManager
from django_redlock.testing import RedisNodes


@pytest.mark.parametrize("count", [1, 3])
def test_connects_outlast_a_stalled_event_loop(
    redis_node_factory: Callable[..., RedisNodes],
    redlock_alias: Callable[..., LockManager],
    count: int,
) -> None:
    """30 tasks open their connections; once the first node has accepted some of them,
    another task blocks the event loop for 1.5 s (a sync call in an async view, a collector
    pass over a large heap, a cold import), longer than the handshake's 1 s timeout
    (NODE_TIMEOUT 0.25 s: 30 handshakes at once on a loaded machine take more of the loop's
    time than the default's 0.2 s). The nodes answered meanwhile, so every task gets
    its lease and every release is confirmed at once. Before the connect timeout counted only
    the time the loop could run, the handshakes under way all timed out when the loop turned
    again: their connections stayed down for their backoff, and the releases sent on them
    returned False (given back later in the background)."""
    nodes = redis_node_factory(count)
    manager = redlock_alias(nodes, MAX_CONNECTIONS=100, TTL=10.0, NODE_TIMEOUT=0.25)
    watch = nodes[0].client()
    before = int(watch.info("clients")["connected_clients"])

    async def one(i: int) -> bool:
        lease = await manager.aacquire(f"stall:{i}", timeout=5)
        return await lease.arelease()

    async def stall() -> None:
        while int(watch.info("clients")["connected_clients"]) < before + 5:
            await asyncio.sleep(0.0005)
        time.sleep(1.5)  # handshakes are under way: the whole loop stands still

    async def main() -> list[Any]:
        tasks = [asyncio.create_task(one(i)) for i in range(30)]
        await stall()
        return await asyncio.gather(*tasks, return_exceptions=True)

    outcomes = asyncio.run(main())
    assert outcomes == [True] * 30
    for node in nodes:
        assert node.client().keys("*stall:*") == []


@pytest.mark.parametrize("count", [1, 3])
def test_calls_on_open_connections_outlast_a_stalled_event_loop(
    redis_node_factory: Callable[..., RedisNodes],
    redlock_alias: Callable[..., LockManager],
    count: int,
) -> None:
    """20 tasks lock and release names of their own, 10 times each, on connections already
    open, while another task blocks the loop for 0.3 s four times (six times NODE_TIMEOUT each):
    every acquire succeeds and every release is confirmed."""
    nodes = redis_node_factory(count)
    manager = redlock_alias(nodes, MAX_CONNECTIONS=100, TTL=10.0)

    async def one(i: int) -> list[bool]:
        released = []
        for round_ in range(10):
            lease = await manager.aacquire(f"calls:{i}:{round_}", timeout=5)
            await asyncio.sleep(0.01)
            released.append(await lease.arelease())
        return released

    async def main() -> list[Any]:
        await asyncio.gather(*(one(i) for i in range(20)))  # the connections are open
        tasks = [asyncio.create_task(one(i)) for i in range(20)]
        for _ in range(4):
            await asyncio.sleep(0.03)
            time.sleep(0.3)
        return await asyncio.gather(*tasks, return_exceptions=True)

    outcomes = asyncio.run(main())
    assert outcomes == [[True] * 10] * 20
    for node in nodes:
        assert node.client().keys("*calls:*") == []
