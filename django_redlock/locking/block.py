"""The lock block: ``with lock(...)``, ``async with manager.alock(...)`` and ``@lock(...)``.

A block re-enters a lease of the same alias and name that is already active in this thread or
task (it does not wait for itself; only the outermost exit releases), and, inside a
transaction on the default database, releases after the commit (docs/production.md).
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypedDict, TypeVar, cast

from ..engine import handoff
from ..exceptions import LockError, LockNotAcquired
from ..validation import UNSET, check_max_hold
from . import collected, context, interrupted, ordering
from .entries import (
    Entered,
    cancel_on_loss,
    check_held,
    check_lost,
    raise_if_cancelled_by_loss,
    refuse_other_kind,
)
from .templates import CallTemplate
from .transactions import in_transaction, release_after_commit
from .wrapping import wrap_held

if TYPE_CHECKING:
    from .acquirer import Acquirer
    from .lease import Lease

F = TypeVar("F", bound=Callable[..., Any])
ON_LOST_CHOICES = (None, "cancel")
ON_BUSY_CHOICES = ("raise", "skip")
#: a ``min_hold`` with less than this left releases at once
MIN_HOLD_GRANULARITY = 0.1


def min_hold_left(min_hold: float | None, started: float) -> float:
    """Seconds a ``min_hold`` keeps a name taken after a run that started at ``started``
    (``time.monotonic()``); 0.0 when less than :data:`MIN_HOLD_GRANULARITY` is left."""
    left = (min_hold or 0.0) - (time.monotonic() - started)
    return left if left >= MIN_HOLD_GRANULARITY else 0.0


logger = logging.getLogger("django_redlock")  # docs/index.md: one logger name


class BlockKeywords(TypedDict, total=False):
    """The keyword options of ``lock()`` (see :class:`BlockOptions`)."""

    auto_extend: bool
    max_hold: float | None
    reentrant: bool
    until_commit: bool
    on_busy: str
    min_hold: float | None


class AsyncBlockKeywords(BlockKeywords, total=False):
    """The keyword options of ``alock()``: ``lock()``'s and ``on_lost``."""

    on_lost: str | None


def block_options(
    what: str, ttl: float | None, timeout: float | None, options: Mapping[str, Any], *, aio: bool
) -> BlockOptions:
    """The options of a ``lock()`` (``aio``: ``alock()``) call ``what``; an unknown keyword is
    a ``TypeError`` naming the call, as Python's own would."""
    allowed = AsyncBlockKeywords.__optional_keys__ if aio else BlockKeywords.__optional_keys__
    for keyword in options:
        if keyword not in allowed:
            raise TypeError(f"{what}() got an unexpected keyword argument {keyword!r}")
    return BlockOptions(ttl, timeout, **options)


@dataclass(frozen=True)
class BlockOptions:
    """How a block acquires and lets go of its lease (checked when the block is made)."""

    ttl: float | None = None
    timeout: float | None = UNSET
    auto_extend: bool = False
    max_hold: float | None = None
    #: re-enter a lease of the same name already active in this thread or task
    reentrant: bool = True
    #: inside a transaction, release after it commits (at once on rollback)
    until_commit: bool = True
    #: ``"cancel"``: cancel the task running an ``alock()`` block when the lease is lost
    on_lost: str | None = None
    #: decorators only: ``"skip"`` returns None without calling the function when busy
    on_busy: str = "raise"
    #: keep the name taken this many seconds after the block started when it ends without an
    #: exception (outside a transaction), so duplicates of one run are skipped, not run again
    min_hold: float | None = None
    #: a semaphore's number of permits (the block holds one); None: a lock
    permits: int | None = None
    #: "read" or "write": a lease of a read-write lock; None: a lock
    rw: str | None = None

    def __post_init__(self) -> None:
        for flag in ("auto_extend", "reentrant", "until_commit"):
            if not isinstance(getattr(self, flag), bool):
                raise TypeError(f"{flag} must be True or False, not {getattr(self, flag)!r}.")
        if self.on_lost not in ON_LOST_CHOICES:
            raise ValueError(f"on_lost must be None or 'cancel', not {self.on_lost!r}.")
        if self.on_busy not in ON_BUSY_CHOICES:
            raise ValueError(f"on_busy must be 'raise' or 'skip', not {self.on_busy!r}.")
        if self.on_lost is not None and not self.auto_extend:
            raise ValueError(
                "on_lost='cancel' acts when a renewal finds the lease lost: it needs "
                "auto_extend=True (without renewals, check lease.validity or call "
                "lease.check() instead)."
            )
        check_max_hold(self.min_hold, "min_hold")
        if self.on_busy == "skip" and self.timeout is UNSET:
            object.__setattr__(self, "timeout", 0)  # skipping a busy name: one attempt

    def acquire_kwargs(self) -> dict[str, Any]:
        return {
            "ttl": self.ttl,
            "timeout": self.timeout,
            "auto_extend": self.auto_extend,
            "max_hold": self.max_hold,
            "permits": self.permits,
            "rw": self.rw,
        }


class LockBlock:
    """Holds one lock for a ``with`` (or ``async with``) block, or around each call of the
    function it decorates (sync or coroutine function).

    As a decorator, ``name`` is a template filled from the call's arguments bound to the
    function's signature (``"report:{0}"``, ``"user:{user_id}"``; see
    :mod:`django_redlock.locking.templates`), and ``on_busy="skip"`` makes a call whose name is
    busy return None without running the function.
    """

    def __init__(
        self, get_manager: Callable[[], Acquirer], name: str, options: BlockOptions
    ) -> None:
        if not isinstance(name, str):
            raise TypeError(f"Lock name must be a str, not {type(name).__name__}.")
        if options.on_lost is not None and not isinstance(self, AsyncLockBlock):
            raise ValueError("on_lost='cancel' cancels an asyncio task: use it with alock().")
        self._get_manager = get_manager
        self._name = name
        self._options = options
        self._entries: list[Entered] = []
        #: made by a decorator for one call (``on_busy="skip"`` is allowed)
        self._decorating = False
        #: the template the name was filled from (the lock-order checker's shape), or None
        self.order_template: str | None = None

    def __repr__(self) -> str:
        return f"<{type(self).__name__} name={self._name!r}>"

    # -- entering and leaving (blocking and asyncio share everything but the call) ----------
    def __enter__(self) -> Lease:
        self._check_not_skipping()
        manager = self._get_manager()
        held = self._reentrant_lease(manager)
        if held is not None:
            if self._extends(held):
                held.extend(ttl=self._options.ttl)
            return self._entered(held, reentered=True)
        if manager.check_order and self.order_template is not None:
            ordering.expect(self._name, self.order_template)
        # From here until this returns, an interrupt (a signal handler that raises) gives the
        # grant back: after it returns, the with statement calls __exit__ whatever happens.
        return interrupted.handed(
            lambda: self._entered(manager.acquire(self._name, **self._options.acquire_kwargs())),
            interrupted.engine_finder(manager),
            self._unenter,
        )

    def __exit__(self, *exc_info: object) -> None:
        entry = self._entries[-1]  # no call: an interrupt cannot land between these two
        del self._entries[-1]
        try:
            if not self._kept(entry, exc_info[0]):
                # a generator inherited over a fork, closed in the child: the lease is
                # the parent's, nothing is sent (its release would raise LockError)
                if exc_info[0] is GeneratorExit and entry.lease.foreign:
                    return
                if collected.in_collection():  # an abandoned generator's block, anywhere
                    collected.release_elsewhere(entry.lease)
                    return
                check_held(entry.lease, entry.lease.release(), exc_info[0])
            elif entry.hold_for:
                entry.lease.extend(ttl=entry.hold_for)
        except LockError:  # what the exit means to say (lost, not held, unavailable)
            raise
        except BaseException:  # an interrupt (a signal handler raised) on the way out
            _left_interrupted(entry)
            raise

    async def __aenter__(self) -> Lease:
        self._check_not_skipping()
        manager = self._get_manager()
        held = self._reentrant_lease(manager)
        if held is not None:
            if self._extends(held):
                await held.aextend(ttl=self._options.ttl)
            return self._entered(held, reentered=True)
        if manager.check_order and self.order_template is not None:
            ordering.expect(self._name, self.order_template)
        # as in __enter__: until this returns, an interrupt gives the grant back

        async def enter() -> Lease:
            return self._entered(
                await manager.aacquire(self._name, **self._options.acquire_kwargs())
            )

        return await interrupted.ahanded(enter, interrupted.engine_finder(manager), self._unenter)

    async def __aexit__(self, *exc_info: object) -> None:
        entry = self._entries.pop()
        if not self._kept(entry, exc_info[0]):
            held = await entry.lease.arelease()
            raise_if_cancelled_by_loss(entry, exc_info[1])
            check_held(entry.lease, held, exc_info[0])
            return
        raise_if_cancelled_by_loss(entry, exc_info[1])
        if entry.hold_for:
            await entry.lease.aextend(ttl=entry.hold_for)

    @property
    def entered(self) -> bool:
        """True while a ``with`` of this block is open (entered, not exited yet)."""
        return bool(self._entries)

    def _unenter(self, opened: handoff.Handoff | None) -> None:
        """Undo :meth:`_entered` for an entry of a lease noted on ``opened`` (an interrupted
        enter; None: an outer call's handoff, whose caller undoes its own)."""
        if opened is None:
            return
        leases = opened.leases
        if self._entries and any(self._entries[-1].lease is lease for lease in leases):
            entry = self._entries.pop()
            context.pop(entry.token)
            entry.lease.block_closed()

    def _reentrant_lease(self, manager: Acquirer) -> Lease | None:
        """The lease this block re-enters (this thread's or task's lease of the name, of the
        same kind), or None; ``LockError`` at once for a read-write lock whose other side this
        thread or task holds (it would wait for itself)."""
        options = self._options
        kind = options.rw or ("permit" if options.permits else "")
        refuse_other_kind(manager.alias, self._name, kind)
        if not options.reentrant:
            return None
        lease = cast("Lease | None", context.find(manager.alias, self._name, kind))
        if lease is not None:
            lease.check()  # a lost lease is not re-entered: the inner block would run unguarded
        return lease

    def _extends(self, lease: Lease) -> bool:
        """A re-entry asking a longer ``ttl`` than the lease has extends the lease to it."""
        ttl = self._options.ttl
        return ttl is not None and ttl > lease.ttl

    def _entered(self, lease: Lease, *, reentered: bool = False) -> Lease:
        # re-enterable, guards writes, while this block exists (see frames.Entry.within)
        if not reentered:
            context.bind(lease, self)  # its acquire()'s activation too
        entry = Entered(lease, reentered, context.push(lease, self))
        lease.block_opened()
        options = self._options
        if reentered and options.auto_extend:
            entry.renews = lease.keep_alive(options.max_hold)
        if options.on_lost == "cancel":
            entry.outer_on_lost = lease.on_lost
            entry.task = cancel_on_loss(lease)
        self._entries.append(entry)
        return lease

    def _kept(self, entry: Entered, exc_type: object) -> bool:
        """True when this exit does not release now: an inner (re-entered) block, a block
        that ends inside a transaction (released after the commit), or one whose ``min_hold``
        has time left (then ``entry.hold_for``: the lease is shortened to it, not released)."""
        lease = entry.lease
        lease.block_closed()
        entry.left = True
        context.pop(entry.token)
        if lease.open_blocks > 0:  # another block of this lease is still open: it lets go
            if entry.renews is not None:
                entry.renews()
            check_lost(lease, exc_type)
            return True
        # the last open block of the lease (usually the outermost; a generator or an
        # ExitStack can end the outermost first) decides what happens to it
        if self._options.until_commit and in_transaction():
            context.deactivate(lease)  # guards no writes after its block ...
            pending = lease.commit_pending
            if pending is None or not pending():
                pending = release_after_commit(lease, self._options.max_hold)
            context.push_findable(lease, pending)  # ... but this transaction re-enters it
            check_lost(lease, exc_type)
            return True
        left = min_hold_left(self._options.min_hold, entry.started)
        if exc_type is None and left:
            context.deactivate(entry.lease)
            entry.lease.stop_auto_extend()
            entry.hold_for = left
            return True
        return False

    # -- decorator -------------------------------------------------------------------------
    def __call__(self, func: F) -> F:
        if isinstance(func, classmethod | staticmethod):
            kind = type(func).__name__
            raise TypeError(
                f"lock({self._name!r}) cannot decorate a {kind} object: put @{kind} above "
                f"@lock (so @lock wraps the function itself), e.g. @{kind} then @lock(...) "
                "then def ..."
            )
        template = CallTemplate(self._name, func)  # a field the function lacks fails here
        calls = _Calls(
            self, template, getattr(func, "__qualname__", repr(func)), self._options.on_busy
        )
        return wrap_held(
            func,
            calls.entered,
            calls.aentered,
            lambda: self._sync_allowed(f"decorate {calls.where!r}"),
        )

    def _check_not_skipping(self) -> None:
        if self._options.on_busy == "skip" and not self._decorating:
            raise ValueError(
                f"on_busy='skip' works when lock({self._name!r}) decorates a function; a "
                "`with` block cannot be skipped. Catch LockNotAcquired around it instead."
            )

    def _sync_allowed(self, what: str) -> None:
        """Blocking use is allowed (see :class:`AsyncLockBlock`)."""


class AsyncLockBlock(LockBlock):
    """What ``alock()`` returns: the same block for ``async with`` and coroutine functions
    only, so blocking use inside async code fails loudly instead of stalling the event loop."""

    def __enter__(self) -> Lease:
        self._sync_allowed("enter it with a plain `with`")
        raise AssertionError("unreachable")  # pragma: no cover

    def _sync_allowed(self, what: str) -> None:
        raise TypeError(
            f"alock({self._name!r}) cannot {what}: it is for `async with` and coroutine "
            "functions. Use lock() in synchronous code."
        )


@dataclass(frozen=True)
class _Calls:
    """What a decorated function needs per call: a block for the filled name, and the
    ``on_busy="skip"`` outcome."""

    decorator: LockBlock
    template: CallTemplate
    where: str
    on_busy: str

    def block(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> LockBlock:
        decorator = self.decorator
        block = type(decorator)(
            decorator._get_manager, self.template.fill(args, kwargs), decorator._options
        )
        block._decorating = True
        block.order_template = self.template.template
        return block

    def entered(
        self, stack: contextlib.ExitStack[Any], args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> bool:
        """Enter this call's block on ``stack``; False for a busy name that is skipped."""
        block = self.block(args, kwargs)
        try:
            stack.enter_context(block)
        except LockNotAcquired as exc:
            return self.skipped(block, exc)
        return True

    async def aentered(
        self,
        stack: contextlib.AsyncExitStack[Any],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
    ) -> bool:
        """Asyncio twin of :meth:`entered`."""
        block = self.block(args, kwargs)
        try:
            await stack.enter_async_context(block)
        except LockNotAcquired as exc:
            return self.skipped(block, exc)
        return True

    def skipped(self, block: LockBlock, exc: LockNotAcquired) -> bool:
        """A busy name: re-raised, or with ``on_busy="skip"`` logged at INFO (``lock_failed``
        was sent) and False returned."""
        if self.on_busy != "skip":
            raise exc
        left = "" if exc.retry_after is None else f" (its holder has {exc.retry_after:.1f} s left)"
        logger.info(
            "Skipped %s(): lock %r (alias %r) is busy%s",
            self.where,
            block._name,
            block._get_manager().alias,
            left,
        )
        return False


def _left_interrupted(entry: Entered) -> None:
    """A block's exit was interrupted (a signal handler raised in it): the lease is released
    (in the background if need be) unless another block of it is still open or its
    transaction's commit releases it, as the exit would have done."""
    lease = entry.lease
    if not entry.left:
        lease.block_closed()
        entry.left = True
        with contextlib.suppress(Exception):
            context.pop(entry.token)
    if lease.open_blocks <= 0 and not lease.released and lease.commit_pending is None:
        lease.release_interrupted()
