"""Which lease guards a write, and acting on loss (docs/production.md): a lease from
``acquire()``/``aacquire()`` guards FencedModel writes in the thread or task that acquired it
until it is released; ``lease.check()`` raises once it is lost; ``alock(on_lost="cancel")``
cancels the block's task when the lease is lost."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from django_redlock import locks
from django_redlock.exceptions import LockLost
from django_redlock.locking import context
from django_redlock.locking.block import BlockOptions, LockBlock
from testproject.inventory.models import Product


@pytest.mark.django_db
def test_acquire_lease_guards_writes_until_released(unique_name: str) -> None:
    """After lease = acquire(), a save writes lease.token; after release, saves are plain."""
    product = Product.objects.create(name="m4", stock=10)
    lease = locks["default"].acquire(unique_name, timeout=0)
    assert context.current_token() == lease.token
    product.stock = 9
    product.save()
    assert Product.objects.get(pk=product.pk).fence_token == lease.token  # before the fix: 0
    lease.release()
    assert context.current_token() is None


def test_acquire_lease_is_active_only_where_it_was_acquired(unique_name: str) -> None:
    """Another thread does not see it; a release from another thread ends it here too."""
    lease = locks["default"].acquire(unique_name, timeout=0)
    seen: list[int | None] = []
    thread = threading.Thread(target=lambda: seen.append(context.current_token()))
    thread.start()
    thread.join()
    assert seen == [None] and context.current_token() == lease.token
    thread = threading.Thread(target=lease.release)
    thread.start()
    thread.join()
    assert context.current_token() is None


def test_aacquire_lease_is_active_in_its_task(unique_name: str) -> None:
    """aacquire() activates the lease in the awaiting task."""

    async def scenario() -> None:
        lease = await locks["default"].aacquire(unique_name, timeout=0)
        assert context.current_token() == lease.token
        await lease.arelease()
        assert context.current_token() is None

    asyncio.run(scenario())


def test_check_raises_once_the_lease_is_lost(unique_name: str) -> None:
    """check() passes while held, and raises LockLost after the lease was taken away."""
    manager = locks["default"]
    lease = manager.acquire(unique_name, ttl=5, timeout=0)
    lease.check()
    manager.force_release(unique_name)
    with pytest.raises(LockLost):
        lease.extend()
    with pytest.raises(LockLost):
        lease.check()
    expiring = manager.acquire(unique_name + ":short", ttl=0.05, timeout=0)
    time.sleep(0.1)
    with pytest.raises(LockLost):
        expiring.check()


def test_on_lost_cancel_cancels_the_block_and_raises_lock_lost(unique_name: str) -> None:
    """alock(auto_extend=True, on_lost="cancel"): a force-release makes the next renewal find
    the lease lost; the task running the block is cancelled and leaving it raises LockLost."""
    manager = locks["default"]
    reached: list[str] = []

    async def scenario() -> None:
        async with manager.alock(
            unique_name, ttl=0.3, timeout=0, auto_extend=True, on_lost="cancel"
        ):
            manager.force_release(unique_name)
            await asyncio.sleep(2)  # cancelled at the next renewal (~0.1 s)
            reached.append("after sleep")

    with pytest.raises(LockLost):
        asyncio.run(scenario())
    assert reached == []


def test_on_lost_is_checked() -> None:
    """on_lost takes None or "cancel", and only alock() can cancel a task."""
    with pytest.raises(ValueError, match="on_lost"):
        locks["default"].alock("x", on_lost="ignore")
    with pytest.raises(ValueError, match="alock"):
        LockBlock(lambda: locks["default"], "x", BlockOptions(auto_extend=True, on_lost="cancel"))


def test_leaving_a_block_keeps_leases_acquired_inside_it_active(unique_name: str) -> None:
    """pop() undoes only its own push: a lease acquired inside a block (or a request lock)
    still guards writes after the block ends, until it is released."""
    with locks["default"].lock(unique_name, timeout=0):
        inner = locks["default"].acquire(unique_name + ":inner", timeout=0)
    assert context.current_token() == inner.token
    token = context.push(inner)
    other = locks["default"].acquire(unique_name + ":other", timeout=0)
    context.pop(token)
    assert context.current_token() == other.token
    other.release()
    inner.release()
    assert context.current_token() is None


def test_leases_released_out_of_order_are_not_kept(unique_name: str) -> None:
    """Hand over hand (acquire the next lease, then release the one before): the context
    kept every released lease in its list of not-yet-indexed entries (memory and every token
    lookup growing without bound). Now what it keeps stays bounded (a few dozen entries at most
    until its list is rebuilt), and lookups still find the live lease."""
    import gc
    import weakref

    manager = locks["default"]
    previous = manager.acquire(f"{unique_name}:0", timeout=0)
    released: list[weakref.ref[object]] = []
    for i in range(1, 400):
        lease = manager.acquire(f"{unique_name}:{i}", timeout=0)
        previous.release()
        released.append(weakref.ref(previous))
        previous = lease
    gc.collect()
    frame = context._frame.get()
    assert frame is not None
    assert len(frame.fresh) < 40 and len(frame.stack) < 40
    assert sum(ref() is not None for ref in released) < 40  # 399 before: all of them
    assert context.active_with_token(previous.token) is previous
    assert context.current_token() == previous.token
    previous.release()
    assert context.current_token() is None
