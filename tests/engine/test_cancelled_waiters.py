"""A waiter that stops waiting before its timeout (an asyncio task cancelled, by ``wait_for``
or ``task.cancel()``; a blocking call interrupted) withdraws its registration as a waiter
on every node at once, as one whose timeout ran out stops counting at its deadline: the
next release reserves the name for nobody, and a one-attempt acquire from elsewhere gets it.
Real nodes (1 and 3); the oracle is each node's sorted set of waiters."""

from __future__ import annotations

import asyncio
import signal
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis

from django_redlock import locks
from django_redlock.exceptions import LockNotAcquired
from django_redlock.locking.lease import Lease
from django_redlock.locking.manager import LockManager

#: The registration of a waiter lives up to 1 s; a withdrawn one is gone within a round trip.
#: Polling this long tells the two apart with room for a loaded machine.
GONE_WITHIN = 0.3


def _clients(manager: LockManager) -> list[redis.Redis]:
    return [redis.Redis.from_url(str(node.url)) for node in manager.config.nodes]


def _waiter_sets(manager: LockManager, names: list[str]) -> list[str]:
    return [manager.engine.state.keys.waiters(name) for name in names]


def _registered(manager: LockManager, names: list[str]) -> bool:
    """True once some node holds a registration of a waiter of ``names``."""
    keys = _waiter_sets(manager, names)
    return any(client.exists(*keys) for client in _clients(manager))


def _assert_withdrawn(manager: LockManager, names: list[str]) -> None:
    """No node has a waiter registered for ``names`` (the only caller that waited for them
    gave up), within :data:`GONE_WITHIN`."""
    keys = _waiter_sets(manager, names)
    clients = _clients(manager)
    deadline = time.monotonic() + GONE_WITHIN
    while left := [(k, found) for c in clients for k in keys if (found := c.zrange(k, 0, -1))]:
        assert time.monotonic() < deadline, f"the waiter that gave up still counts: {left}"
        time.sleep(0.01)


def _held_elsewhere(manager: LockManager, names: list[str]) -> list[Lease]:
    """``names`` held by another thread (one attempt each)."""
    leases: list[Lease] = []

    def take() -> None:
        leases.extend(manager.acquire(name, ttl=30, timeout=0) for name in names)

    thread = threading.Thread(target=take)
    thread.start()
    thread.join(30)
    assert len(leases) == len(names), "the holder did not get the names"
    return leases


def _free_elsewhere(manager: LockManager, name: str) -> bool:
    """True if one attempt from another thread gets ``name`` right now."""
    outcome: list[bool] = []

    def attempt() -> None:
        try:
            manager.acquire(name, timeout=0).release()
            outcome.append(True)
        except LockNotAcquired:
            outcome.append(False)

    thread = threading.Thread(target=attempt)
    thread.start()
    thread.join(30)
    assert outcome, "the attempt from another thread hung"
    return outcome[0]


def _released_then_free(manager: LockManager, holders: list[Lease], names: list[str]) -> None:
    """The holder releases: no hand-off is reserved for the caller that gave up, so another
    thread's one attempt gets each name at once."""
    for lease in holders:
        assert lease.release() is True
    for name in names:
        assert _free_elsewhere(manager, name), f"{name!r} was handed to a caller that had gone"


async def _until_registered(manager: LockManager, names: list[str]) -> None:
    while not _registered(manager, names):
        await asyncio.sleep(0.01)


async def _wait_with(manager: LockManager, api: str, names: list[str]) -> None:
    if api == "aacquire":
        await manager.aacquire(names[0], timeout=20)
    elif api == "alock":
        async with manager.alock(names[0], timeout=20):
            pass
    else:
        await manager.aacquire_many(names, timeout=20)


def _cancel_a_waiter(manager: LockManager, api: str, how: str, names: list[str]) -> None:
    """Run a waiter for ``names`` in asyncio and cancel it once it is registered."""

    async def scenario() -> None:
        registered = asyncio.create_task(_until_registered(manager, names))
        if how == "wait_for":
            with pytest.raises(asyncio.TimeoutError):
                # long enough for a loaded machine to register the waiter first (the
                # caller's own timeout is 20 s: it is still waiting when this one cancels it)
                await asyncio.wait_for(_wait_with(manager, api, names), 2.0)
            assert registered.done(), "the waiter never registered before it was cancelled"
        else:
            task = asyncio.create_task(_wait_with(manager, api, names))
            await asyncio.wait_for(registered, 10)
            await asyncio.sleep(0.05)  # now in its wait, most likely (or an attempt)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task

    asyncio.run(scenario())


@pytest.mark.parametrize("alias", ["default", "multi"])
@pytest.mark.parametrize("how", ["wait_for", "task_cancel"])
@pytest.mark.parametrize("api", ["aacquire", "alock"])
def test_a_cancelled_async_waiter_stops_counting_at_once(
    alias: str, how: str, api: str, unique_name: str
) -> None:
    """An aacquire()/alock() waiting for a busy name is cancelled (wait_for's timeout, or
    task.cancel()): its registration is gone from every node within a round trip, not ~1 s
    later, and the holder's release lets another thread's acquire(timeout=0) succeed."""
    manager = locks[alias]
    names = [unique_name]
    holders = _held_elsewhere(manager, names)
    _cancel_a_waiter(manager, api, how, names)
    _assert_withdrawn(manager, names)
    _released_then_free(manager, holders, names)


@pytest.mark.parametrize("alias", ["default", "multi"])
def test_a_cancelled_lock_many_waiter_stops_counting_at_once(alias: str, unique_name: str) -> None:
    """aacquire_many() waits for a busy member of its set and is cancelled: it is no waiter
    of any of the names any more, and the holder's release frees the busy one at once."""
    manager = locks[alias]
    names = [f"{unique_name}:a", f"{unique_name}:b"]
    holders = _held_elsewhere(manager, names[1:])
    _cancel_a_waiter(manager, "aacquire_many", "task_cancel", names)
    _assert_withdrawn(manager, names)
    _released_then_free(manager, holders, names)


class _Interrupted(BaseException):
    """Raised in the main thread by a signal, as KeyboardInterrupt is."""


@pytest.fixture
def alarm() -> Iterator[Callable[[float], None]]:
    """``alarm(seconds)``: raise :class:`_Interrupted` in the main thread after ``seconds``,
    in the middle of whatever call is running."""

    def interrupt(signum: int, frame: Any) -> None:
        raise _Interrupted

    previous = signal.signal(signal.SIGALRM, interrupt)
    yield lambda seconds: signal.setitimer(signal.ITIMER_REAL, seconds)
    signal.setitimer(signal.ITIMER_REAL, 0)
    signal.signal(signal.SIGALRM, previous)


@pytest.mark.parametrize("alias", ["default", "multi"])
def test_an_interrupted_waiter_stops_counting_at_once(
    alias: str, unique_name: str, alarm: Callable[[float], None]
) -> None:
    """A blocking acquire() waiting for a busy name is interrupted (a signal handler raises,
    as Ctrl-C does): its registration is gone from every node within a round trip, and the
    holder's release lets another thread's acquire(timeout=0) succeed."""
    manager = locks[alias]
    names = [unique_name]
    holders = _held_elsewhere(manager, names)
    alarm(0.4)
    with pytest.raises(_Interrupted):
        manager.acquire(unique_name, timeout=20)
    _assert_withdrawn(manager, names)
    _released_then_free(manager, holders, names)


@pytest.mark.parametrize("rw", ["read", "write"])
def test_a_release_cancelled_before_it_went_out_still_releases(
    rw: str, redis_node_factory: Any, redlock_alias: Any
) -> None:
    """Two leases of one loop released at once: the second release needs a new connection
    (the loop's idle one carries the first) and is cancelled while it connects, before its
    command went out. The caller still gets CancelledError, and the release goes out anyway:
    the name is free at once, not after its 30 s TTL."""
    manager = redlock_alias(redis_node_factory(1), TTL=30.0)

    async def main() -> None:
        first = await manager.aacquire("a", rw=rw, timeout=0)
        second = await manager.aacquire("b", rw=rw, timeout=0)
        releases = [asyncio.create_task(first.arelease()), asyncio.create_task(second.arelease())]
        await asyncio.sleep(0)  # both begun: the second is connecting
        releases[1].cancel()
        outcomes = await asyncio.gather(*releases, return_exceptions=True)
        assert outcomes[0] is True and isinstance(outcomes[1], asyncio.CancelledError)

    asyncio.run(main())
    deadline = time.monotonic() + 5
    while True:
        try:
            manager.acquire("b", rw="write", timeout=0).release()
            break
        except LockNotAcquired:
            assert time.monotonic() < deadline, "the cancelled release never went out"
            time.sleep(0.05)


@pytest.mark.parametrize("alias", ["default", "multi"])
def test_a_cancel_a_layer_below_dropped_still_ends_the_wait(
    alias: str, unique_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A layer under the waiting loop catches the cancellation of its task and returns as if
    its wait had ended (as a client library's read may turn it into its own timeout): the
    task still counts the cancel, so ``aacquire()`` ends with it before its next attempt
    instead of waiting out its 20 s timeout, and its registration is withdrawn."""
    manager = locks[alias]
    engine = manager.engine
    step = engine._acarry_out
    dropped: list[str] = []

    async def dropping(request: Any, target: Any, waiting: Any) -> Any:
        try:
            return await step(request, target, waiting)
        except asyncio.CancelledError:
            dropped.append(type(request).__name__)
            # what a wait that simply ended returns: False (no wake-up), None (no pipe)
            return False if type(request).__name__ == "Wait" else None

    monkeypatch.setattr(engine, "_acarry_out", dropping)
    names = [unique_name]
    holders = _held_elsewhere(manager, names)

    async def scenario() -> None:
        registered = asyncio.create_task(_until_registered(manager, names))
        waiter = asyncio.create_task(manager.aacquire(unique_name, timeout=20))
        await asyncio.wait_for(registered, 10)
        await asyncio.sleep(0.05)  # now in its wait, most likely (or an attempt)
        waiter.cancel()
        done, _ = await asyncio.wait([waiter], timeout=10)
        assert done, "the cancelled waiter went on waiting"
        assert waiter.cancelled(), f"it ended otherwise: {waiter.exception()!r}"

    asyncio.run(scenario())
    monkeypatch.undo()
    assert dropped, "no layer below dropped the cancel: the test tested nothing"
    _assert_withdrawn(manager, names)
    _released_then_free(manager, holders, names)


@pytest.mark.parametrize("alias", ["default", "multi"])
def test_the_last_waiter_withdrawing_takes_the_reservation_with_it(
    alias: str, unique_name: str
) -> None:
    """A release reserved the name for the waiter it woke, and that waiter gives up (its task
    cancelled as the wake-up came): its withdrawal removes the last registration, so the
    reservation, which would serve nobody, goes too, and another caller gets the name at
    once. While another waiter is still registered, the reservation stays for it."""
    from django_redlock.engine.plans import withdraw_plan

    manager = locks[alias]
    engine = manager.engine
    keys = engine.state.keys
    clients = _clients(manager)
    name = unique_name

    def withdraw(waiter: str) -> None:
        engine.pools.run(lambda nodes: withdraw_plan(engine.state, nodes, [name], waiter))

    def on_every_node(test: Callable[[redis.Redis], bool]) -> None:
        deadline = time.monotonic() + 5
        while not all(test(client) for client in clients):
            assert time.monotonic() < deadline, "not on every node"
            time.sleep(0.01)

    for client in clients:  # as a release leaves it: the name reserved for a woken waiter
        far = int(client.time()[0] * 1000) + 30_000
        client.zadd(keys.waiters(name), {"w1": far, "w2": far})
        client.set(keys.handoff(name), "1", px=30_000)
    withdraw("w1")
    on_every_node(lambda c: c.zscore(keys.waiters(name), "w1") is None)
    assert all(c.exists(keys.handoff(name)) for c in clients), "w2 still waits: kept"
    withdraw("w1")  # removes nothing: keeps it too
    withdraw("w2")
    on_every_node(lambda c: not c.exists(keys.waiters(name), keys.handoff(name)))
    assert _free_elsewhere(manager, name)
