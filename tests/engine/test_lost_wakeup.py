"""A caller that queues at once (its release here just woke a waiter) registers with its
``BLPOP``; when the waiter it woke has already taken the name and released it, that release
saw nobody to wake. The registration then leaves the wake-up itself, so the ``BLPOP`` behind
it returns at once instead of waiting a whole backoff step while the name stands free (a lost
wake-up). Real nodes; the oracle is what each wait returned and the wake-up list."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

import pytest
import redis

from django_redlock.engine import scripts
from django_redlock.engine.acquire_loop import Pipe, Wait
from django_redlock.engine.keyspace import wake_node
from django_redlock.locking.manager import LockManager
from django_redlock.testing import RedisNodes

NAME = "lost-wakeup"


def _record(request: Any, reply: Any, seen: list[tuple[str, Any]]) -> None:
    if isinstance(request, Pipe) and reply is not None:
        seen.append(("pipe", reply[0]))
    elif isinstance(request, Wait):
        seen.append(("wait", reply))


def _waits_seen(manager: LockManager) -> list[tuple[str, Any]]:
    """Record what each wait of the engine's acquire loop returned (both drivers)."""
    engine = manager.engine
    carry_out, acarry_out = engine._carry_out, engine._acarry_out
    seen: list[tuple[str, Any]] = []

    def recording(request: Any, target: Any, waiting: Any) -> Any:
        reply = carry_out(request, target, waiting)
        _record(request, reply, seen)
        return reply

    async def arecording(request: Any, target: Any, waiting: Any) -> Any:
        reply = await acarry_out(request, target, waiting)
        _record(request, reply, seen)
        return reply

    engine._carry_out = recording  # type: ignore[method-assign]
    engine._acarry_out = arecording  # type: ignore[method-assign]
    return seen


@pytest.mark.parametrize("how", ["sync", "asyncio"])
@pytest.mark.parametrize("nodes", [1, 3])
def test_queueing_behind_a_hand_off_that_is_over_wakes_at_once(
    redis_node_factory: Callable[..., RedisNodes],
    redlock_alias: Callable[..., LockManager],
    nodes: int,
    how: str,
) -> None:
    """This process just handed the name to a waiter (its release reserved it), and the name
    is free again by the time it asks: its queued wait is woken at once, by its own
    registration, and it gets the name. Before, the wait ran its backoff step (RETRY_DELAY 5 s,
    up to 0.8 s) and returned unwoken."""
    manager = redlock_alias(redis_node_factory(nodes), TTL=10, RETRY_DELAY=5.0)
    lease = manager.acquire(NAME, timeout=0)
    record = lease.record
    assert lease.release() is True
    manager.engine.reservations.note(record)  # as if that release had woken a waiter
    seen = _waits_seen(manager)
    if how == "sync":
        again = manager.acquire(NAME, timeout=10)
    else:
        again = asyncio.run(manager.aacquire(NAME, timeout=10))
    assert again.token > lease.token
    assert again.release() is True
    assert seen, "the caller did not queue first: the test tested nothing"
    assert seen[0][1] is True, f"its first wait was not woken: {seen}"


def test_the_registration_leaves_a_wake_up_only_where_the_name_is_free(
    redis_node_factory: Callable[..., RedisNodes],
    redlock_alias: Callable[..., LockManager],
) -> None:
    """On the node waiters block on, the registration leaves one wake-up when no one holds
    the name and none is reserved or pending; never when it is held, reserved, or a wake-up
    is already there. On the other nodes it only registers."""
    node = redis_node_factory(1)[0]
    manager = redlock_alias([node.url], TTL=10)
    state = manager.engine.state
    keys = state.keys
    client = redis.Redis.from_url(str(node.url))
    wake = keys.wake(NAME)
    assert wake_node(NAME, 1) == 0

    def register() -> int:
        client.execute_command(*state.mark_command(NAME, "w1", 1000))
        return int(client.llen(wake))

    assert register() == 1, "a free name: one wake-up"
    assert 0 < client.pttl(wake) <= 1000
    assert register() == 1, "a wake-up already there: no second one"
    client.delete(wake)
    client.set(keys.lock(NAME), "someone", px=5000)
    assert register() == 0, "held: the holder's release wakes it"
    client.delete(keys.lock(NAME))
    client.set(keys.handoff(NAME), "w0", px=5000)
    assert register() == 0, "reserved for a waiter a release woke"
    client.delete(keys.handoff(NAME))
    # elsewhere (one key): a registration only
    client.eval(scripts.REGISTER.source, 1, keys.waiters(NAME), "w2", 1000)
    assert client.llen(wake) == 0
    assert client.zscore(keys.waiters(NAME), "w2") is not None


@pytest.mark.parametrize("kind", ["lock", "permit"])
def test_a_give_back_that_registers_wakes_where_the_release_came_first(
    redis_node_factory: Callable[..., RedisNodes],
    redlock_alias: Callable[..., LockManager],
    kind: str,
) -> None:
    """A failed attempt was granted on the node waiters block on (the holder's release had run
    there) and lost the quorum to nodes the release had not reached: its give-back there
    registers the caller and, the caller being new there, leaves a wake-up, since that release
    woke nobody. Not when the caller was registered there already, when a wake-up is pending
    or the name is reserved, nor on another node."""
    node = redis_node_factory(1)[0]
    manager = redlock_alias([node.url], TTL=10)
    state = manager.engine.state
    keys = state.keys
    client = redis.Redis.from_url(str(node.url))
    permits = 2 if kind == "permit" else 0
    slots = tuple(keys.permit(NAME, k) for k in range(permits))
    held = (slots[0],) if permits else (keys.lock(NAME),)

    def give_back(waiter: str, *, wakes: bool = True) -> int:
        client.set(held[0], f"{'o' * 32}|7", px=5000)  # the attempt's grant
        call = state.release_call(
            NAME, "o" * 32, wakes=wakes, mark_ms=1000, waiter=waiter, held=held,
            kind="permit" if permits else "", slots=slots,
        )  # fmt: skip
        client.evalsha(call.script.sha, len(call.keys), *call.keys, *call.args)
        assert not client.exists(held[0])  # given back
        assert client.zscore(keys.waiters(NAME), waiter) is not None  # registered
        return int(client.llen(keys.wake(NAME)))

    call = state.release_call(NAME, "x", wakes=True, kind="permit" if permits else "", slots=slots)
    client.script_load(call.script.source)
    assert give_back("w1") == 1, "new here, nothing pending: a wake-up"
    # the caller's own: no longer than its registration (WAKE_TTL_MS is 2 s), so a caller
    # that does not block for it after all leaves no wake-up for a later waiter
    assert 0 < client.pttl(keys.wake(NAME)) <= 1000
    client.delete(keys.wake(NAME))
    assert give_back("w1") == 0, "registered here already"
    assert give_back("w2") == 1
    assert give_back("w3") == 1, "a wake-up pending: no second one"
    client.delete(keys.wake(NAME), keys.waiters(NAME))
    client.set(keys.handoff(NAME), "1", px=5000)
    assert give_back("w4") == 0, "reserved for a woken waiter"
    client.delete(keys.handoff(NAME), keys.waiters(NAME))
    assert give_back("w5", wakes=False) == 0, "not the node waiters block on"


def test_back_to_back_permit_releases_wake_one_waiter_once(
    redis_node_factory: Callable[..., RedisNodes],
    redlock_alias: Callable[..., LockManager],
) -> None:
    """Two permits released one after the other while one caller waits: the first release
    wakes it (and promises it a slot); the second finds it still registered (a woken waiter
    stays registered until it wins) and pushed a second wake-up for it, which the next
    caller to block then took for nothing (an attack: 3 of 20 trials on 3 nodes). A waiter
    already promised a slot is not woken again; one that is not, is."""
    node = redis_node_factory(1)[0]
    manager = redlock_alias([node.url], TTL=10)
    state = manager.engine.state
    keys = state.keys
    client = redis.Redis.from_url(str(node.url))
    slots = tuple(keys.permit(NAME, k) for k in range(3))
    wake, waiters = keys.wake(NAME), keys.waiters(NAME)

    def release(slot: int) -> Any:
        client.set(slots[slot], f"{'o' * 32}|{slot + 1}", px=5000)
        call = state.release_call(
            NAME, "o" * 32, wakes=True, held=(slots[slot],), kind="permit", slots=slots
        )
        client.script_load(call.script.source)
        return client.evalsha(call.script.sha, len(call.keys), *call.keys, *call.args)

    for slot in range(3):
        client.set(slots[slot], "x|1", px=5000)  # held by others
    client.zadd(waiters, {"w1": int(time.time() * 1000) + 60_000})
    release(0)
    assert client.llen(wake) == 1, "the waiter is woken"
    assert client.lpop(wake) == b"1"  # it takes its wake-up (BLPOP) and has not won yet
    release(1)
    assert client.llen(wake) == 0, "woken already: no second wake-up"
    client.zadd(waiters, {"w2": int(time.time() * 1000) + 60_000})
    release(2)
    assert client.llen(wake) == 1, "a waiter not woken yet is woken"
