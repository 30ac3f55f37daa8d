"""What entering and leaving a lock block records and checks: the entry, the lease kind it
may take here, cancelling the task on loss, suspending a decorated generator's leases, and the
``LockLost`` of a block whose lease did not last."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Generator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..engine import KINDS
from ..exceptions import LockError, LockLost
from . import context
from .frames import current_owner

if TYPE_CHECKING:
    from .lease import Lease


@dataclass
class Entered:
    """One entry of a block: its lease, whether it re-entered an outer one, and the task an
    ``on_lost="cancel"`` block cancels when the lease is lost."""

    lease: Lease
    reentered: bool
    #: the context token of this entry (the lease guards writes and is re-enterable)
    token: object = None
    task: asyncio.Task[Any] | None = None
    started: float = field(default_factory=time.monotonic)
    #: seconds the lease is kept after the block (``min_hold``); 0: released at once
    hold_for: float = 0.0
    #: a re-entry's ``auto_extend``: undone when it ends (stops the renewals it started, or
    #: takes off the longer ``max_hold`` it put on the running ones)
    renews: Callable[[], None] | None = None
    #: a re-entry's ``on_lost`` callback to put back when it ends
    outer_on_lost: Callable[[], None] | None = None
    #: set once its exit counted it out of the lease's open blocks
    left: bool = False


def refuse_other_kind(alias: str, name: str, kind: str) -> None:
    """``LockError`` at once when this thread or task holds ``name`` as another kind (a lock,
    a semaphore's permit, a read or a write lease) than ``kind``: the call would wait for
    itself (a write lease wanted under its own read lease would also keep every other reader
    out as a waiting writer)."""
    held = {getattr(lease, "kind", "") for lease in context.held(alias, name)} - {kind}
    if not held:
        return
    other = sorted(held)[0]
    if {kind, other} == {"read", "write"}:
        change = "upgrade its read lease to a write" if kind == "write" else "downgrade its write"
        raise LockError(
            f"Cannot {change} lease of {name!r} (alias {alias!r}) in the thread or task that "
            f"holds it: it would wait for itself. Release the {other} lease first, or take the "
            "write lease from the start."
        )
    raise LockError(
        f"{name!r} (alias {alias!r}) is held by this thread or task as a "
        f"{KINDS[other].label}; taking it as a {KINDS[kind].label} would wait for itself. "
        "One name is one kind of lock: use another name."
    )


def cancel_on_loss(lease: Lease) -> asyncio.Task[Any] | None:
    """Make the loss of ``lease`` cancel the current task (from any thread)."""
    task = asyncio.current_task()
    if task is None:
        return None
    loop = task.get_loop()

    def cancel() -> None:
        loop.call_soon_threadsafe(task.cancel)

    lease.on_lost = cancel
    return task


def raise_if_cancelled_by_loss(entry: Entered, exc: object) -> None:
    """An ``on_lost="cancel"`` block whose task was cancelled because the lease was lost:
    leaving it raises ``LockLost`` instead of the cancellation."""
    entry.lease.on_lost = entry.outer_on_lost
    if entry.task is not None and isinstance(exc, asyncio.CancelledError) and entry.lease.lost:
        entry.task.uncancel()
        raise LockLost(entry.lease.name, "it was lost and the block was cancelled") from exc


def suspending(body: Generator[Any, Any, Any], suspensions: context.Suspensions) -> Any:
    """``yield from body``, with the leases the generator activated guarding none of its
    caller's writes while it is suspended at a ``yield`` (values sent and exceptions thrown
    in go to ``body``, as with ``yield from``)."""
    value: Any = None
    thrown: BaseException | None = None
    try:
        while True:
            try:
                item = body.send(value) if thrown is None else body.throw(thrown)
            except StopIteration as stop:
                return stop.value
            suspensions.suspend()
            try:
                value, thrown = (yield item), None
            except GeneratorExit:
                suspensions.resume()
                body.close()
                raise
            except BaseException as exc:  # thrown in by the caller: the body handles it
                value, thrown = None, exc
            suspensions.resume()
    finally:
        suspensions.end_visits()  # resumed elsewhere: what it lent that thread ends here


def check_lost(lease: Lease, exc_type: object) -> None:
    """Leaving a block whose lease is lost raises ``LockLost`` (unless the block raised)."""
    if exc_type is None:
        lease.check()


def check_held(lease: Lease, held: bool, exc_type: object) -> None:
    """Leaving a block whose lease was lost raises ``LockLost`` (unless the block raised; a
    lease the block's body released itself was not lost)."""
    if exc_type is None and not held and (lease.lost or lease.released_by != current_owner()):
        raise LockLost(lease.name, "its lease ran out or was taken while the block ran")
