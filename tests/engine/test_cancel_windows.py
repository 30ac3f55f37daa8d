"""Cancelled asyncio calls give their connection's budget slot back once, after its socket is
closed, however often they are cancelled (docs/production.md, "Connection budget"). Real
redis-server nodes; the sockets are counted on the client's side."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

import pytest

from django_redlock.engine.transport.aio import AsyncLink
from django_redlock.locking.manager import LockManager
from django_redlock.testing import RedisNodes
from tests.support.sockets import open_sockets_to

Nodes = Callable[..., RedisNodes]
Alias = Callable[..., LockManager]

pytestmark = pytest.mark.wire


async def _cancel_every_turn(task: asyncio.Task[object], turns: int) -> None:
    """Cancel ``task`` on each of the next ``turns`` loop turns (a second cancel lands in
    whatever its first one's cleanup awaits), then wait for it to end."""
    for _ in range(turns):
        task.cancel()
        await asyncio.sleep(0)
    with pytest.raises(asyncio.CancelledError):
        await task


async def _settle(manager: LockManager, port: int) -> tuple[list[int], int]:
    """A few loop turns later (given-back slots come back on the turn after a close): the
    budget's count and the sockets open to ``port``."""
    for _ in range(5):
        await asyncio.sleep(0)
    return manager.engine.budget.in_use(), open_sockets_to(port)


def test_a_connect_cancelled_twice_gives_its_slot_back(
    redis_node_factory: Nodes, redlock_alias: Alias, unique_name: str
) -> None:
    """MAX_CONNECTIONS=1, a paused node: an acquire whose new connection is still in its
    handshake is cancelled, then cancelled again while it closes that connection. Its slot
    comes back (it was lost for good: every later call of the loop failed with "no free
    connection in time") and only after the socket is closed."""
    (node,) = nodes = redis_node_factory(1)
    manager = redlock_alias(nodes, MAX_CONNECTIONS=1, NODE_TIMEOUT=2.0)
    assert node.port is not None

    async def main() -> None:
        node.pause()
        try:
            for turns in (1, 2, 3, 4):  # second cancels at each step of the cleanup
                task = asyncio.create_task(manager.aacquire(f"{unique_name}:{turns}", timeout=0))
                await asyncio.sleep(0.05)  # in the handshake: the node does not answer
                await _cancel_every_turn(task, turns)
                assert await _settle(manager, node.port) == ([0], 0), turns
        finally:
            node.resume()
        lease = await manager.aacquire(unique_name, timeout=1)
        assert await lease.arelease() is True

    asyncio.run(main())


def test_a_blpop_wait_cancelled_twice_gives_its_slot_after_the_close(
    redis_node_factory: Nodes, redlock_alias: Alias, unique_name: str
) -> None:
    """3 nodes (waits block in ``BLPOP`` on one of them): a waiter is cancelled on several
    turns in a row while blocked. On every turn no node has more of our sockets than the
    budget counts (its slot came back before its socket closed, one turn over the cap),
    and at the end only the pooled channel's are left."""
    nodes = redis_node_factory(3)
    manager = redlock_alias(nodes, MAX_CONNECTIONS=4)
    ports = [node.port for node in nodes]
    budget = manager.engine.budget

    def over() -> list[tuple[int, int]]:
        counts = [open_sockets_to(port) for port in ports if port is not None]
        return [(s, u) for s, u in zip(counts, budget.in_use(), strict=True) if s > u]

    seen_over: list[list[tuple[int, int]]] = []
    give = budget.give

    def checked_give(*args: Any, **kwargs: Any) -> None:  # the moment a slot comes back
        give(*args, **kwargs)
        if found := over():
            seen_over.append(found)

    budget.give = checked_give  # type: ignore[method-assign]
    holder = manager.acquire(unique_name, ttl=30, timeout=0)
    try:

        async def main() -> None:
            for turns in (1, 2, 3, 4):
                task = asyncio.create_task(manager.aacquire(unique_name, timeout=10))
                deadline = time.monotonic() + 5
                while max(budget.in_use()) < 3 and time.monotonic() < deadline:
                    await asyncio.sleep(0.01)  # the holder's channel, its own, its BLPOP's
                assert max(budget.in_use()) == 3
                await asyncio.sleep(0.05)  # blocked in BLPOP
                for _ in range(turns):
                    task.cancel()
                    await asyncio.sleep(0)
                    assert over() == [], turns
                with pytest.raises(asyncio.CancelledError):
                    await task
                for _ in range(5):
                    await asyncio.sleep(0)
                    assert over() == [], turns
                assert budget.in_use() == [2, 2, 2]  # the pooled channels only
                assert seen_over == [], turns

        asyncio.run(main())
    finally:
        assert holder.release() is True


def test_a_closed_link_cancelled_in_its_connect_is_not_revived() -> None:
    """A link closed for good whose connect is then cancelled does not ask for an inline
    reconnect (it would never make one: a closed link holds no socket)."""

    async def main() -> None:
        link = AsyncLink("redis://127.0.0.1:9/0", lambda: _Hanging(), 1.0)
        task = asyncio.create_task(link.connect())
        await asyncio.sleep(0.01)
        link.close_link()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert not link.needs_revive()

    asyncio.run(main())


class _Hanging:
    """A redis-py connection stand-in whose connect never ends (no socket is opened)."""

    _writer = None
    _reader = None

    async def connect(self) -> None:
        await asyncio.Event().wait()
