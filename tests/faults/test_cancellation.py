"""Cancellation (docs/production.md): cancelling ``aacquire()`` at any point leaves no key behind
longer
than the round trip that was in flight, and never leaves a node looking down."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import pytest

from django_redlock.exceptions import LockNotAcquired, NodesUnavailable
from django_redlock.locking.manager import LockManager
from django_redlock.testing import RedisNodes

Nodes = Callable[..., RedisNodes]
Alias = Callable[..., LockManager]


def lock_keys(nodes: RedisNodes, manager: LockManager) -> int:
    """Lock keys (not bookkeeping keys) of ``manager`` on every node."""
    prefix = manager.config.key_prefix
    return sum(
        1
        for node in nodes
        for key in node.client().scan_iter(match=f"{prefix}*")
        if not key.decode().startswith(f"{prefix}__")
    )


def wait_no_keys(nodes: RedisNodes, manager: LockManager, within: float = 2.0) -> None:
    deadline = time.monotonic() + within
    while lock_keys(nodes, manager):
        assert time.monotonic() < deadline, "a cancelled acquire left its key behind"
        time.sleep(0.01)


@pytest.mark.parametrize("count", [1, 3])
def test_cancel_while_the_acquire_is_in_flight_leaves_no_key(
    redis_node_factory: Nodes, redlock_alias: Alias, count: int
) -> None:
    """The nodes are frozen while aacquire()'s ACQUIRE is in flight; the task is cancelled,
    then the nodes resume and run the late ACQUIRE: the release queued behind it on the same
    connection deletes the key at once, so the name is free again (before the fix: held for
    the whole 30 s TTL)."""
    nodes = redis_node_factory(count)
    manager = redlock_alias(nodes, TTL=30.0, NODE_TIMEOUT=1.0)

    async def scenario() -> None:
        await (await manager.aacquire("cancel:warm", timeout=0)).arelease()  # connected
        for node in nodes:
            node.pause()
        try:
            task = asyncio.ensure_future(manager.aacquire("cancel:flight", timeout=0))
            await asyncio.sleep(0.05)  # the ACQUIRE calls are written, no reply can come
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
        finally:
            for node in nodes:
                node.resume()
        await asyncio.sleep(0.05)
        wait_no_keys(nodes, manager)
        await (await manager.aacquire("cancel:flight", timeout=0)).arelease()

    asyncio.run(scenario())


def test_wait_for_with_tiny_timeouts_leaves_no_keys(
    redis_node_factory: Nodes, redlock_alias: Alias
) -> None:
    """asyncio.wait_for(aacquire(...), 0.0002) fifty times: whichever ones time out mid-call,
    no key outlives them (before the fix: 10 of 50 left a key for the whole TTL)."""
    nodes = redis_node_factory(1)
    manager = redlock_alias(nodes, TTL=30.0)

    async def scenario() -> int:
        await (await manager.aacquire("cancel:warm", timeout=0)).arelease()
        held = 0
        for i in range(50):
            try:
                lease = await asyncio.wait_for(manager.aacquire(f"cancel:{i}", timeout=0), 0.0002)
            except TimeoutError:
                continue
            held += 1
            await lease.arelease()
        await asyncio.sleep(0.05)
        return held

    asyncio.run(scenario())
    wait_no_keys(nodes, manager)


def test_cancel_during_the_first_connect_leaves_no_node_down(
    redis_node_factory: Nodes, redlock_alias: Alias
) -> None:
    """The very first aacquire() of an event loop is cancelled while its connections are being
    opened; the next aacquire() on the same loop must find the healthy node up (before the fix:
    NodesUnavailable "down: not connected")."""
    nodes = redis_node_factory(1)
    manager = redlock_alias(nodes, TTL=5.0)

    async def scenario() -> None:
        for delay in (0, 0.0005, 0.001, 0.002):
            task = asyncio.ensure_future(manager.aacquire("cancel:connect", timeout=0))
            await asyncio.sleep(delay)
            task.cancel()
            try:
                lease = await task
            except asyncio.CancelledError:
                pass
            else:
                await lease.arelease()
            await asyncio.sleep(0.05)
            wait_no_keys(nodes, manager)
            lease = await manager.aacquire("cancel:connect", timeout=0)
            await lease.arelease()

    for _ in range(3):
        asyncio.run(scenario())


@pytest.mark.parametrize("count", [1, 3])
def test_a_set_whose_release_is_cancelled_before_it_went_out_is_released(
    redis_node_factory: Nodes, redlock_alias: Alias, count: int
) -> None:
    """``alock_many``'s exit cancelled while its release waits for a connection (the only
    one, ``MAX_CONNECTIONS=1``, busy with another task's call to paused nodes): the caller
    gets the cancellation, and the set is still released, from the background (before the
    fix: both names held for the whole 30 s TTL; found by an attack)."""
    nodes = redis_node_factory(count)
    manager = redlock_alias(nodes, TTL=30, NODE_TIMEOUT=1.0, MAX_CONNECTIONS=1)

    async def main() -> None:
        await (await manager.aacquire("warm", timeout=0)).arelease()

        async def hold_the_set() -> None:
            async with manager.alock_many(["a", "b"], timeout=0):
                for node in nodes:  # the next call waits for them with the only connection
                    node.pause()
                busy.set()
                await asyncio.sleep(0.05)  # the other task's call is in flight now

        busy = asyncio.Event()
        held = asyncio.create_task(hold_the_set())
        await busy.wait()
        other = asyncio.create_task(manager.aacquire("other", timeout=0))
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(held, 0.3)  # the set's release waits for the connection
        for node in nodes:
            node.resume()
        try:
            lease = await other
        except NodesUnavailable:  # it waited longer than NODE_TIMEOUT: fine here
            pass
        else:
            await lease.arelease()

    asyncio.run(main())
    deadline = time.monotonic() + 5
    while True:
        try:
            manager.acquire_many(["a", "b"], timeout=0).release()
            break
        except LockNotAcquired:
            assert time.monotonic() < deadline, "the cancelled set's release never went out"
            time.sleep(0.05)
