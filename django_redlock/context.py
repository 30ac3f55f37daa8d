"""The active leases of the current thread or asyncio task (``contextvars``).

A lease is active from its acquisition (``acquire()``, ``aacquire()``, a lock block, a request
lock) until it is released, in the thread or task that acquired it. FencedModel reads the
innermost active lease's token; lock blocks and request locks find a lease they can re-enter.
A lease released elsewhere (another thread) stops counting at once: released leases are
skipped, whichever context still lists them.
"""

from __future__ import annotations

import asyncio
import contextvars
import threading
from collections.abc import Sequence
from typing import NamedTuple, Protocol


class TokenHolder(Protocol):
    """What the context needs from a lease."""

    @property
    def name(self) -> str: ...

    @property
    def token(self) -> int: ...


class _Entry(NamedTuple):
    lease: TokenHolder
    #: the task (asyncio) or thread that activated it: a child task inherits the stack (so
    #: its writes are fenced by its parent's lease) but may not re-enter the parent's lease
    owner: object
    #: entered by a lock block or a request lock (re-enterable), not by a bare ``acquire()``
    enterable: bool


_active: contextvars.ContextVar[tuple[_Entry, ...]] = contextvars.ContextVar(
    "django_redlock_active_leases", default=()
)


def _owner() -> object:
    # _get_running_loop() returns None outside a loop instead of raising (cheap on every acquire)
    loop = asyncio._get_running_loop()
    task = None if loop is None else asyncio.current_task(loop)
    return task if task is not None else threading.get_ident()


def push(lease: TokenHolder) -> TokenHolder:
    """Enter ``lease`` (a lock block, a request lock): the innermost active lease, and one
    that this thread or task may re-enter. Returns the token for :func:`pop` (the lease)."""
    _active.set((*_active.get(), _Entry(lease, _owner(), True)))
    return lease


def pop(token: TokenHolder) -> None:
    """Undo the last :func:`push` of this lease in this context, and only that entry (leases
    activated meanwhile stay active)."""
    stack = list(_active.get())
    for i in range(len(stack) - 1, -1, -1):
        if stack[i].lease is token and stack[i].enterable:
            del stack[i]
            _active.set(tuple(stack))
            return


def activate(lease: TokenHolder) -> None:
    """Make ``lease`` the innermost active lease until :func:`deactivate` (``acquire()``)."""
    _active.set((*_active.get(), _Entry(lease, _owner(), False)))


def activate_all(leases: Sequence[TokenHolder]) -> None:
    """:func:`activate` each of ``leases`` in order (the last is the innermost), at once."""
    owner = _owner()
    _active.set((*_active.get(), *(_Entry(lease, owner, False) for lease in leases)))


def deactivate(lease: TokenHolder) -> None:
    """Forget ``lease`` in this context (it was released here)."""
    stack = _active.get()
    if any(entry.lease is lease for entry in stack):
        _active.set(tuple(entry for entry in stack if entry.lease is not lease))


def clear() -> None:
    """Forget every active lease of this context (the leases stay held and valid). For test
    suites: a lease from ``acquire()`` that one test never released would otherwise keep
    guarding FencedModel writes in the next tests of the same thread."""
    _active.set(())


def _live(stack: tuple[_Entry, ...]) -> list[_Entry]:
    """Entries whose lease still counts: not released, and not the parent's after a fork."""
    return [
        entry
        for entry in stack
        if not getattr(entry.lease, "released", False)
        and not getattr(entry.lease, "foreign", False)
    ]


def current_lease() -> TokenHolder | None:
    """The innermost active lease (also one a parent task holds), or ``None``."""
    live = _live(_active.get())
    return live[-1].lease if live else None


def current_token() -> int | None:
    """The fencing token of the innermost active lease, or ``None``."""
    lease = current_lease()
    return None if lease is None else lease.token


def find(alias: str, name: str) -> TokenHolder | None:
    """The innermost lease of ``name`` on ``alias`` that this very thread or task entered with
    a lock block or a request lock (for re-entering it), or None. Bare ``acquire()`` leases
    are never re-entered."""
    owner = _owner()
    for entry in reversed(_live(_active.get())):
        lease = entry.lease
        if (
            entry.enterable
            and entry.owner == owner
            and lease.name == name
            and getattr(lease, "alias", None) == alias
        ):
            return lease
    return None
