"""Attack probes: locked generators meeting re-entry, transactions and other threads."""

from __future__ import annotations

import asyncio
import gc
import threading
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import ExitStack

import pytest
from django.db import transaction

from django_redlock import locks
from django_redlock.exceptions import LockLost, LockNotAcquired, StaleTokenError
from testproject.inventory.models import Product
from tests.seams.helpers import free_elsewhere, keys_left, take_elsewhere


def make_gen(name: str, alias: str = "default", **options: object):  # type: ignore[no-untyped-def]
    @locks[alias].lock(name, timeout=5, **options)
    def rows() -> Iterator[int]:
        yield 1
        yield 2

    return rows


@pytest.mark.parametrize("alias", ["default", "multi"])
def test_caller_block_reentering_a_generators_lease_survives_the_generators_close(
    alias: str, unique_name: str
) -> None:
    """A generator holds n (suspended at a yield); the caller then enters lock(n) in the same
    thread. Whether that is a re-entry or a wait, the caller's block must stay guarded until
    it ends: closing the generator inside the caller's block must not free n under it."""
    gen = make_gen(unique_name, alias)()
    assert next(gen) == 1
    try:
        with locks[alias].lock(unique_name, timeout=1) as outer:
            gen.close()
            assert not free_elsewhere(unique_name, alias), (
                "the caller's lock block is open but another caller could take the name"
            )
            outer.check()
    except LockNotAcquired:
        gen.close()  # not a re-entry: acceptable, the block waited like another caller
    assert free_elsewhere(unique_name, alias)
    assert keys_left(unique_name, alias) == []


@pytest.mark.django_db(transaction=True)
def test_generator_close_keeps_the_guard_of_a_block_entered_after_it(unique_name: str) -> None:
    """gen holds a (first next()), then the caller enters lock(b) and closes gen inside it:
    the caller's writes must still carry b's token (the innermost active lease)."""
    product = Product.objects.create(name="g", stock=1)
    gen = make_gen(unique_name + ":a")()
    next(gen)
    with locks["default"].lock(unique_name + ":b", timeout=1) as lb:
        gen.close()
        product.refresh_from_db()
        product.stock = 2
        product.save()
        assert Product.objects.get(pk=product.pk).fence_token == lb.token
    assert keys_left(unique_name) == []


@pytest.mark.django_db(transaction=True)
def test_interleaved_generators_release_each_their_own(unique_name: str) -> None:
    """g1 holds a, g2 holds b; closing g1 first frees a only, b stays held and guards writes
    until g2 is closed; afterwards nothing guards writes and nothing is left on the node."""
    product = Product.objects.create(name="g", stock=1)
    g1 = make_gen(unique_name + ":a")()
    g2 = make_gen(unique_name + ":b")()
    next(g1)
    next(g2)
    g1.close()
    assert free_elsewhere(unique_name + ":a")
    assert not free_elsewhere(unique_name + ":b")
    g2.close()
    assert free_elsewhere(unique_name + ":b")
    product.refresh_from_db()
    before = product.fence_token
    product.stock = 3
    product.save()
    assert Product.objects.get(pk=product.pk).fence_token == before, (
        "a closed lease guarded a write"
    )
    assert keys_left(unique_name) == []


def test_generator_abandoned_in_another_thread_is_released(unique_name: str) -> None:
    """A worker thread starts an @lock generator and drops it; it is released when collected
    (the docs: an abandoned generator is released when collected), and the worker thread's
    own later lock(n) is not a re-entry of the dead generator's lease."""
    seen: list[object] = []

    def worker() -> None:
        gen = make_gen(unique_name)()
        next(gen)
        del gen
        gc.collect()
        try:
            with locks["default"].lock(unique_name, timeout=2) as lease:
                seen.append(lease.token)
        except Exception as exc:
            seen.append(exc)

    t = threading.Thread(target=worker)
    t.start()
    t.join(30)
    assert seen and isinstance(seen[0], int), seen
    assert free_elsewhere(unique_name)
    assert keys_left(unique_name) == []


def test_generator_started_in_one_thread_closed_in_another(unique_name: str) -> None:
    """Thread A takes the first item (acquires); the main thread closes the generator: the
    name is freed, and thread A's later writes/locks are not guarded by that lease."""
    holder: list[object] = []
    started = threading.Event()
    closed = threading.Event()
    after: list[object] = []

    def worker() -> None:
        gen = make_gen(unique_name)()
        next(gen)
        holder.append(gen)
        started.set()
        closed.wait(10)
        # the generator was closed elsewhere: a new lock(n) here must take a new lease
        try:
            with locks["default"].lock(unique_name, timeout=2) as lease:
                after.append(lease.token)
        except Exception as exc:
            after.append(exc)

    t = threading.Thread(target=worker)
    t.start()
    assert started.wait(10)
    gen = holder.pop()
    first = None
    try:
        gen.close()  # type: ignore[attr-defined]
    except Exception as exc:
        first = exc
    closed.set()
    t.join(30)
    assert first is None, f"closing from another thread raised {first!r}"
    assert after and isinstance(after[0], int), after
    assert free_elsewhere(unique_name)
    assert keys_left(unique_name) == []


@pytest.mark.django_db(transaction=True)
def test_generator_open_across_a_rollback_keeps_its_lease(unique_name: str) -> None:
    """A generator that took n inside atomic() and is still suspended when the transaction
    rolls back still holds n (its block has not ended); closing it later frees n."""
    gen = make_gen(unique_name)()
    with pytest.raises(RuntimeError), transaction.atomic():
        next(gen)
        raise RuntimeError("rollback")
    assert not free_elsewhere(unique_name), "the open generator's lease was freed by the rollback"
    gen.close()
    assert free_elsewhere(unique_name)
    assert keys_left(unique_name) == []


@pytest.mark.django_db(transaction=True)
def test_generator_reentering_a_kept_lease_holds_it_past_the_commit(unique_name: str) -> None:
    """atomic(): a block of n ends (kept for the commit); a generator of n started in the
    same transaction re-enters the kept lease; the commit happens while the generator is
    still open: n must stay held until the generator ends."""
    gen = make_gen(unique_name)()
    with transaction.atomic():
        with locks["default"].lock(unique_name, timeout=1) as first:
            pass
        assert next(gen) == 1
    held_after_commit = not free_elsewhere(unique_name)
    gen.close()
    assert held_after_commit, (
        f"the commit released the lease (token {first.token}) while a generator still held it"
    )
    assert free_elsewhere(unique_name)
    assert keys_left(unique_name) == []


@pytest.mark.django_db(transaction=True)
def test_block_reentering_a_kept_lease_holds_it_past_the_commit(unique_name: str) -> None:
    """The same with an ExitStack: a lock(n) block entered inside atomic() after an earlier
    block of n ended there, and left after the commit; n is held until that block ends."""
    with ExitStack() as stack:
        with transaction.atomic():
            with locks["default"].lock(unique_name, timeout=1):
                pass
            second = stack.enter_context(locks["default"].lock(unique_name, timeout=1))
        held = not free_elsewhere(unique_name)
        second_valid = not second.lost
    assert held and second_valid, "the commit released a lease whose block was still open"
    assert free_elsewhere(unique_name)
    assert keys_left(unique_name) == []


@pytest.mark.django_db(transaction=True)
def test_generator_finished_inside_atomic_is_kept_until_commit_and_reentered(
    unique_name: str,
) -> None:
    """A generator that ends inside atomic() is a block that ended there: kept until the
    commit, re-entered by a lock(n) in the same transaction (same token), free after."""
    with transaction.atomic():
        gen = make_gen(unique_name)()
        assert list(gen) == [1, 2]
        assert not free_elsewhere(unique_name)
        with locks["default"].lock(unique_name, timeout=1) as again:
            token = again.token
        with locks["default"].lock(unique_name, timeout=1) as third:
            assert third.token == token
    assert free_elsewhere(unique_name)
    assert keys_left(unique_name) == []


@pytest.mark.django_db(transaction=True)
def test_reentered_kept_lease_is_not_released_by_a_savepoint_rollback(unique_name: str) -> None:
    """atomic(): block of n ends (kept for the outer commit). A savepoint then re-enters the
    kept lease and rolls back. The first block ended in the outer transaction, so n must
    stay held until the outer commit (else the next holder reads uncommitted rows)."""
    product = Product.objects.create(name="s", stock=1)
    with transaction.atomic():
        with locks["default"].lock(unique_name, timeout=1) as first:
            Product.objects.filter(pk=product.pk).update(stock=5)
        with pytest.raises(RuntimeError), transaction.atomic():
            with locks["default"].lock(unique_name, timeout=1) as again:
                assert again.token == first.token
            raise RuntimeError("savepoint rollback")
        still_held = not free_elsewhere(unique_name)
    assert still_held, "a savepoint rollback released a lease kept for the outer commit"
    assert free_elsewhere(unique_name)
    assert keys_left(unique_name) == []


@pytest.mark.django_db(transaction=True)
def test_reentry_in_a_rolled_back_savepoint_keeps_the_outer_block(unique_name: str) -> None:
    """with lock(n) in atomic(); a nested savepoint re-enters n and rolls back: the outer
    block still holds n and its writes are still guarded by its token."""
    product = Product.objects.create(name="s", stock=1)
    with transaction.atomic(), locks["default"].lock(unique_name, timeout=1) as outer:
        with pytest.raises(RuntimeError), transaction.atomic():  # noqa: SIM117
            with locks["default"].lock(unique_name, timeout=1):
                raise RuntimeError("inner")
        assert not free_elsewhere(unique_name)
        outer.check()
        product.refresh_from_db()
        product.stock = 9
        product.save()
        assert Product.objects.get(pk=product.pk).fence_token == outer.token
    assert free_elsewhere(unique_name)
    assert keys_left(unique_name) == []


@pytest.mark.django_db(transaction=True)
def test_lock_many_reenters_a_lease_kept_for_the_commit(unique_name: str) -> None:
    """atomic(): lock(a) ends (kept). lock_many([a, b]) in the same transaction must not wait
    for its own kept lease (re-entry, or a LockError at once), never a timeout."""
    a, b = unique_name + ":a", unique_name + ":b"
    with transaction.atomic():
        with locks["default"].lock(a, timeout=1) as first:
            pass
        try:
            with locks["default"].lock_many([a, b], timeout=2) as held:
                assert held.tokens[a] == first.token
        except LockNotAcquired as exc:
            pytest.fail(f"lock_many waited for the thread's own kept lease: {exc}")
    assert free_elsewhere(a) and free_elsewhere(b)
    assert keys_left(unique_name) == []


@pytest.mark.django_db(transaction=True)
def test_reentry_inside_lock_many_inside_atomic(unique_name: str) -> None:
    """atomic(): lock_many([a, b]); lock(a) inside re-enters it; the set ends (kept until the
    commit); a later lock(b) in the transaction re-enters the kept b; all free after the
    commit, tokens increase for the next holder."""
    a, b = unique_name + ":a", unique_name + ":b"
    with transaction.atomic():
        with locks["default"].lock_many([a, b], timeout=1) as held:  # noqa: SIM117
            with locks["default"].lock(a, timeout=1) as inner:
                assert inner.token == held.tokens[a]
        assert not free_elsewhere(a) and not free_elsewhere(b)
        with locks["default"].lock(b, timeout=1) as again:
            assert again.token == held.tokens[b]
    assert free_elsewhere(a) and free_elsewhere(b)
    with locks["default"].lock(a, timeout=1) as later:
        assert later.token > held.tokens[a]
    assert keys_left(unique_name) == []


def test_set_inside_set_sharing_a_name_does_not_wait_for_itself(unique_name: str) -> None:
    """lock_many([a, b]) then lock_many([b, c]) in the same thread: b is the thread's own
    block lease: re-entry (or LockError at once), never a wait for itself."""
    a, b, c = (unique_name + s for s in (":a", ":b", ":c"))
    with locks["default"].lock_many([a, b], timeout=1) as outer:
        try:
            with locks["default"].lock_many([b, c], timeout=2) as inner:
                assert inner.tokens[b] == outer.tokens[b]
            assert not free_elsewhere(b), "leaving the inner set freed the outer set's name"
            assert free_elsewhere(c)
        except LockNotAcquired as exc:
            pytest.fail(f"the inner set waited for the outer set: {exc}")
    assert keys_left(unique_name) == []


@pytest.mark.parametrize("alias", ["default", "multi"])
def test_short_ttl_lost_midblock_then_reentry_raises(alias: str, unique_name: str) -> None:
    """lock(n, ttl=0.2); the TTL runs out mid-block and another caller takes n; re-entering
    must raise LockLost (never run the inner block with the old token while another holds n)."""
    with pytest.raises(LockLost), locks[alias].lock(unique_name, ttl=0.2, timeout=1) as outer:
        time.sleep(0.5)
        other = take_elsewhere(unique_name, alias)
        assert not isinstance(other[0], Exception), other
        try:
            with pytest.raises(LockLost), locks[alias].lock(unique_name, timeout=1):
                pytest.fail("re-entered a lost lease")
        finally:
            other[0].release()  # type: ignore[attr-defined]
        assert outer.lost
    assert keys_left(unique_name, alias) == []


@pytest.mark.django_db(transaction=True)
def test_stale_outer_lease_write_refused_after_takeover(unique_name: str) -> None:
    """Outer block's lease (ttl 0.2) runs out; another holder claims the row; the outer
    block's write must be refused (StaleTokenError)."""
    product = Product.objects.create(name="z", stock=1)
    with pytest.raises(LockLost), locks["default"].lock(unique_name, ttl=0.2, timeout=1):
        product.refresh_from_db()
        time.sleep(0.5)
        other = take_elsewhere(unique_name)
        lease = other[0]
        Product.objects.claim(pk=product.pk, token=lease.token)  # type: ignore[attr-defined]
        lease.release()  # type: ignore[attr-defined]
        product.stock = 0
        with pytest.raises(StaleTokenError):
            product.save()
    assert Product.objects.get(pk=product.pk).stock == 1


def test_reentry_with_auto_extend_then_outer_raises(unique_name: str) -> None:
    """Outer ttl=0.3; inner re-entry asks auto_extend; the body raises: everything is
    released, and no renewal recreates the key afterwards."""
    with pytest.raises(ZeroDivisionError):  # noqa: SIM117
        with locks["default"].lock(unique_name, ttl=0.3, timeout=1):
            with locks["default"].lock(unique_name, ttl=0.3, timeout=1, auto_extend=True):
                time.sleep(0.5)
                1 / 0  # noqa: B018
    time.sleep(0.4)
    assert keys_left(unique_name) == []
    assert free_elsewhere(unique_name)


def test_inner_reentry_does_not_stop_the_outer_renewals(unique_name: str) -> None:
    """Outer auto_extend with ttl=0.3; an inner re-entry without auto_extend ends: the outer
    lease must go on being renewed (the inner block stops only renewals it started)."""
    with locks["default"].lock(unique_name, ttl=0.3, timeout=1, auto_extend=True) as outer:
        with locks["default"].lock(unique_name, ttl=0.3, timeout=1):
            pass
        with locks["default"].lock(unique_name, ttl=0.3, timeout=1, auto_extend=True):
            pass
        time.sleep(1.0)
        assert not outer.lost
        assert not free_elsewhere(unique_name)
    assert keys_left(unique_name) == []


@pytest.mark.django_db(transaction=True)
def test_lock_many_recipe_keeps_each_rows_own_token(unique_name: str) -> None:
    """docs/primitives.md's recipe: claim_many with each name's token, then row.save(). Each
    row must keep its own name's token: otherwise the thread's own lock(a) block around the
    set (re-entered by the set) cannot write row a after the set ends."""
    pa = Product.objects.create(name="a", stock=5)
    pb = Product.objects.create(name="b", stock=5)
    a, b = f"{unique_name}:{pa.pk}", f"{unique_name}:{pb.pk}"
    with locks["default"].lock(a, timeout=1) as outer:
        with locks["default"].lock_many([a, b], timeout=1) as held:
            rows = Product.objects.claim_many({pa.pk: held.tokens[a], pb.pk: held.tokens[b]})
            for row in rows.values():
                row.stock -= 1
                row.save()
        assert Product.objects.get(pk=pa.pk).fence_token == outer.token == held.tokens[a]
        row = Product.objects.claim(pk=pa.pk)  # still inside the lease of a
        row.stock -= 1
        row.save()
    assert Product.objects.get(pk=pa.pk).stock == 3


@pytest.mark.parametrize("alias", ["default", "multi"])
@pytest.mark.parametrize("auto_extend", [False, True])
def test_async_generator_closed_by_the_loops_shutdown_is_released(
    alias: str, auto_extend: bool, unique_name: str
) -> None:
    """An ``@alock`` generator still suspended (and referenced) when ``asyncio.run()`` ends
    is closed by the loop's shutdown (``shutdown_asyncgens``), together with the app's own
    connections of that loop: its name is free right after ``asyncio.run()`` returns, not one
    TTL (30 s) later."""
    kept: list[object] = []

    @locks[alias].alock("{0}", ttl=30, timeout=0, auto_extend=auto_extend)
    async def rows(name: str) -> AsyncIterator[int]:
        yield 1
        yield 2

    async def main() -> None:
        started = rows(unique_name)
        assert await started.__anext__() == 1
        kept.append(started)

    asyncio.run(main())
    assert free_elsewhere(unique_name, alias)
    kept.clear()


def test_generator_resumed_in_another_thread_keeps_its_lease(unique_name: str) -> None:
    """An ``@lock`` generator started in this thread and resumed in another (and back): its
    body's block re-enters its lease there (the same token), while this thread, its consumer,
    still finds the name busy."""
    seen: list[object] = []

    @locks["default"].lock("{0}", timeout=0)
    def rows(name: str) -> Iterator[int]:
        for i in range(3):
            with locks["default"].lock(name, timeout=0) as inner:
                seen.append(inner.token)
            yield i

    gen = rows(unique_name)
    assert next(gen) == 0
    other: list[object] = []
    thread = threading.Thread(target=lambda: other.append(next(gen)))
    thread.start()
    thread.join(10)
    assert other == [1]  # the body re-entered its lease in the other thread
    with pytest.raises(LockNotAcquired), locks["default"].lock(unique_name, timeout=0):
        pass  # still the generator's, not this thread's
    assert next(gen) == 2
    assert len(set(seen)) == 1
    gen.close()
    assert free_elsewhere(unique_name)


@pytest.mark.django_db(transaction=True)
def test_generator_resumed_in_another_thread_fences_its_writes(unique_name: str) -> None:
    """The generator's writes in the thread that resumed it carry its token (they were
    unfenced there: token 0)."""
    product = Product.objects.create(name=unique_name, stock=0)
    tokens: list[int] = []

    @locks["default"].lock("{0}", timeout=0)
    def rows(name: str) -> Iterator[None]:
        yield None
        Product.objects.filter(pk=product.pk).update(stock=1)
        yield None

    gen = rows(unique_name)
    next(gen)
    thread = threading.Thread(target=lambda: next(gen))
    thread.start()
    thread.join(10)
    product.refresh_from_db()
    tokens.append(product.fence_token)
    gen.close()
    assert product.stock == 1 and tokens[0] > 0


def test_async_generator_resumed_by_another_task_keeps_its_lease(unique_name: str) -> None:
    """The asyncio twin: resumed by another task, its body's ``alock`` re-enters its lease."""

    @locks["default"].alock("{0}", timeout=0)
    async def rows(name: str) -> AsyncIterator[int]:
        for i in range(2):
            async with locks["default"].alock(name, timeout=0):
                pass
            yield i

    async def main() -> list[int]:
        gen = rows(unique_name)
        first = await gen.__anext__()
        second = await asyncio.get_running_loop().create_task(gen.__anext__())
        await gen.aclose()
        return [first, second]

    assert asyncio.run(main()) == [0, 1]
    assert free_elsewhere(unique_name)
