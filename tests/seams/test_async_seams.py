"""Attack probes: async generators, cancellation, child tasks, sync_to_async, on_busy."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator

import pytest
from asgiref.sync import async_to_sync, sync_to_async

from django_redlock import lock, locks
from django_redlock.exceptions import LockNotAcquired
from testproject.inventory.models import Product
from tests.seams.helpers import free_elsewhere, keys_left, take_elsewhere


def make_agen(name: str, alias: str = "default"):  # type: ignore[no-untyped-def]
    @locks[alias].alock(name, timeout=5)
    async def rows() -> AsyncIterator[int]:
        for i in range(3):
            await asyncio.sleep(0.05)
            yield i

    return rows


@pytest.mark.parametrize("alias", ["default", "multi"])
def test_async_generator_iterated_through_wait_for(alias: str, unique_name: str) -> None:
    """Each __anext__ runs in its own task (asyncio.wait_for): the generator still holds n
    from its first item to its end, and releases it at the end."""
    seen: list[object] = []

    async def scenario() -> None:
        agen = make_agen(unique_name, alias)()
        while True:
            try:
                item = await asyncio.wait_for(agen.__anext__(), 5)
            except StopAsyncIteration:
                break
            seen.append(item)
            seen.append(await asyncio.to_thread(free_elsewhere, unique_name, alias))

    asyncio.run(scenario())
    assert seen == [0, False, 1, False, 2, False]
    assert free_elsewhere(unique_name, alias)
    assert keys_left(unique_name, alias) == []


@pytest.mark.parametrize("alias", ["default", "multi"])
def test_consumer_task_cancelled_mid_iteration(alias: str, unique_name: str) -> None:
    """A task iterating a locked async generator is cancelled while the generator body
    awaits: the lease is released (at aclose or when the loop shuts the generator down)."""

    async def consume(agen: AsyncIterator[int]) -> None:
        async for _ in agen:
            await asyncio.sleep(10)

    async def scenario() -> None:
        agen = make_agen(unique_name, alias)()
        task = asyncio.create_task(consume(agen))
        await asyncio.sleep(0.3)
        assert not await asyncio.to_thread(free_elsewhere, unique_name, alias)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await agen.aclose()  # type: ignore[attr-defined]
        assert await asyncio.to_thread(free_elsewhere, unique_name, alias)

    asyncio.run(scenario())
    assert keys_left(unique_name, alias) == []


def test_wait_for_timeout_inside_the_generator_body(unique_name: str) -> None:
    """wait_for times out while the generator body awaits after acquiring (its first item):
    the generator is finished by the cancellation and releases n."""

    @locks["default"].alock(unique_name, timeout=5)
    async def slow() -> AsyncIterator[int]:
        await asyncio.sleep(10)
        yield 1

    async def scenario() -> None:
        agen = slow()
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(agen.__anext__(), 0.3)
        assert await asyncio.to_thread(free_elsewhere, unique_name)

    asyncio.run(scenario())
    assert keys_left(unique_name) == []


def test_cancel_while_the_generator_waits_for_the_lock(unique_name: str) -> None:
    """Another caller holds n; the generator's first item waits for it and is cancelled: no
    key and no waiter registration stay behind once the holder releases."""
    other = take_elsewhere(unique_name)[0]

    async def scenario() -> None:
        agen = make_agen(unique_name)()
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(agen.__anext__(), 0.3)

    asyncio.run(scenario())
    other.release()  # type: ignore[attr-defined]
    assert free_elsewhere(unique_name)
    assert keys_left(unique_name) == []


def test_async_generator_abandoned_is_released_at_loop_shutdown(unique_name: str) -> None:
    """An async generator that took n and is dropped unfinished: asyncio.run's
    shutdown_asyncgens finalizes it, releasing n."""

    async def scenario() -> None:
        agen = make_agen(unique_name)()
        await agen.__anext__()
        del agen

    asyncio.run(scenario())
    assert free_elsewhere(unique_name)
    assert keys_left(unique_name) == []


def test_on_busy_skip_on_async_function_and_async_generator(unique_name: str) -> None:
    """@lock(on_busy="skip") on a coroutine function returns None when busy; on an async
    generator it yields nothing; on a sync generator likewise; nothing waits for long."""
    calls: list[str] = []

    @locks["default"].alock(unique_name, on_busy="skip")
    async def job() -> str:
        calls.append("job")
        return "ran"

    @locks["default"].alock(unique_name, on_busy="skip")
    async def agen() -> AsyncIterator[int]:
        calls.append("agen")
        yield 1

    @lock(unique_name, on_busy="skip")
    def sgen() -> Iterator[int]:
        calls.append("sgen")
        yield 1

    @lock(unique_name, on_busy="skip")
    def sjob() -> str:
        calls.append("sjob")
        return "ran"

    other = take_elsewhere(unique_name)[0]
    try:

        async def scenario() -> tuple[object, list[int]]:
            return await job(), [i async for i in agen()]

        result, items = asyncio.run(scenario())
        assert result is None and items == []
        assert list(sgen()) == []
        assert sjob() is None
        assert calls == []
    finally:
        other.release()  # type: ignore[attr-defined]
    assert asyncio.run(job()) == "ran"
    assert keys_left(unique_name) == []


def test_sync_lock_decorator_on_coroutine_function_skip(unique_name: str) -> None:
    """The plain @lock (not alock) on an async def with on_busy="skip" behaves like alock's
    (the docs: coroutine functions work the same way) or refuses at decoration time."""
    try:

        @lock(unique_name, on_busy="skip")
        async def job() -> str:
            return "ran"

    except TypeError:
        return
    other = take_elsewhere(unique_name)[0]
    try:
        assert asyncio.run(job()) is None  # type: ignore[func-returns-value]
    finally:
        other.release()  # type: ignore[attr-defined]
    assert asyncio.run(job()) == "ran"
    assert keys_left(unique_name) == []


def test_gather_children_are_other_callers_and_parent_guard_survives(unique_name: str) -> None:
    """Inside alock(n), gather children: one locking n is another caller (times out), one
    locking m and releasing it; afterwards the parent's lease is still held and valid."""

    async def child_same() -> object:
        try:
            async with locks["default"].alock(unique_name, timeout=0.3):
                return "re-entered"
        except LockNotAcquired:
            return "waited"

    async def child_other() -> int:
        async with locks["default"].alock(unique_name + ":m", timeout=1) as lease:
            return lease.token

    async def scenario() -> list[object]:
        async with locks["default"].alock(unique_name, timeout=1) as parent:
            results = await asyncio.gather(child_same(), child_other())
            async with locks["default"].alock(unique_name, timeout=1) as again:
                assert again.token == parent.token
            parent.check()
            return list(results)

    results = asyncio.run(scenario())
    assert results[0] == "waited"
    assert keys_left(unique_name) == []


def test_sync_to_async_service_is_another_caller(unique_name: str) -> None:
    """Inside alock(n), sync_to_async(service) that locks n runs in another thread: it waits
    and times out (never re-enters); a service locking m works, and the parent's re-entry
    afterwards still finds its own lease."""

    def service_same() -> str:
        try:
            with locks["default"].lock(unique_name, timeout=0.3):
                return "re-entered"
        except LockNotAcquired:
            return "waited"

    def service_other() -> int:
        with locks["default"].lock(unique_name + ":m", timeout=1) as lease:
            return lease.token

    async def scenario() -> tuple[str, int]:
        async with locks["default"].alock(unique_name, timeout=1) as parent:
            a = await sync_to_async(service_same)()
            b = await sync_to_async(service_other)()
            async with locks["default"].alock(unique_name, timeout=1) as again:
                assert again.token == parent.token
            return a, b

    a, _ = asyncio.run(scenario())
    assert a == "waited"
    assert keys_left(unique_name) == []


def test_async_to_sync_inside_a_sync_block_reenters_or_waits_without_hanging(
    unique_name: str,
) -> None:
    """with lock(n): async_to_sync(coroutine that alock(n)) runs in another loop/thread: per
    the docs another caller: it must time out, not hang or break the outer block."""

    async def inner() -> str:
        try:
            async with locks["default"].alock(unique_name, timeout=0.3):
                return "re-entered"
        except LockNotAcquired:
            return "waited"

    with locks["default"].lock(unique_name, timeout=1) as outer:
        result = async_to_sync(inner)()
        outer.check()
        assert not free_elsewhere(unique_name)
    assert result in ("waited", "re-entered")
    assert keys_left(unique_name) == []


@pytest.mark.django_db(transaction=True)
def test_child_task_outliving_the_block_does_not_write_with_the_released_token(
    unique_name: str,
) -> None:
    """A child task created inside alock(n) inherits the guard; once the parent's block has
    ended and its lease is released, the child's writes must not carry that token (the
    block guards writes until its end)."""
    product = Product.objects.create(name="c", stock=1)
    started = asyncio.Event

    async def scenario() -> tuple[int, int]:
        go = asyncio.Event()

        async def child() -> None:
            await go.wait()
            row = await Product.objects.aget(pk=product.pk)
            row.stock = 2
            await row.asave()

        async with locks["default"].alock(unique_name, timeout=1) as parent:
            task = asyncio.create_task(child())
        assert await asyncio.to_thread(free_elsewhere, unique_name)
        go.set()
        await task
        row = await Product.objects.aget(pk=product.pk)
        return row.fence_token, parent.token

    del started
    row_token, parent_token = asyncio.run(scenario())
    assert row_token != parent_token, "a released lease's token guarded a child task's write"


@pytest.mark.parametrize("how", ["wait_for", "task_cancel"])
def test_a_cancelled_waiter_stops_counting_at_once(how: str, unique_name: str) -> None:
    """An alock() waiting for a busy name is cancelled: its waiter registration goes with
    it (as a timed-out waiter's does at its deadline), so the next release does not hand the
    name to a caller that no longer waits. Oracle: the node's sorted set of waiters."""
    import redis
    from django.conf import settings

    holder = take_elsewhere(unique_name)[0]

    async def wait() -> None:
        async with locks["default"].alock(unique_name, timeout=5):
            pass

    async def scenario() -> None:
        if how == "wait_for":
            with pytest.raises(asyncio.TimeoutError):
                await asyncio.wait_for(wait(), 0.3)
        else:
            task = asyncio.create_task(wait())
            await asyncio.sleep(0.3)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task

    asyncio.run(scenario())
    client = redis.Redis.from_url(settings.REDLOCK["default"]["NODES"][0])
    seconds, micros = client.time()
    now_ms = seconds * 1000 + micros // 1000
    waiters = f"{settings.REDLOCK['default']['KEY_PREFIX']}__waiters__:{unique_name}"
    live = client.zrangebyscore(waiters, now_ms, "+inf")
    holder.release()  # type: ignore[attr-defined]
    client.close()
    assert live == [], f"the cancelled waiter still counts as waiting: {live}"
