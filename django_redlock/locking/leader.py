"""Leader election: ``with locks[alias].leader(name, ttl=...)`` campaigns for ``name`` until
elected, keeps the leadership renewed while the block runs, and calls ``on_demoted`` as soon as
it is lost (docs/leaders.md).

The leadership is a lease of the lock ``name``, auto-extended: its fencing token is the term,
so a deposed leader's writes to ``FencedModel`` rows are refused once a newer leader wrote them.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ..exceptions import LockLost
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
        options = BlockOptions(ttl, None, True, None, False, False)  # wait for ever, renew
        block_type = AsyncLockBlock if is_async else LockBlock
        self._block: LockBlock = block_type(lambda: manager, name, options)
        self.name = name
        self.alias = manager.alias
        self._on_elected = on_elected
        self._on_demoted = on_demoted
        self._lease: Lease | None = None
        self._demoted = threading.Event()

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
        self._elected(self._block.__enter__())
        return self

    def __exit__(self, exc_type: type[BaseException] | None, *rest: object) -> None:
        try:
            self._block.__exit__(exc_type, *rest)
        except LockLost:
            if exc_type is not None or not self.demoted:
                raise
            # a demoted leader leaves its block quietly: on_demoted already told it

    async def __aenter__(self) -> Leadership:
        self._elected(await self._block.__aenter__())
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, *rest: object) -> None:
        try:
            await self._block.__aexit__(exc_type, *rest)
        except LockLost:
            if exc_type is not None or not self.demoted:
                raise

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
        if self._demoted.is_set():
            return
        self._demoted.set()
        if self._on_demoted is not None:
            self._on_demoted(self)
