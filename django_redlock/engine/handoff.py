"""Grants on their way to their holder (docs/algorithm.md, "Interrupted calls").

A signal handler that raises (Ctrl-C, a worker's soft time limit, a timeout decorator) can
interrupt an acquire after the nodes granted it and before its caller holds the lease: in the
steps after the grant, or as a function returns, when the lease is in no variable any
``except`` could reach. Left there, the name stays locked for its TTL (auto-extended: until
the process ends) with nobody to release it.

So a caller that must end up holding the lease (a lock block's ``__enter__``, ``acquire()``)
opens a :class:`Handoff` first, in its thread: every record granted while it is open is noted
on it, and so is every lease made of one. Interrupted before it holds its lease, the caller
gives back what was noted. Only the outermost caller opens one; the handoff is closed by a
plain attribute store (no call, so no interrupt can land between the close and the return).

An asyncio task opens its own (:func:`aopened`: ``aacquire()``, an ``async with`` block's
entry): tasks sharing a thread interleave at their awaits, so the thread's handoff would mix
their grants. It is held in a context variable (each task runs in a context of its own) and
closed by the same kind of store (``handoff.open = False``).
"""

from __future__ import annotations

import threading
from contextvars import ContextVar
from typing import Any

#: ``LOCAL.current``: the handoff open in this thread, if any (read it with :func:`current`).
LOCAL = threading.local()
#: the handoff of the asyncio task running, open while its ``open`` is True
TASK: ContextVar[Handoff | None] = ContextVar("django_redlock_handoff", default=None)


class Handoff:
    """What was granted in this thread since the handoff opened."""

    __slots__ = ("leases", "open", "records")

    def __init__(self) -> None:
        #: a task's handoff is closed by setting this False (a thread's: by dropping it)
        self.open = True
        #: the engine's records of the grants (``LeaseRecord``, noted as each is made)
        self.records: list[Any] = []
        #: the leases made of them (``Lease``, noted as each is made): giving one back stops
        #: its renewals too
        self.leases: list[Any] = []


def current() -> Handoff | None:
    """The handoff open in this thread, or in the asyncio task running; None (a dict lookup
    and a context variable read: every grant asks)."""
    found: Handoff | None = LOCAL.__dict__.get("current")
    if found is None:
        found = TASK.get()
        if found is not None and not found.open:
            return None
    return found


def opened() -> Handoff | None:
    """A new handoff, open in this thread; None when one is open already (its opener, an
    outer call, gives back what this call is granted)."""
    if current() is not None:
        return None
    handoff = LOCAL.current = Handoff()
    return handoff


def aopened() -> Handoff | None:
    """A new handoff, open in the asyncio task running; None when one is open already (in
    this task, or in this thread: an outer call gives back what this one is granted)."""
    if current() is not None:
        return None
    handoff = Handoff()
    TASK.set(handoff)
    return handoff
