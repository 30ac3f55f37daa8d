"""``limits()``: one permit of each of several semaphores, all or nothing (docs/primitives.md).

::

    with locks["default"].limits({"api:global": 20, f"api:tenant:{tenant}": 2}):
        call_the_api()

A node grants a permit of every semaphore or of none, so no caller holds one permit while it
waits for another: callers asking for overlapping sets in any order never deadlock. Each
semaphore is the same one ``semaphore(name, permits)`` takes; each permit is a
:class:`~django_redlock.locking.lease.Lease` of its own, with its own fencing token.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any, TypeVar

from ..validation import check_name, check_permits
from . import ordering
from .entries import refuse_other_kind
from .lease import Lease
from .many import HeldLocks, LockManyBlock
from .wrapping import wrap_held

if TYPE_CHECKING:
    from .acquirer import Acquirer

F = TypeVar("F", bound=Callable[..., Any])

#: The most semaphores one ``limits()`` call may take.
MAX_LIMITS = 100
#: The most slot keys (the sum of the permits) one call may touch: each is a key of one script
#: call on every node.
MAX_SLOTS = 4096


def check_limits(limits: Any) -> tuple[tuple[str, ...], tuple[int, ...]]:
    """The names and permits of a ``limits()`` call: a mapping ``{name: permits}`` (or an
    iterable of ``(name, permits)`` pairs, where a repeated name is an error), each name a
    valid lock name and each ``permits`` an int >= 1. Raises before any network call."""
    if isinstance(limits, Mapping):
        pairs = list(limits.items())
    elif isinstance(limits, str | bytes) or not isinstance(limits, Iterable):
        raise TypeError(
            "limits() takes a dict of semaphore names to their permits, e.g. "
            f'{{"api:global": 20, "api:tenant:7": 2}}, not {type(limits).__name__}.'
        )
    else:
        pairs = list(limits)
        for pair in pairs:
            if not (isinstance(pair, tuple) and len(pair) == 2):
                raise TypeError(f"limits() takes (name, permits) pairs, got {pair!r}.")
    if not pairs:
        raise ValueError('limits() needs at least one semaphore, e.g. {"api:global": 20}.')
    if len(pairs) > MAX_LIMITS:
        raise ValueError(f"limits() takes at most {MAX_LIMITS} semaphores, got {len(pairs)}.")
    names: dict[str, int] = {}
    for name, permits in pairs:
        checked = check_name(name)
        if checked in names:
            raise ValueError(
                f"limits() names {checked!r} twice: a call takes one permit of each semaphore."
            )
        try:
            names[checked] = check_permits(permits)
        except (TypeError, ValueError) as exc:
            raise type(exc)(f"limits() of {checked!r}: {exc}") from None
    if sum(names.values()) > MAX_SLOTS:
        raise ValueError(
            f"limits() may touch at most {MAX_SLOTS} permits in all (the sum of the "
            f"semaphores' permits), got {sum(names.values())}."
        )
    return tuple(names), tuple(names.values())


class LimitsBlock(LockManyBlock):
    """``with``/``async with`` (and decorator) holding a permit of each semaphore of a
    ``limits()`` call; yields a :class:`~.many.HeldLocks` whose ``leases`` maps each name to
    its permit's lease. Like a ``semaphore()`` block, it takes permits of its own each time
    (it never re-enters one this thread or task holds)."""

    def __init__(
        self,
        manager: Acquirer,
        limits: Mapping[str, int],
        kwargs: dict[str, Any],
        until_commit: bool,
    ) -> None:
        super().__init__(manager, tuple(limits), kwargs, until_commit)
        self._limits = dict(limits)
        #: each name's template (the lock-order checker's shapes), when filled from templates
        self.order_templates: dict[str, str] = {}

    _what = "limits"

    def __repr__(self) -> str:
        return f"<LimitsBlock limits={self._limits!r}>"

    def __call__(self, func: F) -> F:
        """Decorate ``func`` (sync or ``async def``): each call runs holding the permits."""
        manager, limits, kwargs = self._manager, self._limits, self._kwargs
        until_commit = self._until_commit

        def block() -> LimitsBlock:  # one block per call: calls in threads do not share it
            return LimitsBlock(manager, limits, kwargs, until_commit)

        def entered(stack: contextlib.ExitStack[Any], *_: Any) -> bool:
            stack.enter_context(block())
            return True

        async def aentered(stack: contextlib.AsyncExitStack[Any], *_: Any) -> bool:
            await stack.enter_async_context(block())
            return True

        return wrap_held(func, entered, aentered)

    def _expect(self, names: list[str]) -> None:
        """Announce the names' templates to the lock-order checker, when it is on."""
        if self.order_templates and self._manager.check_order:
            templates = self.order_templates
            ordering.expect_all({name: templates[name] for name in names if name in templates})

    def _take(self, names: list[str]) -> HeldLocks:
        self._expect(names)
        take = self._manager.acquire_limits
        held: HeldLocks = take({name: self._limits[name] for name in names}, **self._kwargs)
        return held

    async def _atake(self, names: list[str]) -> HeldLocks:
        self._expect(names)
        take = self._manager.aacquire_limits
        held: HeldLocks = await take({name: self._limits[name] for name in names}, **self._kwargs)
        return held

    def _borrowed(self) -> dict[str, Lease]:
        """Nothing is re-entered (a semaphore block takes a permit of its own each time);
        ``LockError`` at once for a name this thread or task holds as a lock or a read-write
        lease: the set would wait for itself."""
        for name in self._names:
            refuse_other_kind(self._manager.alias, name, "permit")
        return {}
