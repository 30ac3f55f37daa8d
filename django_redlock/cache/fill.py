"""``get_or_set()`` and its asyncio twin: one process computes a missing value, the others
wait for it.

The key's lock is a read-write lock named by :func:`.arguments.lock_name`. The caller that
takes its write lease (one attempt, no wait) computes and stores; the others wait for a read
lease, which the writer's release grants to every waiting reader at once (docs/primitives.md,
"Wake-ups"), so N waiters cost one hand-off, not N. A waiter that then still finds no value
(the computing caller raised, or lost its lease without storing) waits for the write lease
itself, and the first to get it computes.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Awaitable, Callable, Generator, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from enum import Enum
from typing import Any, TypeVar

from asgiref.sync import sync_to_async

from ..exceptions import LockError, LockNotAcquired, NodesUnavailable
from ..locking import context
from ..locking.lease import Lease
from ..locking.manager import LockManager
from ..locking.registry import locks
from .arguments import (
    Lifetimes,
    cache_backend,
    check_compute,
    check_key,
    is_async_callable,
    lifetimes,
    lock_name,
)
from .stores import FencedStore, Found, store_for

# docs/index.md: one logger name (records carry .module)
logger = logging.getLogger("django_redlock")

T = TypeVar("T")

#: The (lock alias, lock name) of each fill whose compute runs in this context.
_COMPUTING: ContextVar[frozenset[tuple[str, str]]] = ContextVar(
    "django_redlock_cache_computing", default=frozenset()
)


def get_or_set(
    key: str,
    compute: Callable[[], T],
    timeout: float | None,
    *,
    cache: str = "default",
    using: str = "default",
    stale: float | None = None,
) -> T:
    """The value of ``key`` in cache ``cache``; on a miss, ``compute()``'s, computed by one
    process at a time under a lease of the ``REDLOCK`` alias ``using`` and stored for
    ``timeout`` seconds (None: forever) unless a newer lease stored one meanwhile.

    ``stale=S``: for S seconds past ``timeout`` the old value is still returned at once
    while one caller (the first to ask) computes its successor; past ``timeout + S`` it is a
    miss. Waiters wait up to the alias's ``TIMEOUT`` (``LockNotAcquired`` after that).
    """
    check_compute(compute, asyncio=False)
    fill = _Fill.of(key, timeout, cache, using, stale)
    plan, outcome = _fill_plan(fill), _Outcome()
    while (step := outcome.next_step(plan)) is not None:
        try:  # the plan decides what an exception means (a busy lock, a failed compute...)
            outcome.reply, outcome.error = _carry_out(fill, compute, *step), None
        except BaseException as exc:
            outcome.error = exc
    return outcome.value  # type: ignore[no-any-return]


async def aget_or_set(
    key: str,
    compute: Callable[[], Awaitable[T]] | Callable[[], T],
    timeout: float | None,
    *,
    cache: str = "default",
    using: str = "default",
    stale: float | None = None,
) -> T:
    """Asyncio twin of :func:`get_or_set`: ``compute`` may be a coroutine function (awaited)
    or a plain function (run in a worker thread by ``sync_to_async``, so the loop keeps
    renewing the lease while it blocks; an awaitable it returns is awaited); the cache's Redis
    calls run in a worker thread, the lock's on the loop."""
    check_compute(compute, asyncio=True)
    fill = _Fill.of(key, timeout, cache, using, stale)  # no I/O: checks and lookups
    plan, outcome = _fill_plan(fill), _Outcome()
    while (step := outcome.next_step(plan)) is not None:
        try:  # a cancellation too: the plan releases the lease, then it goes on
            outcome.reply, outcome.error = await _acarry_out(fill, compute, *step), None
        except BaseException as exc:
            outcome.error = exc
    return outcome.value  # type: ignore[no-any-return]


class Step(Enum):
    """What :func:`_fill_plan` asks its driver to do (the argument: see each driver)."""

    READ = "read"  # the key's value, or None
    TRY_WRITE = "try_write"  # the write lease, one attempt (LockNotAcquired when busy)
    WAIT_READ = "wait_read"  # wait for a read lease (the writer's release), and let it go
    WRITE = "write"  # wait for the write lease
    COMPUTE = "compute"  # the value, computed
    STORE = "store"  # arg (value, lease): store the value fenced by the lease
    RELEASE = "release"  # arg lease: release it


class _Outcome:
    """A driver's side of :func:`_fill_plan`: the last step's reply or exception, and the
    plan's value once it returned."""

    __slots__ = ("error", "reply", "value")

    def __init__(self) -> None:
        self.reply: Any = None
        self.error: BaseException | None = None
        self.value: Any = None

    def next_step(self, plan: Generator[tuple[Step, Any], Any, Any]) -> tuple[Step, Any] | None:
        """The plan's next step, given the last one's reply or exception; None once it
        returned (its value in :attr:`value`; an exception it raises goes through)."""
        try:
            if self.error is not None:
                error, self.error = self.error, None
                return plan.throw(error)
            return plan.send(self.reply)
        except StopIteration as done:
            self.value = done.value
            return None


def _fill_plan(fill: _Fill) -> Generator[tuple[Step, Any], Any, Any]:
    """One ``get_or_set``, written once without I/O: yields each step, gets its result (or
    its exception thrown in), returns the value."""
    found = yield Step.READ, None
    if found is not None and not found.stale:
        return found.value
    fill.check_not_own()
    try:
        lease = yield Step.TRY_WRITE, None
    except LockNotAcquired:
        lease = None
    except NodesUnavailable as exc:
        lease = fill.serve_stale(exc, found is not None)
    if lease is None:
        if found is not None:
            return found.value  # stale; another caller refreshes it
        yield Step.WAIT_READ, None  # woken by the writer's release
        found = yield Step.READ, None
        if found is not None:
            return found.value
        lease = yield Step.WRITE, None
    try:
        found = yield Step.READ, None  # a fill may have ended between the miss and the lease
        if found is not None and not found.stale:
            return found.value
        with fill.computing():
            value = yield Step.COMPUTE, None
        yield Step.STORE, (value, lease)
        return value
    finally:
        yield Step.RELEASE, lease


def _carry_out(fill: _Fill, compute: Callable[[], Any], step: Step, arg: Any) -> Any:
    """The blocking driver's step."""
    manager, name = fill.manager, fill.name
    if step is Step.READ:
        return fill.read()
    if step is Step.TRY_WRITE:
        return manager.acquire(name, rw="write", timeout=0, auto_extend=True)
    if step is Step.WAIT_READ:
        return manager.acquire(name, rw="read").release()
    if step is Step.WRITE:
        return manager.acquire(name, rw="write", auto_extend=True)
    if step is Step.COMPUTE:
        return compute()
    if step is Step.STORE:
        return fill.write(*arg)
    return arg.release()


async def _acarry_out(fill: _Fill, compute: Callable[[], Any], step: Step, arg: Any) -> Any:
    """The asyncio driver's step: the lock's calls on the loop, the cache's in a thread."""
    manager, name = fill.manager, fill.name
    if step is Step.READ:
        return await sync_to_async(fill.read, thread_sensitive=False)()
    if step is Step.TRY_WRITE:
        return await manager.aacquire(name, rw="write", timeout=0, auto_extend=True)
    if step is Step.WAIT_READ:
        return await (await manager.aacquire(name, rw="read")).arelease()
    if step is Step.WRITE:
        return await manager.aacquire(name, rw="write", auto_extend=True)
    if step is Step.COMPUTE:
        return await _acompute(compute)
    if step is Step.STORE:
        return await sync_to_async(fill.write, thread_sensitive=False)(*arg)
    return await arg.arelease()


async def _acompute(compute: Callable[[], Any]) -> Any:
    """``compute()``'s value: a coroutine function is awaited on the loop; a plain function
    runs in a worker thread (Django's thread-sensitive one, where its ORM calls belong), so a
    blocking compute does not stop the loop from renewing the write lease."""
    if is_async_callable(compute):
        value = compute()
    else:
        value = await sync_to_async(compute, thread_sensitive=True)()
    if inspect.isawaitable(value):
        value = await value
    return value


class _Fill:
    """One call's key, lock and store (built after every argument was checked)."""

    def __init__(
        self,
        store: FencedStore,
        manager: LockManager,
        full_key: str,
        name: str,
        times: Lifetimes,
    ) -> None:
        self.store = store
        self.manager = manager
        self.full_key = full_key
        self.name = name
        self.times = times

    @classmethod
    def of(cls, key: Any, timeout: Any, cache: Any, using: Any, stale: Any) -> _Fill:
        """The checked arguments; raises before anything is read or written."""
        check_key(key)
        backend = cache_backend(cache)
        times = lifetimes(timeout, stale, backend)
        store = store_for(cache, backend)
        manager = locks[using]
        full_key = store.full_key(key)
        return cls(store, manager, full_key, lock_name(cache, full_key), times)

    def read(self) -> Found | None:
        return self.store.read(self.full_key, self.times.grace_ms)

    def write(self, value: Any, lease: Lease) -> None:
        """Store ``value`` fenced by ``lease``'s token (a warning when a newer one is there)."""
        times = self.times
        if not self.store.write(self.full_key, value, lease.token, times.fresh_ms, times.grace_ms):
            logger.warning(
                "Cache key %r: the value computed under lease %d was not stored; a newer "
                "lease's value is there (this lease was lost while computing).",
                self.full_key,
                lease.token,
            )

    @contextmanager
    def computing(self) -> Iterator[None]:
        """Marks this key as being computed in this context (copied into a ``sync_to_async``
        thread running the compute, where the lease's own context is not seen)."""
        reset = _COMPUTING.set(_COMPUTING.get() | {(self.manager.alias, self.name)})
        try:
            yield
        finally:
            _COMPUTING.reset(reset)

    def check_not_own(self) -> None:
        """A compute that asks for its own key would wait for itself: refuse it at once."""
        alias = self.manager.alias
        if context.held(alias, self.name) or (alias, self.name) in _COMPUTING.get():
            raise LockError(
                f"get_or_set({self.full_key!r}) was called while this thread or task holds "
                "that key's lock (inside the compute of the same key?): it would wait for "
                "itself. Compute the value directly there."
            )

    def serve_stale(self, exc: NodesUnavailable, stale_in_hand: bool) -> Lease | None:
        """The lock's nodes cannot be reached for the write lease: None (no lease: serve the
        stale value in hand, with a warning; the refresh waits for the nodes), or ``exc``
        re-raised when there is none."""
        if not stale_in_hand:
            raise exc
        logger.warning(
            "Cache key %r: serving its stale value, not refreshed: the lock alias %r cannot "
            "be reached (%s).",
            self.full_key,
            self.manager.alias,
            exc,
        )
        return None
