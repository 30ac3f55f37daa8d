"""Reentrancy (docs/production.md): inside an active lease the same thread or task
entering
``lock()``/``alock()``/``@lock``/``@request_lock`` again for the same alias and name gets the
same lease without waiting; only the outermost exit releases. ``reentrant=False`` waits like
any other caller; other threads and tasks are never let in."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from django.http import HttpRequest, HttpResponse
from django.test import RequestFactory

from django_redlock import lock, locks
from django_redlock.decorators import request_lock
from django_redlock.exceptions import LockNotAcquired
from tests.support.attempts import free_elsewhere as free


def test_nested_block_reuses_the_lease(unique_name: str) -> None:
    """The inner block gets the outer lease at once (timeout=0 would fail otherwise); leaving
    it keeps the name held; leaving the outer block releases it."""
    with lock(unique_name, timeout=0) as outer:
        with lock(unique_name, timeout=0) as inner:
            assert inner is outer
        assert not outer.released and not free(unique_name)
    assert outer.released and free(unique_name)


def test_decorated_function_called_inside_the_block(unique_name: str) -> None:
    """A service decorated with @lock on the same name, called from inside the block."""

    @lock(unique_name + ":{0}", timeout=0)
    def service(part: str) -> int:
        return 7

    with lock(unique_name + ":a", timeout=0):
        assert service("a") == 7
        assert not free(unique_name + ":a")


def test_reentrant_false_waits_like_anyone(unique_name: str) -> None:
    """reentrant=False: the inner call is just another caller, so with timeout=0 it is busy."""
    with (
        lock(unique_name, timeout=0),
        pytest.raises(LockNotAcquired),
        lock(unique_name, timeout=0, reentrant=False),
    ):
        pass  # pragma: no cover


def test_other_aliases_and_threads_are_not_reentrant(unique_name: str) -> None:
    """Another alias is another lock; another thread is another caller."""
    with lock(unique_name, timeout=0):
        with lock(unique_name, using="multi", timeout=0) as other:
            assert other.alias == "multi"
        assert not free(unique_name)


def test_request_lock_view_calling_a_locked_service(unique_name: str, rf: RequestFactory) -> None:
    """A view under @request_lock("job:{pk}") calls a service that locks the same name: the
    service re-enters the request's lease (before the fix it waited out its own lock)."""
    key = unique_name.replace("{", "").replace("}", "")

    def service(pk: int) -> int:
        with locks["default"].lock(f"{key}:{pk}", timeout=0) as lease:
            return lease.token

    @request_lock(key + ":{pk}")
    def view(request: HttpRequest, pk: int) -> HttpResponse:
        return HttpResponse(str(service(pk) == request.lease.token))  # type: ignore[attr-defined]

    assert view(rf.post("/"), pk=3).content == b"True"
    assert free(f"{key}:3")


def test_async_nested_alock_reuses_the_lease_in_the_same_task(unique_name: str) -> None:
    """Nested alock() in one task re-enters; a second task waits."""

    async def scenario() -> None:
        manager = locks["default"]
        async with manager.alock(unique_name, timeout=0) as outer:
            async with manager.alock(unique_name, timeout=0) as inner:
                assert inner is outer

            async def other_task() -> None:
                async with manager.alock(unique_name, timeout=0):
                    pass

            with pytest.raises(LockNotAcquired):
                await asyncio.ensure_future(other_task())
        assert outer.released

    asyncio.run(scenario())


class _ExitInterrupted(Exception):
    """Raised as a lock block's ``__exit__`` starts, as a signal handler's exception would."""


class _ExitTrap:
    """A trace function that raises :class:`_ExitInterrupted` on the first call of a function
    named ``exit_name`` after :meth:`arm` (the first instruction of a block's exit)."""

    def __init__(self, exit_name: str) -> None:
        self.exit_name = exit_name
        self.armed = False

    def arm(self) -> None:
        import sys

        self.armed = True
        sys.settrace(self.trace)

    def trace(self, frame: Any, event: str, arg: Any) -> None:
        if event == "call" and self.armed and frame.f_code.co_name == self.exit_name:
            self.armed = False
            raise _ExitInterrupted


def test_a_block_whose_exit_was_interrupted_at_its_first_instruction_is_not_reentered(
    unique_name: str,
) -> None:
    """The one window the docs leave open: an interrupt on the very first instruction of a
    block's ``__exit__`` (emulated with a trace function) leaves its lease to its TTL. The
    block is gone, so its lease is not this thread's any more: a later block of the name
    waits for it and takes a lease of its own, and no write outside a block is fenced with
    it. (The thread used to re-enter that lease in every later block, then, once it had run
    out, raise LockLost in each of them for as long as it lived.)"""
    import sys

    from django_redlock.locking import context

    manager = locks["default"]
    trap = _ExitTrap("__exit__")
    try:
        with manager.lock(unique_name, ttl=0.5, timeout=1) as first:
            trap.arm()
    except _ExitInterrupted:
        pass
    finally:
        sys.settrace(None)
    assert not trap.armed  # the interrupt landed
    assert context.current_lease() is None  # nothing fences writes outside a block
    for _ in range(2):
        with manager.lock(unique_name, ttl=0.5, timeout=2) as later:
            assert later is not first and later.token > first.token


def test_an_async_block_whose_exit_was_interrupted_at_its_first_instruction_is_not_reentered(
    unique_name: str,
) -> None:
    """The same on an event loop: ``__aexit__`` interrupted as it starts."""
    import sys

    from django_redlock.locking import context

    manager = locks["default"]
    trap = _ExitTrap("__aexit__")

    async def run() -> None:
        try:
            async with manager.alock(unique_name, ttl=0.5, timeout=1) as first:
                trap.arm()
        except _ExitInterrupted:
            pass
        finally:
            sys.settrace(None)
        assert not trap.armed
        assert context.current_lease() is None
        async with manager.alock(unique_name, ttl=0.5, timeout=2) as later:
            assert later is not first and later.token > first.token

    asyncio.run(run())
