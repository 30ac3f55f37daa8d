"""Where the features meet (docs/production.md "How locks combine"): a
one-name set, generators, re-entry with other options, a second block of a name in one
transaction, read-write upgrades, sets and blocks of one name in one thread, ``on_busy="skip"``
and argument checks. Every test here failed before its fix."""

from __future__ import annotations

import asyncio
import gc
import multiprocessing
import threading
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
import redis
from django.db import connection, transaction

from django_redlock import lock, locks
from django_redlock.exceptions import LockError
from django_redlock.locking import context
from tests.support.attempts import free_elsewhere


def node_client(alias: str = "default") -> redis.Redis:
    """A client of the alias's first node."""
    from django.conf import settings

    return redis.Redis.from_url(settings.REDLOCK[alias]["NODES"][0])


def key_of(name: str, alias: str = "default") -> str:
    from django.conf import settings

    return f"{settings.REDLOCK[alias]['KEY_PREFIX']}{name}"


# -- lock_many of one name
@pytest.mark.parametrize("alias", ["default", "multi"])
def test_lock_many_of_one_name_holds_and_releases_it(alias: str, unique_name: str) -> None:
    """A one-item cart: the set holds its one name, and leaving the block frees it (before:
    TypeError after the name was locked, and the name stayed locked for its TTL)."""
    manager = locks[alias]
    with manager.lock_many([unique_name], ttl=30, timeout=0) as held:
        assert list(held.leases) == [unique_name]
        assert not free_elsewhere(unique_name, alias)
    assert free_elsewhere(unique_name, alias)
    held2 = manager.acquire_many((n for n in [unique_name]), ttl=30, timeout=0)
    assert held2.release() is True

    async def scenario() -> None:
        async with manager.alock_many({unique_name}, ttl=30, timeout=0) as held3:
            assert list(held3.leases) == [unique_name]

    asyncio.run(scenario())
    assert free_elsewhere(unique_name, alias)


def test_lock_many_counts_a_repeated_name_once(unique_name: str) -> None:
    """["a", "b", "a"] holds a and b (a repeat counts once; before: ValueError)."""
    names = [unique_name + ":a", unique_name + ":b", unique_name + ":a"]
    with locks["default"].lock_many(names, timeout=0) as held:
        assert sorted(held.leases) == sorted(set(names))
    assert free_elsewhere(names[0]) and free_elsewhere(names[1])


# -- generators
def test_a_locked_generator_holds_the_lock_while_it_runs(unique_name: str) -> None:
    """Two threads iterating an @lock generator never run its body at once (before: the lock
    was released when the generator object was made, before its body ran)."""
    inside: list[int] = []
    peak: list[int] = []

    @lock(unique_name + ":{0}", timeout=10)
    def rows(day: str) -> Iterator[int]:
        inside.append(1)
        time.sleep(0.3)
        peak.append(len(inside))
        yield 1
        inside.pop()

    threads = [threading.Thread(target=lambda: list(rows("mon"))) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert peak == [1, 1]


def test_a_locked_generator_is_held_from_first_item_to_close(unique_name: str) -> None:
    """Held from the first next() on, its token guards the body, and close() (or collection
    of an abandoned generator) releases it; a busy name with on_busy="skip" yields nothing."""
    tokens: list[int | None] = []

    @lock(unique_name, timeout=0)
    def numbers() -> Iterator[int]:
        for i in range(3):
            tokens.append(context.current_token())
            yield i

    gen = numbers()
    assert free_elsewhere(unique_name)  # nothing taken before the first iteration
    assert next(gen) == 0
    assert not free_elsewhere(unique_name) and tokens[0] is not None
    gen.close()
    assert free_elsewhere(unique_name)
    abandoned = numbers()
    next(abandoned)
    del abandoned
    gc.collect()
    assert free_elsewhere(unique_name)

    @lock(unique_name, on_busy="skip")
    def skipped() -> Iterator[int]:
        yield 1  # pragma: no cover

    holder = locks["default"].acquire(unique_name, timeout=0)
    done = threading.Event()
    results: list[list[int]] = []
    threading.Thread(target=lambda: (results.append(list(skipped())), done.set())).start()
    assert done.wait(5)
    assert results == [[]]
    holder.release()


def test_a_locked_async_generator_holds_the_lock_while_it_runs(unique_name: str) -> None:
    """lock() and alock() on an async generator: held while it is iterated, released when it
    ends (before: lock() released at once; alock() refused it)."""
    manager = locks["default"]
    seen: list[bool] = []

    def decorate(block: Any) -> Any:
        @block
        async def items() -> AsyncIterator[int]:
            for i in range(2):
                seen.append(free_elsewhere(unique_name))
                yield i

        return items

    async def scenario() -> None:
        for block in (lock(unique_name, timeout=0), manager.alock(unique_name, timeout=0)):
            assert [i async for i in decorate(block)()] == [0, 1]
            assert free_elsewhere(unique_name)

    asyncio.run(scenario())
    assert seen == [False] * 4


# -- re-entry with other options
def test_reentry_asking_a_longer_ttl_and_auto_extend_keeps_the_lease(unique_name: str) -> None:
    """An inner block asking ttl=60 and auto_extend under an outer ttl=0.5 block: nobody else
    takes the name while the inner block runs past the outer TTL; same token."""
    manager = locks["default"]
    with manager.lock(unique_name, ttl=0.5, timeout=0) as outer:
        with manager.lock(unique_name, ttl=60, auto_extend=True, timeout=0) as inner:
            assert inner is outer
            assert node_client().pttl(key_of(unique_name)) > 30_000
            time.sleep(1.0)
            assert not free_elsewhere(unique_name) and not inner.lost
        assert not outer.lost
    assert free_elsewhere(unique_name)


def test_reentry_with_auto_extend_renews_past_the_ttl(unique_name: str) -> None:
    """auto_extend=True on re-entry (same ttl) renews the lease until the inner block ends."""
    manager = locks["default"]
    with manager.lock(unique_name, ttl=0.6, timeout=0) as outer:
        with manager.lock(unique_name, auto_extend=True, timeout=0):
            time.sleep(1.5)
            assert not free_elsewhere(unique_name)
        assert outer.validity > 0
    assert free_elsewhere(unique_name)


# -- read-write upgrade in one thread
def test_upgrading_a_read_lease_raises_at_once(unique_name: str) -> None:
    """write_lock under its own read lease (or read_lock under its own write lease) raises
    LockError at once, whatever the timeout (before: it waited for itself, keeping every
    other reader out)."""
    manager = locks["default"]
    with (
        manager.read_lock(unique_name, ttl=5),
        pytest.raises(LockError, match="upgrade"),
        manager.write_lock(unique_name, timeout=None),
    ):
        pass  # pragma: no cover
    with (
        manager.write_lock(unique_name, ttl=5),
        pytest.raises(LockError, match="downgrade"),
        manager.read_lock(unique_name, timeout=None),
    ):
        pass  # pragma: no cover
    reader = manager.acquire(unique_name, rw="read", timeout=0)  # nothing was left waiting
    reader.release()


def test_nested_read_blocks_reenter_the_read_lease(unique_name: str) -> None:
    """A read block inside this thread's read block of the name re-enters it, so a writer
    waiting in between cannot make the thread wait for itself."""
    manager = locks["default"]
    with manager.read_lock(unique_name, ttl=5) as outer:
        with manager.read_lock(unique_name, timeout=0) as inner:
            assert inner is outer
        assert not outer.released


# -- a second block of one name in one transaction
@pytest.mark.django_db(transaction=True)
def test_second_block_of_a_name_in_one_transaction_reenters(unique_name: str) -> None:
    """Two service calls of one transaction lock the same name one after the other: the
    second re-enters the lease kept for the commit (same token) instead of waiting for it;
    the commit releases it."""
    with transaction.atomic():
        with lock(unique_name, timeout=0) as first:
            pass
        with lock(unique_name, timeout=0) as second:
            assert second is first
            assert context.current_token() == first.token  # it guards this block's writes
        assert context.current_token() is None  # ... and no writes after it
        assert not free_elsewhere(unique_name)
    assert free_elsewhere(unique_name)


@pytest.mark.django_db(transaction=True)
def test_a_lease_kept_for_one_transaction_is_not_reentered_by_the_next(unique_name: str) -> None:
    """A lease kept for a transaction that is over is not found by a block after it."""
    with transaction.atomic(), lock(unique_name, timeout=0) as first:
        pass
    with lock(unique_name, timeout=0) as after:
        assert after is not first and after.token > first.token


# -- lock_many and lock() of one name in one thread
def test_lock_inside_lock_many_reenters_the_sets_lease(unique_name: str) -> None:
    """A per-product service locking product:3 inside a cart's lock_many re-enters the set's
    lease (before: LockNotAcquired after its timeout)."""
    manager = locks["default"]
    names = [unique_name + ":3", unique_name + ":4"]
    with manager.lock_many(names, timeout=0) as held:
        with manager.lock(names[0], timeout=0) as lease:
            assert lease is held.leases[names[0]]
        assert not free_elsewhere(names[0])
    assert free_elsewhere(names[0]) and free_elsewhere(names[1])


def test_lock_many_inside_lock_reenters_the_held_name(unique_name: str) -> None:
    """A cart's lock_many inside a block holding one of its names re-enters that name (same
    lease) and takes the others; leaving the set keeps the outer name held."""
    manager = locks["default"]
    names = [unique_name + ":1", unique_name + ":2"]
    with manager.lock(names[0], timeout=0) as outer:
        with manager.lock_many(names, timeout=0) as held:
            assert held.leases[names[0]] is outer
            assert not free_elsewhere(names[1])
        assert not free_elsewhere(names[0]) and free_elsewhere(names[1])
    assert free_elsewhere(names[0])


def test_lock_many_of_a_bare_acquired_name_raises_at_once(unique_name: str) -> None:
    """A name this thread holds with acquire() is refused at once, named (never waited for)."""
    manager = locks["default"]
    lease = manager.acquire(unique_name, timeout=0)
    with (
        pytest.raises(LockError, match="acquire"),
        manager.lock_many([unique_name, unique_name + ":x"], timeout=None),
    ):
        pass  # pragma: no cover
    lease.release()
    assert free_elsewhere(unique_name + ":x")


# -- on_busy="skip"
def test_skip_makes_one_attempt(unique_name: str) -> None:
    """@lock(on_busy="skip") does not wait the alias TIMEOUT for a busy name: it skips at once
    (before: it waited for the holder, then ran). An explicit timeout= still waits."""
    calls: list[str] = []
    holder = locks["default"].acquire(unique_name, ttl=5, timeout=0)
    released = threading.Timer(0.5, holder.release)

    @lock(unique_name, ttl=5, on_busy="skip")
    def nightly() -> str:
        calls.append("ran")
        return "ran"

    @lock(unique_name, ttl=5, on_busy="skip", timeout=5)
    def patient() -> str:
        return "ran"

    released.start()
    try:
        outcome: list[str | None] = []
        worker = threading.Thread(target=lambda: outcome.append(nightly()))
        worker.start()
        worker.join()
        assert outcome == [None] and calls == []
        waiter: list[str | None] = []
        worker = threading.Thread(target=lambda: waiter.append(patient()))
        worker.start()
        worker.join()
        assert waiter == ["ran"]
    finally:
        released.cancel()
        holder.release()


# -- a lease kept for a commit that never comes
@pytest.mark.django_db(transaction=True)
def test_rollback_releases_even_while_the_callback_is_referenced(unique_name: str) -> None:
    """A rollback whose discarded on_commit callbacks are kept alive (a traceback, PyPy) still
    releases: the next renewal finds the transaction over (before: renewed until collected)."""
    kept: list[Any] = []
    gc.disable()
    try:
        with pytest.raises(RuntimeError), transaction.atomic():
            with lock(unique_name, ttl=0.6, timeout=0):
                pass
            kept.append(list(connection.run_on_commit))  # keeps the callback alive
            raise RuntimeError("roll back")
        deadline = time.monotonic() + 5
        while not free_elsewhere(unique_name) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert free_elsewhere(unique_name)
    finally:
        gc.enable()
        kept.clear()


@pytest.mark.django_db(transaction=True)
def test_an_earlier_failing_commit_hook_does_not_keep_the_lease(unique_name: str) -> None:
    """An on_commit hook registered before the lock's raises: the lock's hook never runs, but
    the lease is released by its next renewal, not kept while the exception lives."""
    errors: list[BaseException] = []

    def failing() -> None:
        raise ValueError("hook failed")

    try:
        with transaction.atomic():
            transaction.on_commit(failing)
            with lock(unique_name, ttl=0.6, timeout=0):
                pass
    except ValueError as exc:
        errors.append(exc)  # keeps the traceback, and with it the list of pending hooks
    assert errors
    deadline = time.monotonic() + 5
    while not free_elsewhere(unique_name) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert free_elsewhere(unique_name)


# -- arguments refused before any network call
def _one(a: int) -> None:
    pass  # pragma: no cover


@pytest.mark.parametrize(
    ("make", "error", "message"),
    [
        (lambda m: m.semaphore("s", None), TypeError, "permits"),
        (lambda m: m.lock("j", min_hold=float("inf")), ValueError, "min_hold"),
        (lambda m: m.lock("j", min_hold=3e9), ValueError, "min_hold"),
        (lambda m: m.alock("j", on_lost="cancel"), ValueError, "auto_extend"),
        (lambda m: m.lock("t:{}:{}")(_one), ValueError, "positional parameter"),
        (lambda m: m.lock("t:{}:{0}")(_one), ValueError, "one style"),
    ],
)
def test_bad_arguments_are_refused_when_the_block_is_made(
    make: Any, error: type[Exception], message: str, redlock_alias: Any
) -> None:
    """semaphore(name, None), an infinite or huge min_hold, on_lost without auto_extend and an
    auto-numbered template with too few arguments fail at once, with nothing sent (the alias
    points at a port nobody listens on)."""
    manager = redlock_alias(["redis://127.0.0.1:1/0"])
    with pytest.raises(error, match=message):
        make(manager)
    manager.lock("t:{}")(_one)  # one field, one argument: fine


# -- a parent's lease in a forked child
def _child_view(lease: Any, out: Any) -> None:
    try:
        lease.check()
        checked = "passed"
    except LockError:
        checked = "LockError"
    out.put((lease.validity, lease.lost, checked))


@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # Python 3.12+: fork with threads
def test_a_parents_lease_in_a_forked_child_is_not_valid_there(unique_name: str) -> None:
    """In a forked child, the parent's lease reports no validity, counts as lost, and check()
    raises LockError (before: validity ~2 s and lost False)."""
    lease = locks["default"].acquire(unique_name, ttl=5, timeout=0)
    ctx = multiprocessing.get_context("fork")
    out = ctx.Queue()
    child = ctx.Process(target=_child_view, args=(lease, out))
    child.start()
    validity, lost, checked = out.get(timeout=20)
    child.join(20)
    assert (validity, lost, checked) == (0.0, True, "LockError")
    assert lease.validity > 0 and not lease.lost
    lease.release()


# -- releases cost the same with many leases held (the benchmark measures it; this
# checks that the bookkeeping does not grow)
def test_bookkeeping_of_many_leases_stays_small(unique_name: str) -> None:
    """Acquiring and releasing 2,000 leases in any order leaves no active entry behind, and
    the innermost lease is always the last one still held."""
    manager = locks["default"]
    leases = manager.acquire_many([f"{unique_name}:{i}" for i in range(1000)], ttl=30, timeout=0)
    singles = [manager.acquire(f"{unique_name}:s{i}", ttl=30, timeout=0) for i in range(200)]
    for lease in singles[:100]:  # first in, first out
        lease.release()
    assert context.current_lease() is singles[-1]
    for lease in reversed(singles[100:]):  # last in, first out
        lease.release()
    assert context.current_lease() is list(leases.leases.values())[-1]
    assert leases.release() is True
    assert context.current_lease() is None


def test_a_task_reenters_its_lease_after_sync_to_async(unique_name: str) -> None:
    """asgiref copies a sync_to_async thread's context back into the calling task: a lease the
    thread acquired stays active for the task, and the task still re-enters its own block's
    lease afterwards (no wait for itself)."""
    from asgiref.sync import sync_to_async

    manager = locks["default"]

    def service() -> Any:
        return manager.acquire(unique_name + ":svc", timeout=0)

    async def scenario() -> None:
        async with manager.alock(unique_name, timeout=0) as outer:
            inner_lease = await sync_to_async(service)()
            assert context.current_lease() is inner_lease
            async with manager.alock(unique_name, timeout=0) as again:
                assert again is outer
            await inner_lease.arelease()
            assert context.current_lease() is outer

    asyncio.run(scenario())
    assert free_elsewhere(unique_name)


def test_lock_above_classmethod_is_refused_when_decorating(redlock_alias: Any) -> None:
    """@lock placed above @classmethod/@staticmethod fails when the class is defined, saying
    which order works (before: ValueError ... KeyError 'cls' at call time)."""
    manager = redlock_alias(["redis://127.0.0.1:1/0"])
    for wrap in (classmethod, staticmethod):
        with pytest.raises(TypeError, match=f"@{wrap.__name__} above"):
            manager.lock("job:{0}")(wrap(lambda *args: None))

    class Jobs:
        @classmethod
        @manager.lock("job:{cls.__name__}", timeout=0)
        def run(cls) -> str:
            return "ran"

    assert Jobs.run.__name__ == "run"
