"""An attempt that wins a quorum before every node answered: a node that answers later may
find the name still held there (the previous holder's release has not reached it yet), answer
"busy" and register the caller as a waiter. The winner then stayed registered there for up to
a second (``WAIT_MARK_MS``): a release on that node woke nobody who waits and reserved the
name for a caller that already holds it. The attempt now withdraws its registration on the
nodes that had not answered, on the connection the attempt is still in flight on, so the
withdrawal runs right after it there.

Real nodes: the previous holder's copy is left on node 2 only, node 2 is paused while the
caller wins on nodes 0 and 1, then resumed; the oracle is node 2's waiter set once it ran the
attempt."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest

from django_redlock.locking.manager import LockManager
from django_redlock.testing import RedisNodes
from tests.support.waiting import until

Take = Callable[[LockManager], Any]


def _script_calls(nodes: RedisNodes, i: int) -> int:
    stats = nodes[i].client().info("commandstats")
    return sum(int(stats.get(f"cmdstat_{c}", {}).get("calls", 0)) for c in ("evalsha", "eval"))


def _lock(a: LockManager) -> Any:
    return a.acquire("k", timeout=5.0)


def _semaphore(a: LockManager) -> Any:
    return a.acquire("k", timeout=5.0, permits=1)


def _write(a: LockManager) -> Any:
    return a.acquire("k", timeout=5.0, rw="write")


def _many(a: LockManager) -> Any:
    return a.acquire_many(["k", "j"], timeout=5.0)


def _limits(a: LockManager) -> Any:
    return a.acquire_limits({"k": 1, "j": 2}, timeout=5.0)


def _keys(nodes: RedisNodes, a: LockManager) -> set[bytes]:
    return set(nodes[0].client().keys(f"{a.config.key_prefix}*"))


def _left_on_node_2_only(nodes: RedisNodes, a: LockManager, before: set[bytes]) -> None:
    """The holder's release reached nodes 0 and 1 only: its copy stays on node 2."""
    made = _keys(nodes, a) - before
    for i in (0, 1):
        nodes[i].client().delete(*made)


def _registered(nodes: RedisNodes, a: LockManager) -> int:
    """The registrations in node 2's waiter sets of ``a``'s names."""
    client = nodes[2].client()
    return sum(int(client.zcard(k)) for k in client.keys(f"{a.config.key_prefix}__waiters__:*"))


@pytest.mark.parametrize(
    "take",
    [_lock, _semaphore, _write, _many, _limits],
    ids=["lock", "semaphore", "write", "many", "limits"],
)
def test_a_winner_is_not_left_registered_where_it_answered_late(
    redis_node_factory: Callable[..., RedisNodes],
    redlock_alias: Callable[..., LockManager],
    take: Take,
) -> None:
    nodes = redis_node_factory(3)
    a = redlock_alias(nodes, NODE_TIMEOUT=0.2)
    take(a).release()  # warm: connections open, scripts loaded, the nodes trusted
    before = _keys(nodes, a)
    holder = take(a)
    _left_on_node_2_only(nodes, a, before)
    baseline = _script_calls(nodes, 2)
    nodes[2].pause()
    try:
        held = take(a)  # wins on nodes 0 and 1; its call to node 2 waits in the node's input
    finally:
        nodes[2].resume()
    until(lambda: _script_calls(nodes, 2) > baseline, 5.0, "node 2 ran the paused attempt")
    # before: registered for WAIT_MARK_MS (1 s) after node 2 ran the attempt
    until(lambda: _registered(nodes, a) == 0, 0.5, "no registration left on node 2")
    held.release()
    holder.release()


@pytest.mark.parametrize("permits", [0, 1])
def test_an_asyncio_winner_is_not_left_registered_where_it_answered_late(
    redis_node_factory: Callable[..., RedisNodes],
    redlock_alias: Callable[..., LockManager],
    permits: int,
) -> None:
    nodes = redis_node_factory(3)
    a = redlock_alias(nodes, NODE_TIMEOUT=0.2)

    async def take() -> Any:
        return await a.aacquire("k", timeout=5.0, permits=permits or None)

    async def until_true(test: Callable[[], bool], seconds: float, what: str) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + seconds
        while not test():
            assert loop.time() < deadline, f"{what}: not met within {seconds} s"
            await asyncio.sleep(0.01)

    async def main() -> None:  # one loop: its connections stay open throughout
        await (await take()).arelease()
        before = _keys(nodes, a)
        holder = await take()
        _left_on_node_2_only(nodes, a, before)
        baseline = _script_calls(nodes, 2)
        nodes[2].pause()
        try:
            held = await take()
        finally:
            nodes[2].resume()
        await until_true(lambda: _script_calls(nodes, 2) > baseline, 5.0, "node 2 ran it")
        await until_true(lambda: _registered(nodes, a) == 0, 0.5, "no registration left")
        await held.arelease()
        await holder.arelease()

    asyncio.run(main())
