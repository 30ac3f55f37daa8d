"""The lanes on an event loop against real redis-servers: the single-node lane
(``engine/alane.py``) and the lane for a set of nodes (``engine/afan_lane.py``), the path a
free lock takes from ``aacquire``/``arelease``. What they do not settle themselves (a busy
name, a paused node, a connection the server closed, scripts flushed, a cancelled caller)
must come out as the general path's would."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest

from django_redlock.engine import alane, lane
from django_redlock.exceptions import LockNotAcquired, NodesUnavailable
from django_redlock.locking.manager import LockManager
from tests.support.waiting import until


def test_a_free_lock_takes_the_lane_and_a_busy_one_the_plan(
    lane_nodes: tuple[Any, LockManager], plan_calls: dict[str, int]
) -> None:
    _, manager = lane_nodes

    async def run() -> None:
        await (await manager.aacquire("warm", timeout=0)).arelease()  # the plan's rejoin
        plan_calls.update(acquire=0, release=0)
        first = await manager.aacquire("lane", timeout=0)
        assert plan_calls == {"acquire": 0, "release": 0}
        with pytest.raises(LockNotAcquired):
            await manager.aacquire("lane", timeout=0)
        assert plan_calls["acquire"] == 1  # the busy reply is the plan's to decide
        assert await first.arelease() is True
        second = await manager.aacquire("lane", timeout=0)
        assert second.token > first.token
        assert await second.arelease() is True
        assert plan_calls == {"acquire": 1, "release": 0}

    asyncio.run(run())


@pytest.mark.parametrize("api", ["blocking", "asyncio"])
def test_every_kind_of_lease_takes_the_lane(
    lane_nodes: tuple[Any, LockManager], plan_calls: dict[str, int], api: str
) -> None:
    """A semaphore's permits, read leases and a write lease on a free name (or one that
    admits them) take the lanes, acquire and release, as a lock does; what the lanes do not
    settle (no permit left, a writer behind readers) goes to the plans, and every lease
    keeps its kind's rules."""
    _, manager = lane_nodes

    async def acquire(name: str, **kind: Any) -> Any:
        if api == "asyncio":
            return await manager.aacquire(name, timeout=0, **kind)
        return manager.acquire(name, timeout=0, **kind)

    async def release(lease: Any) -> bool:
        return bool(await lease.arelease() if api == "asyncio" else lease.release())

    async def run() -> None:
        await release(await acquire("warm"))  # the plan's rejoin
        plan_calls.update(acquire=0, release=0)
        permits = [await acquire("pool", permits=2) for _ in range(2)]
        assert len({p.record.key for p in permits}) == 2  # two slots
        assert plan_calls == {"acquire": 0, "release": 0}
        with pytest.raises(LockNotAcquired):
            await acquire("pool", permits=2)
        assert plan_calls["acquire"] == 1  # no permit left: the plan's to decide
        readers = [await acquire("doc", rw="read") for _ in range(2)]
        assert plan_calls["acquire"] == 1
        with pytest.raises(LockNotAcquired):
            await acquire("doc", rw="write")
        assert plan_calls["acquire"] == 2
        for lease in (*permits, *readers):
            assert await release(lease) is True
        writer = await acquire("doc", rw="write")
        assert writer.token > max(r.token for r in readers)
        assert await release(writer) is True
        assert await release(await acquire("pool", permits=2)) is True
        assert plan_calls == {"acquire": 2, "release": 0}

    asyncio.run(run())


def test_the_lane_sends_the_call_of_the_blocking_lane(
    one_node: tuple[Any, LockManager], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same calls, key for key and argument for argument, as the blocking lane's (which
    ``test_lane_plans`` checks against the plans): only the acquire's owner and value suffix
    (time and process) differ."""
    _, manager = one_node
    sent: list[tuple[str, tuple[str, ...]]] = []

    def recorded(kind: str) -> Callable[..., tuple[str, ...]]:
        real = getattr(lane, f"{kind}_tail")

        def tail(*args: Any) -> tuple[str, ...]:
            out: tuple[str, ...] = real(*args)
            sent.append((kind, out))
            return out

        return tail

    for kind in ("acquire", "release"):
        tail = recorded(kind)
        for module in (lane, alane):
            if hasattr(module, f"{kind}_tail"):
                monkeypatch.setattr(module, f"{kind}_tail", tail)
    manager.acquire("warm", timeout=0).release()
    sent.clear()
    manager.acquire("same", timeout=0).release()

    async def run() -> None:
        await (await manager.aacquire("same", timeout=0)).arelease()

    asyncio.run(run())
    assert [kind for kind, _ in sent] == ["acquire", "release"] * 2
    (_, acquire), (_, release), (_, aacquire), (_, arelease) = sent

    def masked(tail: tuple[str, ...], owner: str) -> tuple[str, ...]:
        return tuple("?" if a == owner or i == 8 else a for i, a in enumerate(tail))

    assert masked(aacquire, aacquire[5]) == masked(acquire, acquire[5])
    assert masked(arelease, aacquire[5]) == masked(release, acquire[5])


def test_a_paused_node_times_the_lane_out_and_its_late_grant_is_given_back(
    one_node: tuple[Any, LockManager],
) -> None:
    nodes, manager = one_node

    async def run() -> int:
        held = await manager.aacquire("warm", timeout=0)
        await held.arelease()
        nodes[0].pause()
        try:
            with pytest.raises(NodesUnavailable):
                await manager.aacquire("paused", timeout=0)
        finally:
            nodes[0].resume()
        return held.token

    before = asyncio.run(run())
    key = f"{manager.config.key_prefix}paused"
    until(lambda: nodes[0].client().exists(key) == 0, 5, "the late grant was given back")

    async def again() -> None:
        lease = await manager.aacquire("paused", timeout=0)
        assert lease.token > before + 1  # the late grant drew a token too
        assert await lease.arelease() is True

    asyncio.run(again())


def test_a_connection_the_server_closed_is_replaced(one_node: tuple[Any, LockManager]) -> None:
    nodes, manager = one_node

    async def run() -> None:
        await (await manager.aacquire("closed", timeout=0)).arelease()
        assert nodes[0].client().client_kill_filter(_type="normal", skipme=True) >= 1
        await asyncio.sleep(0.05)  # the loop reads the close
        lease = await manager.aacquire("closed", timeout=0)
        assert await lease.arelease() is True

    asyncio.run(run())


def test_flushed_scripts_are_sent_in_full(
    lane_nodes: tuple[Any, LockManager], plan_calls: dict[str, int]
) -> None:
    nodes, manager = lane_nodes

    async def run() -> None:
        await (await manager.aacquire("flushed", timeout=0)).arelease()
        plan_calls.update(acquire=0, release=0)
        for node in nodes:
            node.client().script_flush()
        lease = await manager.aacquire("flushed", timeout=0)  # NOSCRIPT, then EVAL
        for node in nodes:
            node.client().script_flush()
        assert await lease.arelease() is True
        assert plan_calls == {"acquire": 0, "release": 0}

    asyncio.run(run())
    key = f"{manager.config.key_prefix}flushed"
    # a node that answered after the quorum (its NOSCRIPT not sent again in full) gets the
    # release from the background give-back
    until(lambda: all(node.client().exists(key) == 0 for node in nodes), 5, "released")


@pytest.mark.parametrize("count", [1, 3], ids=["one node", "three nodes"])
def test_a_cancelled_acquire_gives_its_grant_back_and_later_calls_read_their_own(
    redis_node_factory: Any, redlock_alias: Any, count: int
) -> None:
    """A task cancelled while the lane waits for paused nodes: the give-back goes out behind
    the attempt on the same connections, so once the nodes resume no key is left, and the
    calls after it read their own replies (tokens rising, every name free after its
    release)."""
    nodes = redis_node_factory(count)
    manager = redlock_alias(nodes, NODE_TIMEOUT=5.0, TTL=30)
    prefix = manager.config.key_prefix

    def left(name: str) -> list[int]:
        return [node.client().exists(f"{prefix}{name}") for node in nodes]

    async def run() -> list[int]:
        before = await manager.aacquire("warm", timeout=0)
        await before.arelease()
        for node in nodes:
            node.pause()
        try:
            with pytest.raises(TimeoutError):
                await asyncio.wait_for(manager.aacquire("x", timeout=0), 0.3)
        finally:
            for node in nodes:
                node.resume()
        tokens = [before.token]
        for name in ("y", "z", "w"):
            lease = await manager.aacquire(name, timeout=0)
            tokens.append(lease.token)
            assert await lease.arelease() is True
        return tokens

    tokens = asyncio.run(run())
    assert tokens == sorted(tokens) and len(set(tokens)) == 4
    until(lambda: left("x") == [0] * count, 5, "the grant given back")
    assert [left(name) for name in ("y", "z", "w")] == [[0] * count] * 3


@pytest.mark.parametrize("count", [1, 3], ids=["one node", "three nodes"])
def test_a_cancelled_release_still_goes_out(
    redis_node_factory: Any, redlock_alias: Any, count: int
) -> None:
    """The caller of ``arelease`` is cancelled while the nodes are paused: the cancellation is
    passed on, and the release still reaches every node once they resume."""
    nodes = redis_node_factory(count)
    manager = redlock_alias(nodes, NODE_TIMEOUT=5.0, TTL=30)
    key = f"{manager.config.key_prefix}r"

    async def run() -> None:
        lease = await manager.aacquire("r", timeout=0)
        for node in nodes:
            node.pause()
        try:
            with pytest.raises(TimeoutError):
                await asyncio.wait_for(lease.arelease(), 0.2)
        finally:
            for node in nodes:
                node.resume()
        await asyncio.sleep(0.3)

    asyncio.run(run())
    until(lambda: all(node.client().exists(key) == 0 for node in nodes), 5, "the release got there")


class Interrupted(Exception):
    """What a signal handler raises in these tests."""


def test_an_interrupt_while_spinning_gives_the_grant_back(
    one_node: tuple[Any, LockManager], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A signal handler raises while the lane reads its socket itself, after the node granted
    (found by an attack: the read's bytes are lost, so the connection is dropped): the grant
    is given back from the background, not left for the TTL (30 s)."""
    from django_redlock.engine.transport import aio

    nodes, manager = one_node
    real = aio.AsyncLink.spin_read
    armed = [False]

    def interrupted(link: Any) -> None:
        if armed[0]:
            armed[0] = False
            until(lambda: nodes[0].client().exists(key) == 1, 5, "the node granted")
            link.interrupted()  # what spin_read does when an interrupt lands mid-read
            raise Interrupted
        real(link)

    monkeypatch.setattr(aio.AsyncLink, "spin_read", interrupted)
    key = f"{manager.config.key_prefix}spun"

    async def run() -> None:
        await (await manager.aacquire("warm", timeout=0)).arelease()
        armed[0] = True
        with pytest.raises(Interrupted):
            await manager.aacquire("spun", ttl=30, timeout=0)
        assert not armed[0], "the lane did not spin"

    asyncio.run(run())
    until(lambda: nodes[0].client().exists(key) == 0, 5, "the grant given back")


class _CountingLoop(asyncio.SelectorEventLoop):
    """An event loop that counts its turns (each poll for I/O and timers)."""

    turns = 0

    def _run_once(self) -> None:
        self.turns += 1
        super()._run_once()  # type: ignore[misc]


@pytest.mark.parametrize("busy_poll", [0.0001, 0.0], ids=["spins", "busy poll off"])
def test_a_fast_reply_is_read_by_spinning_and_the_loop_still_turns(
    one_node: tuple[Any, LockManager], monkeypatch: pytest.MonkeyPatch, busy_poll: float
) -> None:
    """With ``REDLOCK_BUSY_POLL`` on, a lane call on an idle loop reads its reply from the
    socket itself and returns without suspending; but never more than
    ``SPUN_BEFORE_YIELD`` calls in a row, so a task that locks in a tight loop still lets the
    loop poll for the others' I/O and timers. Off, it never reads by itself."""
    from django_redlock.engine.transport import aio

    _, manager = one_node
    manager.engine.state.busy_poll = busy_poll
    reads = 0
    real = aio.AsyncLink.spin_read

    def counted(link: Any) -> None:
        nonlocal reads
        reads += 1
        real(link)

    monkeypatch.setattr(aio.AsyncLink, "spin_read", counted)
    loop = _CountingLoop()

    async def run() -> int:
        await (await manager.aacquire("warm", timeout=0)).arelease()
        streak = longest = 0
        for _ in range(500):
            for call in ("acquire", "release"):
                before = loop.turns
                if call == "acquire":
                    lease = await manager.aacquire("tight", timeout=0)
                else:
                    await lease.arelease()
                streak = streak + 1 if loop.turns == before else 0
                longest = max(longest, streak)
        return longest

    try:
        longest = loop.run_until_complete(run())
        loop.run_until_complete(loop.shutdown_asyncgens())
    finally:
        loop.close()
    assert longest <= aio.SPUN_BEFORE_YIELD
    assert (reads > 0) == (busy_poll > 0)
