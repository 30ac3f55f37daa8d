"""``django_redlock.cache.aget_or_set``, the asyncio twin of ``get_or_set`` (docs/effects.md,
"Stampede-proof cache fill"), on a real Redis cache with both backends: processes and tasks
missing one key at once compute once; errors as in the blocking version."""

from __future__ import annotations

import asyncio
import random
import threading
import time
import uuid
from typing import Any

import pytest
from django.core.cache import cache, caches

from django_redlock import locks, signals
from django_redlock.cache import aget_or_set, get_or_set
from django_redlock.cache.arguments import lock_name
from django_redlock.cache.stores import store_for
from django_redlock.exceptions import LockError
from django_redlock.testing import RedisNode, RedisNodes
from tests.support import cache_workers as workers
from tests.support.processes import PROCESSES
from tests.support.waiting import until, until_waiting


@pytest.fixture
def key() -> str:
    return f"ak-{uuid.uuid4().hex[:10]}"


def name_of(key: str) -> str:
    return lock_name("default", store_for("default", caches["default"]).full_key(key))


# the other backend in the long profile: the single-process tests run on both
@pytest.mark.parametrize(
    "backend", ["django", pytest.param("django-redis", marks=pytest.mark.slow)], indirect=True
)
def test_eight_processes_missing_at_once_compute_once(
    backend: str, cache_node: RedisNode, key: str, settings: Any
) -> None:
    """8 processes, each in ``asyncio.run(aget_or_set(...))``: one computes while the 7
    others are seen waiting, and all 8 return its value."""
    client = cache_node.client()
    counter = f"{key}:computes"
    args = (settings.REDLOCK, settings.CACHES, key, cache_node.url, counter, 30, None, True)
    with PROCESSES.Pool(8) as pool:
        results = pool.starmap_async(workers.fill_gated, [args] * 8)
        until(lambda: client.get(counter) is not None, 60, "the first compute")
        until_waiting(locks["default"], name_of(key), 7, 60)
        client.rpush(f"{counter}:gate", "go")
        values = results.get(timeout=60)
    assert int(client.get(counter)) == 1
    assert len(set(values)) == 1 and cache.get(key) == values[0]


def test_tasks_of_one_loop_compute_once(backend: str, key: str) -> None:
    """Five tasks miss together: the coroutine compute runs once (held until the others
    wait), the four others wait for it (never taking the write lease themselves), and all
    get its value; a hit after that computes nothing."""
    calls: list[int] = []
    name = name_of(key)
    writes: list[int] = []

    def count(sender: Any, **kwargs: Any) -> None:
        if kwargs["name"] == name and kwargs["lease"].kind == "write":
            writes.append(kwargs["lease"].token)

    async def main() -> list[str]:
        release = asyncio.Event()

        async def compute() -> str:
            calls.append(1)
            await release.wait()
            return "async value"

        first = asyncio.create_task(aget_or_set(key, compute, 30))
        while not calls:
            await asyncio.sleep(0.01)
        others = [asyncio.create_task(aget_or_set(key, compute, 30)) for _ in range(4)]
        await asyncio.to_thread(until_waiting, locks["default"], name, 4, 30)
        release.set()
        values = await asyncio.gather(first, *others)
        values.append(await aget_or_set(key, compute, 30))
        return values

    signals.lock_acquired.connect(count)
    try:
        assert asyncio.run(main()) == ["async value"] * 6
    finally:
        signals.lock_acquired.disconnect(count)
    assert calls == [1] and len(writes) == 1
    assert get_or_set(key, lambda: "unused", 30) == "async value"


def test_plain_function_compute_and_stale(backend: str, key: str) -> None:
    """A plain function as compute; ``stale`` serves the old value while the lease is held
    by another caller."""

    async def main() -> tuple[str, str]:
        first = await aget_or_set(key, lambda: "old", 0.1, stale=30)
        await asyncio.sleep(0.2)
        with workers.held_by_another_thread(locks["default"], name_of(key)):
            stale = await aget_or_set(key, lambda: "unused", 0.1, stale=30)
        return first, stale

    assert asyncio.run(main()) == ("old", "old")


def test_compute_raising_stores_nothing_and_releases(backend: str, key: str) -> None:
    async def failing() -> str:
        raise ZeroDivisionError

    with pytest.raises(ZeroDivisionError):
        asyncio.run(aget_or_set(key, failing, 30))
    assert cache.get(key, "absent") == "absent"
    locks["default"].acquire(name_of(key), rw="write", timeout=0).release()


def test_bad_input_and_own_key(backend: str, key: str) -> None:
    """The checks of the blocking version, before anything is written; a compute asking for
    its own key is a LockError at once."""
    with pytest.raises(TypeError, match="callable"):
        asyncio.run(aget_or_set(key, 42, 30))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="more than 0 seconds"):
        asyncio.run(aget_or_set(key, lambda: 1, -1))

    async def recursive() -> str:
        return await aget_or_set(key, lambda: "inner", 30)

    with pytest.raises(LockError, match="it would wait for itself"):
        asyncio.run(aget_or_set(key, recursive, 30))
    assert cache.get(key, "absent") == "absent"


def test_a_blocking_plain_compute_longer_than_the_ttl_keeps_its_lease(
    backend: str, key: str, settings: Any, redlock_alias: Any
) -> None:
    """A plain (blocking) compute runs in a worker thread, so the loop keeps renewing the
    write lease: a compute of 2 s on an alias whose TTL is 0.6 s still holds the key, and a
    caller arriving 1.3 s in waits and reads its value instead of computing a second time.
    (A TTL of 0.3 s lost its lease once on a loaded CI run: a renewal there is due every
    0.1 s and may come late by more than the TTL's spare 0.2 s; that loss is correct.)"""
    manager = redlock_alias(settings.REDLOCK["default"]["NODES"], TTL=0.6, TIMEOUT=30)
    computes: list[str] = []
    started = threading.Event()

    def slow() -> str:
        computes.append("slow")
        started.set()
        time.sleep(2.0)
        return "slow"

    first = threading.Thread(
        target=lambda: asyncio.run(aget_or_set(key, slow, 30, using=manager.alias))
    )
    first.start()
    assert started.wait(30)
    time.sleep(1.3)  # more than two TTLs into the compute

    def second() -> str:
        computes.append("second")
        return "second"

    assert get_or_set(key, second, 30, using=manager.alias) == "slow"
    first.join(30)
    assert computes == ["slow"]


def test_a_plain_compute_asking_for_its_own_key_fails_at_once(backend: str, key: str) -> None:
    """The plain compute runs in a worker thread, which still knows that its key is being
    computed: asking for it there is a LockError at once, not a wait for itself."""

    def recursive() -> str:
        return get_or_set(key, lambda: "inner", 30)

    with pytest.raises(LockError, match="it would wait for itself"):
        asyncio.run(aget_or_set(key, recursive, 30))
    assert cache.get(key, "absent") == "absent"


def test_an_object_with_an_async_call_is_awaited(backend: str, key: str) -> None:
    """An object whose ``__call__`` is a coroutine function is awaited by ``aget_or_set``
    and refused by ``get_or_set`` (before anything is written), like a coroutine function."""

    class Build:
        async def __call__(self) -> str:
            return "built"

    with pytest.raises(TypeError, match="async __call__"):
        get_or_set(key, Build(), 30)
    assert cache.get(key, "absent") == "absent"
    assert asyncio.run(aget_or_set(key, Build(), 30)) == "built"


ROUNDS, WAITERS = 12, 25


@pytest.mark.parametrize("count", [1, 3])
def test_cancelled_waiters_leave_no_read_lease(
    backend: str, key: str, count: int, session_nodes: RedisNodes, redlock_alias: Any
) -> None:
    """Twelve fills, each awaited by 25 tasks cancelled at random moments: while they
    wait, while the writer's release wakes them, while their read lease is acquired or
    released. None of them leaves a read lease (or the readers' marker) on a node, which
    would keep writers out for its TTL. (One and three of the session's nodes, with a
    generous NODE_TIMEOUT: 100 tasks of one loop on a loaded machine answered late, and a
    waiter failed with NodesUnavailable, which is not what this test is about.)"""
    rng = random.Random(7)
    manager = redlock_alias(session_nodes.urls[:count], TTL=5.0, NODE_TIMEOUT=2.0)
    using = manager.alias
    names: list[str] = []
    cancelled: list[int] = []

    async def one_fill(round_key: str, count: int) -> None:
        release = asyncio.Event()

        async def compute() -> str:
            await release.wait()
            return "value"

        first = asyncio.create_task(aget_or_set(round_key, compute, 30, using=using))
        waiters = [
            asyncio.create_task(aget_or_set(round_key, compute, 30, using=using))
            for _ in range(count)
        ]
        # the fill is under way and waiters are registering (under load most of them may
        # still be on their way: they are cancelled at whatever stage they reached)
        await asyncio.to_thread(until_waiting, manager, name_of(round_key), 1, 30)
        loop = asyncio.get_running_loop()
        for task in waiters:  # a sixth before the release, the others while readers run
            loop.call_later(rng.uniform(0.0, 0.18), task.cancel)
        await asyncio.sleep(0.03)
        release.set()
        outcomes = await asyncio.gather(first, *waiters, return_exceptions=True)
        assert outcomes[0] == "value"
        unexpected = [
            o for o in outcomes if o != "value" and not isinstance(o, asyncio.CancelledError)
        ]
        assert unexpected == []
        cancelled.append(sum(isinstance(o, asyncio.CancelledError) for o in outcomes))

    async def main() -> None:
        # 25 tasks per fill: 100 tasks of one event loop opening 3 connections each at once
        # starve that loop past NODE_TIMEOUT (connects time out: NodesUnavailable)
        for round_ in range(ROUNDS):
            round_key = f"{key}-{round_}"
            names.append(name_of(round_key))
            await one_fill(round_key, WAITERS)

    asyncio.run(main())
    assert 0 < sum(cancelled) < ROUNDS * WAITERS  # cancelled at every stage, some finished
    keys = manager.engine.state.keys
    left = {
        name: [
            k
            for node in session_nodes
            for k in (keys.readers(name), keys.lock(name))
            if node.client().exists(k)
        ]
        for name in names
    }
    assert left == {name: [] for name in names}
