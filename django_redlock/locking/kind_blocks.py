"""The blocks of the other lock kinds a :class:`~django_redlock.locking.manager.LockManager` makes:
semaphores and read-write locks (docs/primitives.md). Mixed into ``LockManager``; each block holds
one
lease from ``acquire(..., permits=N)`` or ``acquire(..., rw="read"/"write")``."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, TypedDict, Unpack, cast

from ..validation import UNSET, check_keywords, check_permits
from .block import AsyncLockBlock, BlockOptions, LockBlock

if TYPE_CHECKING:
    from .acquirer import Acquirer


class HoldOptions(TypedDict, total=False):
    """How a block of these kinds holds its lease (as for ``lock()``)."""

    #: renew the lease while the block runs (default False)
    auto_extend: bool
    #: stop renewing after this many seconds (default None: no limit)
    max_hold: float | None
    #: inside a transaction, release after it commits (default True)
    until_commit: bool


class AsyncHoldOptions(HoldOptions, total=False):
    #: ``"cancel"``: cancel the block's task when the lease is lost (with ``auto_extend``)
    on_lost: str | None


class KindBlocks:
    """``semaphore``/``asemaphore`` and ``read_lock``/``write_lock`` (and asyncio twins).

    A semaphore block takes a permit of its own each time. A read (write) block inside this
    thread's or task's read (write) block of the same name re-enters that lease; a write
    block under its own read lease, or a read block under its own write lease, raises
    ``LockError`` at once (it would wait for itself)."""

    def _itself(self) -> Acquirer:
        return cast("Acquirer", self)

    def semaphore(
        self,
        name: str,
        permits: int,
        ttl: float | None = None,
        timeout: float | None = UNSET,
        **options: Unpack[HoldOptions],
    ) -> LockBlock:
        """A context manager (``with``; also ``async with``) and decorator holding one of
        ``permits`` permits of ``name``: at most ``permits`` such leases are valid at once,
        each with its own fencing token; a dead holder's permit frees itself after its TTL."""
        return LockBlock(self._itself, name, _options(ttl, timeout, options, permits=permits))

    def asemaphore(
        self,
        name: str,
        permits: int,
        ttl: float | None = None,
        timeout: float | None = UNSET,
        **options: Unpack[AsyncHoldOptions],
    ) -> AsyncLockBlock:
        """Asyncio twin of :meth:`semaphore` (``async with`` and coroutine functions only)."""
        return AsyncLockBlock(self._itself, name, _options(ttl, timeout, options, permits=permits))

    def read_lock(
        self,
        name: str,
        ttl: float | None = None,
        timeout: float | None = UNSET,
        **options: Unpack[HoldOptions],
    ) -> LockBlock:
        """A context manager (``with``; also ``async with``) and decorator holding a read
        lease of the read-write lock ``name``: any number of readers at once, no writer; a
        writer that waits keeps new readers out."""
        return LockBlock(self._itself, name, _options(ttl, timeout, options, rw="read"))

    def write_lock(
        self,
        name: str,
        ttl: float | None = None,
        timeout: float | None = UNSET,
        **options: Unpack[HoldOptions],
    ) -> LockBlock:
        """A context manager (``with``; also ``async with``) and decorator holding the write
        lease of the read-write lock ``name``: no reader and no other writer meanwhile; its
        token is greater than every earlier read or write lease's."""
        return LockBlock(self._itself, name, _options(ttl, timeout, options, rw="write"))

    def aread_lock(
        self,
        name: str,
        ttl: float | None = None,
        timeout: float | None = UNSET,
        **options: Unpack[AsyncHoldOptions],
    ) -> AsyncLockBlock:
        """Asyncio twin of :meth:`read_lock`."""
        return AsyncLockBlock(self._itself, name, _options(ttl, timeout, options, rw="read"))

    def awrite_lock(
        self,
        name: str,
        ttl: float | None = None,
        timeout: float | None = UNSET,
        **options: Unpack[AsyncHoldOptions],
    ) -> AsyncLockBlock:
        """Asyncio twin of :meth:`write_lock`."""
        return AsyncLockBlock(self._itself, name, _options(ttl, timeout, options, rw="write"))


def _options(
    ttl: float | None,
    timeout: float | None,
    options: HoldOptions | AsyncHoldOptions,
    *,
    permits: int | None = None,
    rw: str | None = None,
) -> BlockOptions:
    """The block's options (checked here, before any network call)."""
    check_keywords(options, AsyncHoldOptions.__annotations__)
    if rw is None:
        check_permits(permits)  # a semaphore's: None is not a number of permits
    extra: dict[str, Any] = dict(options)
    return BlockOptions(
        ttl,
        timeout,
        extra.get("auto_extend", False),
        extra.get("max_hold"),
        rw is not None,  # a read (write) block re-enters this thread's read (write) lease
        extra.get("until_commit", True),
        extra.get("on_lost"),
        permits=permits,
        rw=rw,
    )
