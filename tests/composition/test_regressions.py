"""The counterexamples the composition machine found, each as a plain test (minimal steps).

Each test is named by a short id, which its docstring repeats and ``machine.KNOWN_OPEN`` uses:
a letter and a number (A1, B5, D3, ...) for a defect known before the machine ran, ``N<k>``
for one the machine found. A test of a defect still open is
``xfail(strict=True)``: it starts passing, and so failing the suite, once the fix lands.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
import redis
from asgiref.sync import sync_to_async
from django.db import transaction
from django.db.models import F

from django_redlock import locks
from django_redlock.exceptions import LockError, LockLost, LockNotAcquired
from django_redlock.locking import context
from testproject.inventory.models import Product
from tests.conftest import SESSION_ALIASES
from tests.support.attempts import free_elsewhere

ALIASES = ["default", "multi"]


def locked_rows(alias: str) -> Any:
    """An ``@lock`` generator function whose body reports the lease it finds for its name."""

    @locks[alias].lock("{0}", timeout=0)
    def rows(name: str) -> Iterator[Any]:
        for _ in range(3):
            yield context.find(alias, name)

    return rows


def hold_in_thread(alias: str, name: str, seconds: float) -> threading.Event:
    """Another thread takes ``name`` and releases it after ``seconds``; returns once it holds."""
    holding = threading.Event()

    def run() -> None:
        lease = locks[alias].acquire(name, ttl=30, timeout=0)
        holding.set()
        time.sleep(seconds)
        lease.release()

    threading.Thread(target=run, daemon=True).start()
    assert holding.wait(5)
    return holding


# -- defects known before the machine ran, fixed on main ----------------------------------------


@pytest.mark.parametrize("alias", ALIASES)
def test_a1_lock_many_of_one_name_holds_it_and_lets_it_go(alias: str, unique_name: str) -> None:
    """A1: ``lock_many([name])`` holds the one name and releases it at block exit (it used to
    raise TypeError after locking it, leaving the name locked for its TTL)."""
    with locks[alias].lock_many([unique_name], timeout=0) as held:
        assert list(held.leases) == [unique_name]
        assert not free_elsewhere(unique_name, alias)
    assert free_elsewhere(unique_name, alias)


@pytest.mark.parametrize("alias", ALIASES)
def test_lock_many_counts_a_repeated_name_once(alias: str, unique_name: str) -> None:
    """docs/production.md: ``lock_many([b, c, b])`` holds b and c (it used to raise ValueError)."""
    names = [f"{unique_name}:b", f"{unique_name}:c", f"{unique_name}:b"]
    with locks[alias].lock_many(names, timeout=0) as held:
        assert list(held.leases) == names[:2]


@pytest.mark.parametrize("alias", ALIASES)
def test_b8_lock_many_reenters_a_name_of_the_threads_open_block(
    alias: str, unique_name: str
) -> None:
    """B8: inside ``lock(a)``, ``lock_many([a])`` re-enters a's lease instead of waiting for
    itself, and leaving the set does not release the outer block's lease."""
    manager = locks[alias]
    with manager.lock(unique_name, timeout=0) as outer:
        with manager.lock_many([unique_name], timeout=0) as held:
            assert held.leases[unique_name] is outer
        assert not outer.released and not free_elsewhere(unique_name, alias)


@pytest.mark.parametrize("alias", ALIASES)
def test_b8_lock_reenters_a_name_of_the_threads_open_lock_many(
    alias: str, unique_name: str
) -> None:
    """B8: inside ``lock_many([c, b])``, ``lock(c)`` re-enters c's lease of the set."""
    manager = locks[alias]
    names = [f"{unique_name}:c", f"{unique_name}:b"]
    with (
        manager.lock_many(names, timeout=0) as held,
        manager.lock(names[0], timeout=0) as inner,
    ):
        assert inner is held.leases[names[0]]


@pytest.mark.parametrize("alias", ALIASES)
def test_b5_read_write_in_one_thread_never_wait_for_themselves(
    alias: str, unique_name: str
) -> None:
    """B5: a write block inside the thread's write block re-enters it; a read block inside it
    raises LockError at once (it used to be granted, or to wait for itself)."""
    manager = locks[alias]
    with manager.write_lock(unique_name, timeout=0) as writer:
        with manager.write_lock(unique_name, timeout=0) as again:
            assert again is writer
        with pytest.raises(LockError) as refused:
            manager.read_lock(unique_name, timeout=0).__enter__()
        assert not isinstance(refused.value, LockNotAcquired)


@pytest.mark.parametrize("alias", ALIASES)
def test_a2_a_locked_generator_holds_its_lease_while_iterated(alias: str, unique_name: str) -> None:
    """A2: the body of an ``@lock`` generator runs under its lease, held until it finishes;
    ``on_busy="skip"`` on a busy name yields nothing (it used to return None, not a
    generator)."""
    rows = locked_rows(alias)
    it = rows(unique_name)
    lease = next(it)
    assert lease is not None and not free_elsewhere(unique_name, alias)
    assert list(it) == [lease, lease]
    assert lease.released and free_elsewhere(unique_name, alias)

    @locks[alias].lock("{0}", on_busy="skip")
    def skipped(name: str) -> Iterator[int]:
        yield 1

    with locks[alias].lock(f"{unique_name}:busy", timeout=0):
        assert list(_in_thread(lambda: list(skipped(f"{unique_name}:busy")))) == []


def _in_thread(call: Any) -> Any:
    """``call()`` in another thread (another caller); its result."""
    result: list[Any] = []
    thread = threading.Thread(target=lambda: result.append(call()))
    thread.start()
    thread.join()
    return result[0]


@pytest.mark.parametrize("alias", ALIASES)
def test_a2_a_locked_async_generator_holds_its_lease(alias: str, unique_name: str) -> None:
    """A2: the body of an async ``@lock`` generator runs under its lease."""

    @locks[alias].lock("{0}", timeout=0)
    async def rows(name: str) -> Any:
        yield context.find(alias, name)

    async def consume() -> list[Any]:
        return [found async for found in rows(unique_name)]

    (found,) = asyncio.run(consume())
    assert found is not None and found.released


@pytest.mark.parametrize("alias", ALIASES)
def test_a3_asyncio_reentry_with_a_longer_ttl_extends_the_lease(
    alias: str, unique_name: str
) -> None:
    """A3: an inner ``alock`` of the same task asking ttl=30 extends a 0.3 s lease to it."""
    manager = locks[alias]

    async def scenario() -> float:
        async with (
            manager.alock(unique_name, ttl=0.3, timeout=0),
            manager.alock(unique_name, ttl=30, timeout=0) as inner,
        ):
            return inner.validity

    assert asyncio.run(scenario()) > 10


@pytest.mark.parametrize("alias", ALIASES)
def test_d1_on_busy_skip_makes_one_attempt(alias: str, unique_name: str) -> None:
    """D1: a job with ``on_busy="skip"`` (no timeout given) skips a busy name at once, even
    though its holder lets go a second later (it used to wait, then run)."""
    hold_in_thread(alias, unique_name, 1.0)

    @locks[alias].lock(unique_name, on_busy="skip")
    def job() -> str:
        return "ran"

    assert job() is None


# -- new defects (N1 a-c and N3 fixed on main by 31c92dd, D3 by 7876581) ------------------------


@pytest.mark.parametrize("alias", ALIASES)
def test_n1_closing_a_generator_does_not_release_the_callers_block(
    alias: str, unique_name: str
) -> None:
    """N1: after ``next(g)`` of an ``@lock`` generator, the caller's ``lock(name)`` block either
    waits (the generator is another holder) or holds the name for as long as it runs: closing
    the generator inside it must not release the name under the block."""
    rows = locked_rows(alias)
    it = rows(unique_name)
    next(it)
    try:
        with locks[alias].lock(unique_name, timeout=0) as outer:
            it.close()
            assert not outer.released
            assert not free_elsewhere(unique_name, alias)
    except LockNotAcquired:
        it.close()


@pytest.mark.parametrize("alias", ALIASES)
def test_n1_a_generator_started_in_a_block_never_runs_on_without_the_lock(
    alias: str, unique_name: str
) -> None:
    """N1: a generator started inside ``with lock(name)`` (it re-enters the block's lease)
    and resumed after the block ended either still holds the name or raises LockLost: its
    body never runs on silently without the lock."""
    rows = locked_rows(alias)
    with locks[alias].lock(unique_name, timeout=0):
        it = rows(unique_name)
        next(it)
    if free_elsewhere(unique_name, alias):
        with pytest.raises(LockLost):
            next(it)
    it.close()


@pytest.mark.parametrize("alias", ALIASES)
def test_n1_two_generators_of_one_name_do_not_share_a_lease(alias: str, unique_name: str) -> None:
    """N1: two ``@lock`` generators of one name iterated by one thread: the second is busy,
    or the name stays held while it is suspended after the first was closed."""
    rows = locked_rows(alias)
    first, second = rows(unique_name), rows(unique_name)
    next(first)
    try:
        next(second)
    except LockNotAcquired:
        first.close()
        return
    first.close()
    assert not free_elsewhere(unique_name, alias)
    second.close()


@pytest.mark.django_db(transaction=True)
def test_n1_a_suspended_generator_does_not_fence_its_callers_writes(unique_name: str) -> None:
    """N1: between two iterations of an ``@lock`` generator of another name, the caller's
    FencedModel writes inside its own block carry its own lease's token."""
    manager = locks["default"]
    product = Product.objects.create(name=unique_name, stock=1)
    rows = locked_rows("default")
    with manager.lock(f"{unique_name}:order", timeout=0) as own:
        it = rows(f"{unique_name}:export")
        next(it)
        Product.objects.filter(pk=product.pk).update(stock=F("stock") + 1)
        it.close()
    product.refresh_from_db()
    assert product.fence_token == own.token


@pytest.mark.django_db(transaction=True)
def test_n1_a_generator_fences_its_own_writes_and_takes_sends_and_throws(
    unique_name: str,
) -> None:
    """N1: while it runs, an ``@lock`` generator's writes carry its own token (also after it
    was suspended under a caller's block), and ``send()``/``throw()`` reach its body as with
    a plain generator."""
    manager = locks["default"]
    product = Product.objects.create(name=unique_name, stock=1)
    tokens: list[int] = []

    @manager.lock(f"{unique_name}:{{0}}", timeout=0)
    def writer(name: str) -> Iterator[Any]:
        lease = context.find("default", f"{unique_name}:{name}")
        tokens.append(lease.token)
        while True:
            try:
                got = yield lease
            except KeyError:
                got = "thrown"
            Product.objects.filter(pk=product.pk).update(name=f"{unique_name}:{got}")

    with manager.lock(f"{unique_name}:order", timeout=0):
        it = writer("export")
        next(it)
        it.send("sent")
        product.refresh_from_db()
        assert (product.name, product.fence_token) == (f"{unique_name}:sent", tokens[0])
        it.throw(KeyError("x"))
        product.refresh_from_db()
        assert (product.name, product.fence_token) == (f"{unique_name}:thrown", tokens[0])
        it.close()


@pytest.mark.django_db(transaction=True)
def test_n1_a_suspended_async_generator_does_not_fence_its_callers_writes(
    unique_name: str,
) -> None:
    """N1, asyncio: between iterations of an ``@alock`` async generator of another name, the
    task's own writes carry its own lease's token."""
    manager = locks["default"]
    product = Product.objects.create(name=unique_name, stock=1)

    @manager.alock(f"{unique_name}:{{0}}", timeout=0)
    async def rows(name: str) -> Any:
        for _ in range(3):
            yield name

    async def scenario() -> int:
        async with manager.alock(f"{unique_name}:order", timeout=0) as own:
            it = rows("export")
            await it.__anext__()
            await sync_to_async(
                lambda: Product.objects.filter(pk=product.pk).update(stock=F("stock") + 1),
                thread_sensitive=False,
            )()
            await it.aclose()
            return own.token

    token = asyncio.run(scenario())
    product.refresh_from_db()
    assert product.fence_token == token


@pytest.mark.django_db(transaction=True)
def test_n8_lock_many_re_entering_a_lease_that_fences_nothing_fences_its_claims(
    unique_name: str,
) -> None:
    """N8 (found by the machine once N1 d was fixed): ``lock_many([a])`` re-entering a lease of
    ``a`` whose own entry no longer fences (kept until the commit here; a suspended generator's
    when it was found, which its consumer no longer re-enters), with a bare lease of ``b``
    taken after it, saves a row claimed with a's token with a's token (it was saved with b's:
    the set did not activate the lease it re-entered)."""
    manager = locks["default"]
    a, b = f"{unique_name}:a", f"{unique_name}:b"
    product = Product.objects.create(name=unique_name, stock=1)
    with transaction.atomic():
        with manager.lock(a, timeout=0, until_commit=True) as kept:
            pass  # kept until the commit: findable by this transaction, guards no write
        bare = manager.acquire(b, timeout=0)
        try:
            with manager.lock_many([a], timeout=0) as held:
                lease = held.leases[a]
                assert lease is kept
                for row in Product.objects.claim_many({product.pk: lease.token}).values():
                    row.stock += 1
                    row.save()
        finally:
            bare.release()
    product.refresh_from_db()
    assert product.fence_token == kept.token


@pytest.mark.parametrize("alias", ALIASES)
def test_n2_extend_to_a_shorter_ttl_keeps_an_auto_extended_lease(
    alias: str, unique_name: str
) -> None:
    """N2: ``extend(ttl=0.3)`` on a lease auto-extended with ttl=3 leaves it renewed (the
    watchdog used to sleep a third of the old TTL, 1 s, while the key expired after 0.3 s)."""
    with locks[alias].lock(unique_name, ttl=3, timeout=0, auto_extend=True) as lease:
        lease.extend(ttl=0.3)
        time.sleep(0.8)
        assert not lease.lost
        assert not free_elsewhere(unique_name, alias)


@pytest.mark.parametrize("alias", ALIASES)
@pytest.mark.parametrize("outer", ["write", "read"])
def test_n3_a_plain_lock_under_the_threads_own_read_write_lease_never_waits(
    alias: str, outer: str, unique_name: str
) -> None:
    """N3: ``lock(name)`` inside the thread's own ``write_lock``/``read_lock`` of that name
    re-enters it or raises LockError at once; it never waits for itself (LockNotAcquired)."""
    manager = locks[alias]
    block = manager.write_lock if outer == "write" else manager.read_lock
    with block(unique_name, timeout=0):
        try:
            with manager.lock(unique_name, timeout=0):
                pass
        except LockNotAcquired:
            pytest.fail("lock() waited for the thread's own read/write lease")
        except LockError:
            pass


@pytest.mark.parametrize("alias", ALIASES)
@pytest.mark.parametrize("inner", ["write", "read"])
def test_n3_a_read_write_lease_under_the_threads_own_plain_lock_never_waits(
    alias: str, inner: str, unique_name: str
) -> None:
    """N3: ``write_lock``/``read_lock(name)`` inside the thread's own ``lock(name)`` raises
    LockError at once (or re-enters); it never waits for itself."""
    manager = locks[alias]
    block = manager.write_lock if inner == "write" else manager.read_lock
    with manager.lock(unique_name, timeout=0):
        try:
            with block(unique_name, timeout=0):
                pass
        except LockNotAcquired:
            pytest.fail("a read/write lease waited for the thread's own plain lock")
        except LockError:
            pass


def test_d3_a_woken_waiter_gets_the_validity_of_its_winning_attempt(
    redlock_alias: Any, session_nodes: Any, unique_name: str
) -> None:
    """D3 (single node): a waiter woken by a release 0.3 s into its first wait (RETRY_DELAY 1:
    that wait lasts 0.5-1 s) gets a lease whose validity counts from its winning attempt
    (about its 0.5 s TTL), not from before its wait (0.2 s)."""
    manager = redlock_alias(session_nodes.urls[:1], RETRY_DELAY=1.0)
    holder = manager.acquire(unique_name, ttl=5, timeout=0)
    threading.Timer(0.3, holder.release).start()
    lease = manager.acquire(unique_name, ttl=0.5, timeout=5)
    assert lease.validity > 0.35
    lease.release()


@pytest.mark.parametrize("alias", ALIASES)
def test_n4_lock_many_does_not_reenter_a_suspended_generators_lease(
    alias: str, unique_name: str
) -> None:
    """N4, then one holder: ``lock_many([n])`` used to re-enter the lease of a suspended ``@lock``
    generator (auto extended), and the generator closed inside the set left it renewed for
    ever. A suspended generator's lease is not its consumer's: the set is busy, the
    generator keeps its lease, and closing it releases the name."""
    manager = locks[alias]

    @manager.lock("{0}", ttl=0.5, timeout=0, auto_extend=True)
    def rows(name: str) -> Iterator[Any]:
        yield context.find(alias, name)
        yield None

    it = rows(unique_name)
    lease = next(it)
    with pytest.raises(LockNotAcquired), manager.lock_many([unique_name], timeout=0):
        pass
    assert not lease.released
    it.close()
    assert lease.released
    assert free_elsewhere(unique_name, alias)


@pytest.mark.parametrize("alias", ALIASES)
def test_a_suspended_generator_is_another_holder_for_its_consumer(
    alias: str, unique_name: str
) -> None:
    """One holder at a time (docs/jobs.md). While an ``@lock`` generator is suspended, its
    consumer's blocks and a second generator of the same name are busy; ``zip`` of two does
    not run both bodies; ``on_busy="skip"`` skips."""
    manager = locks[alias]
    rows = locked_rows(alias)

    @manager.lock("{0}", timeout=0, on_busy="skip")
    def skipping(name: str) -> Iterator[str]:
        yield "ran"

    first, second = rows(unique_name), rows(unique_name)
    assert next(first) is not None
    with pytest.raises(LockNotAcquired):
        next(second)
    with pytest.raises(LockNotAcquired), manager.lock(unique_name, timeout=0):
        pass
    assert list(skipping(unique_name)) == []
    first.close()
    assert list(skipping(unique_name)) == ["ran"]
    with pytest.raises(LockNotAcquired):
        list(zip(rows(unique_name), rows(unique_name), strict=True))
    assert free_elsewhere(unique_name, alias)


@pytest.mark.parametrize("alias", ALIASES)
def test_a_suspended_async_generator_is_another_holder_for_its_consumer(
    alias: str, unique_name: str
) -> None:
    """One holder, asyncio: the consumer task of a suspended ``@alock`` generator does not re-enter
    its lease."""
    manager = locks[alias]

    @manager.alock("{0}", timeout=0)
    async def rows(name: str) -> AsyncIterator[Any]:
        for _ in range(2):
            yield context.find(alias, name)

    async def scenario() -> None:
        first = rows(unique_name)
        assert await first.__anext__() is not None
        with pytest.raises(LockNotAcquired):
            async with manager.alock(unique_name, timeout=0):
                pass
        with pytest.raises(LockNotAcquired):
            await rows(unique_name).__anext__()
        await first.aclose()

    asyncio.run(scenario())
    assert free_elsewhere(unique_name, alias)


@pytest.mark.parametrize("alias", ALIASES)
def test_n2_aextend_to_a_shorter_ttl_keeps_an_alock_renewed(alias: str, unique_name: str) -> None:
    """N2, asyncio: the renewal task's pause is cut too when ``aextend`` shortens the TTL."""

    async def scenario() -> bool:
        async with locks[alias].alock(unique_name, ttl=3, timeout=0, auto_extend=True) as lease:
            await lease.aextend(ttl=0.3)
            await asyncio.sleep(0.8)
            return lease.lost

    assert asyncio.run(scenario()) is False


@pytest.mark.parametrize("alias", ALIASES)
def test_n5_the_inner_bound_ends_with_the_inner_block(alias: str, unique_name: str) -> None:
    """N5: once the inner (unbounded) block ends, the outer ``max_hold=0.3`` holds again: it
    passed meanwhile, so the renewals stop, the lease runs out and the outer exit says so."""
    manager = locks[alias]
    with pytest.raises(LockLost):  # noqa: SIM117
        with manager.lock(unique_name, ttl=0.4, timeout=0, auto_extend=True, max_hold=0.3):
            with manager.lock(unique_name, ttl=0.4, timeout=0, auto_extend=True):
                time.sleep(0.5)
            time.sleep(1.0)
    assert free_elsewhere(unique_name, alias)


@pytest.mark.parametrize("alias", ALIASES)
def test_n5_reentry_after_max_hold_passed_renews_again(alias: str, unique_name: str) -> None:
    """N5: a re-entry with ``auto_extend`` after the outer ``max_hold`` passed (the renewals
    only wait for the lease to run out) starts renewals afresh: the lease is not lost."""
    manager = locks[alias]
    with manager.lock(unique_name, ttl=0.6, timeout=0, auto_extend=True, max_hold=0.1):
        time.sleep(0.3)  # max_hold passed at the first renewal (0.2 s)
        with manager.lock(unique_name, ttl=0.6, timeout=0, auto_extend=True) as inner:
            time.sleep(1.0)
            assert not inner.lost
            assert not free_elsewhere(unique_name, alias)


@pytest.mark.parametrize("alias", ALIASES)
def test_n5_reentry_with_auto_extend_outlives_the_outer_max_hold(
    alias: str, unique_name: str
) -> None:
    """N5: an inner ``lock(n, auto_extend=True)`` (no max_hold) under an outer block renewed
    only for ``max_hold=0.3`` keeps the lease renewed until the inner block ends (the inner
    block reused the outer renewals, which stopped after 0.3 s: the lease ran out by 1.1 s).
    A TTL of 0.8 s leaves a renewal (every 0.27 s) half a second late on a loaded machine."""
    manager = locks[alias]
    with (
        manager.lock(unique_name, ttl=0.8, timeout=0, auto_extend=True, max_hold=0.3),
        manager.lock(unique_name, ttl=0.8, timeout=0, auto_extend=True) as inner,
    ):
        time.sleep(1.6)
        assert not inner.lost
        assert not free_elsewhere(unique_name, alias)


@pytest.mark.parametrize("alias", ALIASES)
def test_n6_a_block_whose_body_released_its_lease_exits_quietly(
    alias: str, unique_name: str
) -> None:
    """N6 (low): ``lease.release()`` inside its own ``lock()`` block (True: it was held) and
    then leaving the block raises nothing, as for ``lock_many`` after ``HeldLocks.release()``:
    nothing was lost (it raised LockLost "ran out or was taken while the block ran")."""
    manager = locks[alias]
    with manager.lock_many([f"{unique_name}:a", f"{unique_name}:b"], timeout=0) as held:
        assert held.release()
    with manager.lock(unique_name, timeout=0) as lease:
        assert lease.release()


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("alias", ALIASES)
def test_n7_lock_many_ending_in_a_transaction_reports_a_lost_lease(
    alias: str, unique_name: str
) -> None:
    """N7: a ``lock_many`` block whose lease ran out while it ran, ending inside
    ``transaction.atomic()``, raises LockLost at its exit, as ``lock()`` does there (it was
    kept for the commit silently, and the commit's release only logs a warning)."""
    with transaction.atomic(), pytest.raises(LockLost):  # noqa: SIM117
        with locks[alias].lock_many([unique_name], ttl=0.2, timeout=0):
            time.sleep(0.4)


# -- random-seed triage (kinds 1-5 of a loaded run) ------------------------------------------------


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("alias", ALIASES)
def test_n8_a_set_re_entering_a_generators_lease_guards_plain_writes_after_it_closes(
    alias: str, unique_name: str
) -> None:
    """N8, as the machine meets it (it used to call this an unguarded write): ``lock_many([c])``
    re-enters the lease of an open ``lock(c)`` block (a suspended generator's when it was
    found, which its consumer no longer re-enters), the block ends inside the set: the set's
    block still holds the lease (the last open block lets it go) and, as the innermost active
    lease, guards a plain ``update()``; leaving the set releases it."""
    product = Product.objects.create(name=unique_name, stock=0)
    outer = locks[alias].lock(unique_name, timeout=0)
    lease = outer.__enter__()
    with locks[alias].lock_many([unique_name], timeout=0) as held:
        assert held.leases[unique_name] is lease
        outer.__exit__(None, None, None)
        assert not lease.released
        assert context.current_lease() is lease
        assert Product.objects.filter(pk=product.pk).update(stock=F("stock") + 1) == 1
        product.refresh_from_db()
        assert product.fence_token == lease.token
    assert lease.released and context.current_lease() is None


@pytest.mark.parametrize("alias", ALIASES)
def test_n8_a_name_the_set_re_entered_is_the_innermost_lease_in_it(
    alias: str, unique_name: str
) -> None:
    """N8: inside ``lock_many([a, b])``, ``lock_many([a])`` makes a's lease the innermost one
    again (it guards the inner block's writes, as a re-entered ``lock(a)`` does); b's is again
    after it. The machine had kept b innermost (writes to b's row with a's smaller token)."""
    manager = locks[alias]
    a, b = f"{unique_name}:a", f"{unique_name}:b"
    with manager.lock_many([a, b], timeout=0) as outer:
        assert context.current_lease() is outer.leases[b]
        with manager.lock_many([a], timeout=0) as inner:
            assert inner.leases[a] is outer.leases[a]
            assert context.current_lease() is outer.leases[a]
        assert context.current_lease() is outer.leases[b]


@pytest.mark.parametrize("alias", ALIASES)
@pytest.mark.parametrize("outer", ["lock", "ended first"])
def test_n9_leaving_a_set_that_re_entered_a_lost_lease_raises_lock_lost(
    alias: str, outer: str, unique_name: str
) -> None:
    """N9: a ``lock_many`` block that re-entered a lease (an outer lock block's, open or ended
    inside the set; a suspended generator's when it was found, no longer re-entered) which ran
    out while the set ran raises LockLost at its exit, as a re-entered ``lock()`` block does
    (it ended quietly: the set only checked the names it released)."""
    manager = locks[alias]
    with pytest.raises(LockLost), manager.lock(unique_name, ttl=0.2, timeout=0):  # noqa: SIM117
        with pytest.raises(LockLost), manager.lock(unique_name, timeout=0):
            time.sleep(0.4)  # the reference: a re-entered lock() block
    if outer == "lock":
        with pytest.raises(LockLost), manager.lock(unique_name, ttl=0.2, timeout=0):  # noqa: SIM117
            with pytest.raises(LockLost), manager.lock_many([unique_name], timeout=0) as held:
                assert held.borrowed == {unique_name}
                time.sleep(0.4)
        return
    block = manager.lock(unique_name, ttl=0.2, timeout=0)
    lease = block.__enter__()
    with pytest.raises(LockLost), manager.lock_many([unique_name], timeout=0) as held:
        assert held.leases[unique_name] is lease
        block.__exit__(None, None, None)  # the outer block ends first, while still held
        time.sleep(0.4)


@pytest.mark.parametrize("alias", ALIASES)
@pytest.mark.parametrize("how", ["released", "extended shorter"])
def test_n10_the_readers_marker_ends_with_the_last_read_lease(
    alias: str, how: str, unique_name: str
) -> None:
    """N10: once the longest read lease (30 s) is released while a 0.2 s one is left (or the
    one lease, re-entered with ttl=30, is extended back to 0.2 s), the name's ``rwlock|readers``
    marker and the readers' set live as long as the read leases left, not 30 s: a plain
    ``acquire()`` of the name found it busy for 30 s after every read lease ran out, and the
    machine found the marker left with no lease behind it ("t3:cx:...:r is left for 29715 ms,
    but every lease of 'r' was released or ran out")."""
    manager = locks[alias]
    config = SESSION_ALIASES[alias]
    clients = [redis.Redis.from_url(url) for url in config["NODES"]]
    prefix = config["KEY_PREFIX"]
    keys = [f"{prefix}{unique_name}", f"{prefix}__readers__:{unique_name}"]

    def read_and_release() -> None:
        manager.acquire(unique_name, ttl=30, timeout=0, rw="read").release()

    try:
        with pytest.raises(LockLost), manager.read_lock(unique_name, ttl=0.2, timeout=0):
            if how == "released":
                other = threading.Thread(target=read_and_release)
                other.start()
                other.join()
            else:
                with manager.read_lock(unique_name, ttl=30, timeout=0) as lease:
                    lease.extend(ttl=0.2)
            time.sleep(0.4)  # every read lease ran out
            left = {(i, key): client.pttl(key) for i, client in enumerate(clients) for key in keys}
            assert all(pttl < 500 for pttl in left.values()), left
            assert free_elsewhere(unique_name, alias)
    finally:
        for client in clients:
            client.close()


@pytest.mark.parametrize("alias", ALIASES)
@pytest.mark.parametrize("borrowed_first", [True, False])
def test_n11_a_set_lets_go_of_a_re_entered_lease_whose_block_ended_inside_it(
    alias: str, borrowed_first: bool, unique_name: str
) -> None:
    """N11: ``lock_many([r, b])`` re-enters the lease of an open ``lock(b)`` block and takes r;
    the block ends inside the set (an ExitStack; a suspended generator was the first way, which
    its consumer no longer re-enters), so the set's exit lets go of both. It released them in
    one call with the owner of the first lease only: the other one (b's lease has its own owner)
    was refused, reported lost (LockLost at a quiet exit) and left on the nodes for its TTL (the
    machine: "LockNotAcquired although 'b' was free", "'r' is left for 4994 ms")."""
    manager = locks[alias]
    b, r = f"{unique_name}:b", f"{unique_name}:r"
    outer = manager.lock(b, ttl=5, timeout=0)
    lease = outer.__enter__()
    with manager.lock_many([b, r] if borrowed_first else [r, b], timeout=0) as held:
        assert held.leases[b] is lease
        outer.__exit__(None, None, None)  # the set is now the last open block of b's lease
        assert not lease.released
    assert lease.released and held.leases[r].released
    assert not lease.lost and not held.leases[r].lost
    assert free_elsewhere(b, alias) and free_elsewhere(r, alias)


@pytest.mark.parametrize("alias", ALIASES)
def test_n11_an_async_set_lets_go_of_a_re_entered_lease_whose_block_ended_inside_it(
    alias: str, unique_name: str
) -> None:
    """N11, asyncio: ``alock(b)`` ends inside ``alock_many([r, b])`` (an AsyncExitStack, a
    generator): the set's exit releases both leases, each with its own owner."""
    manager = locks[alias]
    b, r = f"{unique_name}:b", f"{unique_name}:r"

    async def scenario() -> None:
        outer = manager.alock(b, ttl=5, timeout=0)
        lease = await outer.__aenter__()
        many = manager.alock_many([r, b], timeout=0)
        held = await many.__aenter__()
        assert held.leases[b] is lease
        await outer.__aexit__(None, None, None)  # the outer block ends first
        assert not lease.released
        await many.__aexit__(None, None, None)  # no LockLost: both were held
        assert lease.released and not lease.lost and not held.leases[r].lost

    asyncio.run(scenario())
    assert free_elsewhere(b, alias) and free_elsewhere(r, alias)


@pytest.mark.parametrize("alias", ALIASES)
@pytest.mark.parametrize("how", ["lock", "lock_many"])
def test_n12_a_resumed_generator_finds_its_own_lease_not_its_consumers(
    alias: str, how: str, unique_name: str
) -> None:
    """N12: an ``@lock`` generator's short lease ran out while it was suspended; its consumer
    then locked the name itself (free again) and resumed the generator inside that block.
    The body found the consumer's lease as its own (the consumer's entry was activated
    later, so it counted as the innermost), and a block in the body re-entered it (the
    machine: "a generator's body now sees <the consumer's lease>, not its lease"). While a
    generator runs, its own leases are the innermost."""
    manager = locks[alias]

    @manager.lock("{0}", ttl=0.2, timeout=0)
    def rows(name: str) -> Iterator[Any]:
        for _ in range(3):
            yield context.find(alias, name)

    it = rows(unique_name)
    own = next(it)
    assert own is not None
    time.sleep(0.6)  # its lease runs out
    block = (
        manager.lock(unique_name, ttl=5, timeout=0)
        if how == "lock"
        else manager.lock_many([unique_name], ttl=5, timeout=0)
    )
    try:
        with block:
            try:
                found = next(it)
            except LockLost:  # it may report its lost lease instead: never the other one
                found = own
    finally:
        it.close()
    assert found is own, f"the body found {found}, not its lease {own}"


@pytest.mark.parametrize("alias", ALIASES)
@pytest.mark.parametrize("kind", ["read_lock", "write_lock"])
def test_a_suspended_generators_name_is_busy_for_its_consumer_as_another_kind(
    alias: str, kind: str, unique_name: str
) -> None:
    """The decision the composition machine checks (it had expected the one-name-one-kind
    ``LockError``): a suspended ``@lock`` generator's lease is another holder for its
    consumer, whatever kind the consumer asks for, so a read or write lease of its name is
    busy; once the generator is closed the name is free for it."""
    manager = locks[alias]

    @manager.lock("{0}", ttl=5, timeout=0)
    def rows(name: str) -> Iterator[int]:
        yield 1
        yield 2

    it = rows(unique_name)
    try:
        assert next(it) == 1
        with pytest.raises(LockNotAcquired), getattr(manager, kind)(unique_name, ttl=5, timeout=0):
            pass
    finally:
        it.close()
    with getattr(manager, kind)(unique_name, ttl=5, timeout=0):
        pass
