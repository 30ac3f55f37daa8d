"""Leader election: ``with locks[alias].leader(name, ttl=...)`` campaigns for ``name`` until
elected, keeps the leadership renewed while the block runs, and calls ``on_demoted`` as soon as
it is lost (docs/leaders.md).

The leadership is a lease of the lock ``name``, auto-extended: its fencing token is the term,
so a deposed leader's writes to ``FencedModel`` rows are refused once a newer leader wrote them.
"""

from __future__ import annotations

import inspect
import sys
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ..exceptions import LockError, LockLost
from . import context
from .block import AsyncLockBlock, BlockOptions, LockBlock

if TYPE_CHECKING:
    from .acquirer import Acquirer
    from .lease import Lease

#: A callback given the :class:`Leadership` (``on_elected`` or ``on_demoted``).
Hook = Callable[["Leadership"], Any]


class Leadership:
    """One process's campaign for ``name``; entered with ``with`` (or ``async with``, from
    :meth:`~.manager.LockManager.aleader`). ``is_leader`` is True from the election until the
    leadership is lost or the block ends; ``term`` is the elected lease's fencing token."""

    def __init__(
        self,
        manager: Acquirer,
        name: str,
        *,
        ttl: float | None,
        on_elected: Hook | None,
        on_demoted: Hook | None,
        is_async: bool,
    ) -> None:
        for hook, what in ((on_elected, "on_elected"), (on_demoted, "on_demoted")):
            if hook is not None and not callable(hook):
                raise TypeError(f"leader({name!r}): {what} must be callable, got {hook!r}")
            if inspect.iscoroutinefunction(hook):
                raise TypeError(
                    f"leader({name!r}): {what} is a coroutine function; hooks are called, "
                    "never awaited (on_demoted from the renewal thread or task), so it would "
                    "not run: pass a plain function (it may schedule a task)"
                )
        options = BlockOptions(ttl, None, True, None, False, False)  # wait for ever, renew
        block_type = AsyncLockBlock if is_async else LockBlock
        self._block: LockBlock = block_type(lambda: manager, name, options)
        self.name = name
        self.alias = manager.alias
        self._on_elected = on_elected
        self._on_demoted = on_demoted
        self._lease: Lease | None = None
        self._demoted = threading.Event()
        self._demoting = threading.Lock()
        #: between entering and leaving the block (campaigning or elected)
        self._active = False

    def __repr__(self) -> str:
        if self.is_leader:
            state = "leader"
        elif self.demoted:
            state = "demoted"
        else:
            state = "campaigning" if self._lease is None else "stepped down"
        return f"<Leadership {self.name!r} alias={self.alias!r} {state} term={self.term}>"

    @property
    def is_leader(self) -> bool:
        """True while this process is the elected leader: elected, not demoted, and its
        lease still valid by this process's clock (False at once after a long pause)."""
        lease = self._lease
        return (
            lease is not None
            and not self._demoted.is_set()
            and not lease.lost
            and not lease.released
            and lease.validity > 0
        )

    @property
    def term(self) -> int | None:
        """The fencing token of the elected lease (None before the election): each new
        leader's term is higher than every earlier one's."""
        return None if self._lease is None else self._lease.token

    @property
    def demoted(self) -> bool:
        """True once the leadership was lost while the block ran."""
        return self._demoted.is_set()

    @property
    def lease(self) -> Lease | None:
        """The elected lease (None before the election)."""
        return self._lease

    def wait_demoted(self, timeout: float | None = None) -> bool:
        """Block until the leadership is lost (True) or ``timeout`` passes (False)."""
        return self._demoted.wait(timeout)

    # -- entering and leaving ----------------------------------------------------------------
    def __enter__(self) -> Leadership:
        if isinstance(self._block, AsyncLockBlock):
            raise TypeError(
                f"aleader({self.name!r}) is for `async with`; use leader() in synchronous code"
            )
        self._campaign()
        try:
            self._elected(self._block.__enter__())
        except BaseException:  # on_elected raised, or an interrupt: the block never runs
            if self._block.entered:
                self._leave(sys.exc_info())  # elected meanwhile: step down here
            self._active = False
            raise
        return self

    def __exit__(self, exc_type: type[BaseException] | None, *rest: object) -> None:
        self._leave((exc_type, *rest))

    def _leave(self, exc_info: tuple[Any, ...]) -> None:
        self._active = False
        try:
            self._block.__exit__(*exc_info)
        except LockLost:
            if exc_info[0] is not None or not self.demoted:
                raise
            # a demoted leader leaves its block quietly: on_demoted already told it

    async def __aenter__(self) -> Leadership:
        self._campaign()
        try:
            lease = await self._block.__aenter__()
        except BaseException:
            self._active = False
            raise
        try:
            self._elected(lease)
        except BaseException:
            await self._aleave(sys.exc_info())
            raise
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, *rest: object) -> None:
        await self._aleave((exc_type, *rest))

    async def _aleave(self, exc_info: tuple[Any, ...]) -> None:
        self._active = False
        try:
            await self._block.__aexit__(*exc_info)
        except LockLost:
            if exc_info[0] is not None or not self.demoted:
                raise

    def _campaign(self) -> None:
        """Refuse a campaign that would wait for itself for ever (this thread or task holds
        the name already); start a new term's state when the object is entered again."""
        if self._active:
            raise LockError(
                f"leader({self.name!r}) (alias {self.alias!r}) is entered already; a "
                "Leadership campaigns in one block at a time (it would wait for itself)"
            )
        if context.held(self.alias, self.name):
            raise LockError(
                f"leader({self.name!r}) (alias {self.alias!r}): this thread or task holds "
                "the name already; campaigning again would wait for itself for ever"
            )
        self._active = True
        self._lease = None
        if self._demoted.is_set():  # entered again after a demotion: a new campaign
            self._demoted = threading.Event()

    def _elected(self, lease: Lease) -> None:
        self._lease = lease
        before = lease.on_lost

        def lost() -> None:
            if before is not None:
                before()
            self._demote()

        lease.on_lost = lost
        if lease.lost:  # lost between the election and now
            self._demote()
            return
        if self._on_elected is not None:
            self._on_elected(self)

    def _demote(self) -> None:
        with self._demoting:  # the renewal thread and _elected() may both get here
            if self._demoted.is_set():
                return
            self._demoted.set()
        if self._on_demoted is not None:
            self._on_demoted(self)
