"""Giving back the grants of an acquire interrupted before its caller held the lease (a signal
handler that raised: Ctrl-C, a worker's soft time limit, a timeout decorator). What was granted
is on the caller's :class:`~django_redlock.engine.handoff.Handoff`."""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from ..engine import Engine, handoff

T = TypeVar("T")


def handed(
    take: Callable[[], T],
    engine_for: Callable[[str], Engine] | None,
    undo: Callable[[handoff.Handoff | None], None] | None = None,
) -> T:
    """``take()`` (an acquire) with a handoff open in this thread: interrupted before it
    returns, ``undo(handoff)`` runs (a block's entry; None when an outer call's handoff was
    open already), then what it was granted is given back (by the outer call, if any)."""
    opened = handoff.opened()
    try:
        taken = take()
    except BaseException:
        try:
            try:
                if undo is not None:
                    undo(opened)
            finally:
                give_back(opened, engine_for)
        finally:  # a second interrupt in the give-back must not leave the handoff open
            if opened is not None:
                handoff.LOCAL.current = None
        raise
    if opened is not None:
        handoff.LOCAL.current = None  # a store, not a call: no interrupt lands after it
    return taken


async def ahanded(
    take: Callable[[], Awaitable[T]],
    engine_for: Callable[[str], Engine] | None,
    undo: Callable[[handoff.Handoff | None], None] | None = None,
) -> T:
    """:func:`handed` for an asyncio task (its own handoff; given back in the background)."""
    opened = handoff.aopened()
    try:
        taken = await take()
    except BaseException:
        try:
            if undo is not None:
                undo(opened)
        finally:
            give_back_soon(opened, engine_for)
        raise
    if opened is not None:
        opened.open = False  # a store, not a call: no interrupt lands after it
    return taken


def give_back(opened: handoff.Handoff | None, engine_for: Callable[[str], Engine] | None) -> None:
    """Close ``opened`` and release what it noted: each lease (its renewals stop, its block
    entries go), then each record no lease was made of, on ``engine_for(record.name)``. A
    release that fails leaves that grant to expire at its TTL, as a broken connection would."""
    if opened is None:
        return
    handoff.LOCAL.current = None
    _release(opened, engine_for, background=False)


def give_back_soon(
    opened: handoff.Handoff | None, engine_for: Callable[[str], Engine] | None
) -> None:
    """:func:`give_back` for an asyncio task: closes ``opened`` and hands what it noted to
    the engine's background give-back (no blocking call on the event loop)."""
    if opened is None:
        return
    opened.open = False
    _release(opened, engine_for, background=True)


def _release(
    opened: handoff.Handoff, engine_for: Callable[[str], Engine] | None, *, background: bool
) -> None:
    made = {id(lease.record) for lease in opened.leases}
    for lease in opened.leases:
        with contextlib.suppress(Exception):
            if background:
                lease.release_interrupted()
            else:
                lease.release()
    for record in opened.records:
        if id(record) in made or record.released or engine_for is None:
            continue
        with contextlib.suppress(Exception):
            engine = engine_for(record.name)
            if background:
                engine.release_unfinished(record)
            else:
                engine.release(record)


def engine_finder(manager: Any) -> Callable[[str], Engine] | None:
    """``manager.engine_for`` (None for a manager without one)."""
    return getattr(manager, "engine_for", None)
