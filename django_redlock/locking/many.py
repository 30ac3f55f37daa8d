"""``lock_many``: several names held together, all or nothing (docs/primitives.md).

::

    with locks["default"].lock_many([f"product:{pk}" for pk in cart]) as held:
        for pk in cart:
            Product.objects.claim(pk=pk, lease=held.leases[f"product:{pk}"])

The names are taken in one attempt (one script per node): a node grants all of them or none,
so two callers asking for overlapping sets in any order never deadlock and a failed attempt
leaves nothing held. Each name has a :class:`~django_redlock.locking.lease.Lease` of its own, with
its own fencing token.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, cast

from ..exceptions import LockError, LockLost
from ..validation import check_name
from . import context, interrupted
from .lease import Lease, keep_alive_all
from .transactions import in_transaction, release_after_commit

if TYPE_CHECKING:
    from .acquirer import Acquirer

#: The most names one ``lock_many`` call may take (each is a key in one script call).
MAX_NAMES = 1000


def check_names(names: Any) -> tuple[str, ...]:
    """The names of a ``lock_many`` call: a non-empty iterable (not a str) of lock names, at
    most :data:`MAX_NAMES` distinct ones; a repeated name counts once (first place kept)."""
    if isinstance(names, str | bytes) or not isinstance(names, Iterable):
        raise TypeError(
            f"lock_many() takes an iterable of lock names (a list, a set...), "
            f"not {type(names).__name__}."
        )
    checked = tuple(dict.fromkeys(check_name(name) for name in names))  # a repeat counts once
    if not checked:
        raise ValueError("lock_many() needs at least one name.")
    if len(checked) > MAX_NAMES:
        raise ValueError(f"lock_many() takes at most {MAX_NAMES} names, got {len(checked)}.")
    return checked


class HeldLocks:
    """What ``lock_many`` holds: ``leases`` maps each name to its :class:`Lease`.

    ``borrowed``: names whose lease an outer block of this thread or task holds (the set
    re-entered them: same lease and token); the set does not release them (leaving the
    block checks them, as a re-entered ``lock()`` block does)."""

    def __init__(self, leases: dict[str, Lease], borrowed: frozenset[str] = frozenset()) -> None:
        self.leases = leases
        self.borrowed = borrowed
        #: what release() answered the first time (None: not called yet)
        self._answer: bool | None = None

    @property
    def tokens(self) -> dict[str, int]:
        """Each name's fencing token."""
        return {name: lease.token for name, lease in self.leases.items()}

    def __repr__(self) -> str:
        return f"<HeldLocks {sorted(self.leases)}>"

    def release(self) -> bool:
        """Release every name still held, in one call per node; True if none of them had
        been lost (a lease released on its own before does not count). A second call
        releases nothing and gives the first one's answer again."""
        if self._answer is None or not self._all_released():
            self._answer = not self._release_each() and self._confirmed()
        return self._answer

    async def arelease(self) -> bool:
        """Asyncio twin of :meth:`release`."""
        if self._answer is None or not self._all_released():
            self._answer = not await self._arelease_each() and self._confirmed()
        return self._answer

    def _confirmed(self) -> bool:
        """No lease's release is still being given back (unconfirmed)."""
        return not any(lease.release_unconfirmed for lease in self._own())

    def _all_released(self) -> bool:
        return all(lease.released for lease in self._own())

    def _release_each(self) -> list[str]:
        """Release every name in one call per node (per owner); returns the names no longer
        held."""
        leases = self._releasing()
        if not leases:
            return []
        held: dict[int, bool] = {}
        try:
            for group in _by_owner(leases):
                replies = group[0].engine.release_many([lease.record for lease in group])
                held.update(zip(map(id, group), replies, strict=True))
        except BaseException:
            _unfinished(leases, held)
            raise
        return self._released(leases, [held[id(lease)] for lease in leases])

    async def _arelease_each(self) -> list[str]:
        leases = self._releasing()
        if not leases:
            return []
        held: dict[int, bool] = {}
        try:
            for group in _by_owner(leases):
                replies = await group[0].engine.arelease_many([lease.record for lease in group])
                held.update(zip(map(id, group), replies, strict=True))
        except BaseException:  # cancelled (wait_for, task.cancel) or interrupted
            _unfinished(leases, held)
            raise
        return self._released(leases, [held[id(lease)] for lease in leases])

    def _releasing(self) -> list[Lease]:
        """The leases still to release (renewals stopped, no longer guarding writes)."""
        return [
            lease
            for name, lease in self.leases.items()
            if name not in self.borrowed and lease.release_begin()
        ]

    def _released(self, leases: list[Lease], held: list[bool]) -> list[str]:
        done = {lease.name for lease in leases} | self.borrowed
        lost = [
            lease.name
            for lease, ok in zip(leases, held, strict=True)
            if not lease.release_end(ok) and not lease.given_back_later()
        ]
        return lost + [name for name in self.leases if name not in done]

    def _own(self) -> list[Lease]:
        return [lease for name, lease in self.leases.items() if name not in self.borrowed]


class LockManyBlock:
    """``with``/``async with`` holding every name of a set (``LockManager.lock_many``)."""

    #: the call's name in a ``LockLost`` message
    _what = "lock_many"

    def __init__(
        self,
        manager: Acquirer,
        names: tuple[str, ...],
        kwargs: dict[str, Any],
        until_commit: bool,
    ) -> None:
        self._manager = manager
        self._names = names
        self._kwargs = kwargs
        self._until_commit = until_commit
        self._held: list[tuple[HeldLocks, list[object]]] = []

    def __repr__(self) -> str:
        return f"<LockManyBlock names={list(self._names)!r}>"

    def __enter__(self) -> HeldLocks:
        borrowed = self._borrowed()
        rest = [name for name in self._names if name not in borrowed]
        # until this returns, an interrupt (a signal handler that raises) gives the set back:
        # after it returns, the with statement calls __exit__ whatever happens
        depth = len(self._held)
        return interrupted.handed(
            lambda: self._entered(borrowed, self._take(rest) if rest else None),
            interrupted.engine_finder(self._manager),
            lambda _opened: self._unenter(depth),
        )

    def __exit__(self, *exc_info: object) -> None:
        held = self._left()
        if not self._kept(held):
            not_held = held._release_each()
        else:
            not_held = [lease.name for lease in held._own() if lease.lost]
        _check_all_held(not_held + _lost_borrowed(held, exc_info[0]), exc_info[0], self._what)

    async def __aenter__(self) -> HeldLocks:
        borrowed = self._borrowed()
        rest = [name for name in self._names if name not in borrowed]
        depth = len(self._held)

        async def enter() -> HeldLocks:  # as in __enter__: until this returns, given back
            return self._entered(borrowed, await self._atake(rest) if rest else None)

        return await interrupted.ahanded(
            enter, interrupted.engine_finder(self._manager), lambda _opened: self._unenter(depth)
        )

    def _unenter(self, depth: int) -> None:
        """Undo an entry an interrupt cut short (its set is given back): its context."""
        if len(self._held) > depth:
            self._left()

    async def __aexit__(self, *exc_info: object) -> None:
        held = self._left()
        if not self._kept(held):
            not_held = await held._arelease_each()
        else:
            not_held = [lease.name for lease in held._own() if lease.lost]
        _check_all_held(not_held + _lost_borrowed(held, exc_info[0]), exc_info[0], self._what)

    def _take(self, names: list[str]) -> HeldLocks:
        """Acquire ``names`` (those of the set this thread or task does not hold yet)."""
        held: HeldLocks = self._manager.acquire_many(names, **self._kwargs)
        return held

    async def _atake(self, names: list[str]) -> HeldLocks:
        held: HeldLocks = await self._manager.aacquire_many(names, **self._kwargs)
        return held

    def _borrowed(self) -> dict[str, Lease]:
        """The names this thread or task holds already in a lock block (re-entered: same
        lease and token); ``LockError`` at once for one it holds otherwise (a bare
        ``acquire()`` lease, another kind): the set would wait for itself."""
        alias = self._manager.alias
        borrowed: dict[str, Lease] = {}
        for name in self._names:
            if not context.held(alias, name):
                continue
            lease = cast("Lease | None", context.find(alias, name))
            if lease is None:
                raise LockError(
                    f"lock_many() of {name!r} (alias {alias!r}): this thread or task holds "
                    "that name already with acquire() or as another kind, so the set would "
                    "wait for itself. Release it first, or take it with lock() (which "
                    "lock_many() re-enters)."
                )
            lease.check()
            borrowed[name] = lease
        return borrowed

    def _entered(self, borrowed: dict[str, Lease], acquired: HeldLocks | None) -> HeldLocks:
        own = {} if acquired is None else acquired.leases
        leases = {name: borrowed.get(name) or own[name] for name in self._names}
        held = HeldLocks(leases, frozenset(borrowed))
        for lease in leases.values():
            lease.block_opened()  # like a lock block: the last block of a lease lets it go
        # every name of the set, re-entered ones too, guards the block's writes (as a
        # re-entered lock() block does) and is re-entered by lock() inside it
        self._held.append((held, context.push_set(leases)))
        return held

    def _left(self) -> HeldLocks:
        """The set as it ends: names still held open by another block (the outer block of a
        re-entered name, a lock() block of this set's name that outlives it) are borrowed."""
        held, tokens = self._held.pop()
        for token in tokens:
            context.pop(token)
        for lease in held.leases.values():
            lease.block_closed()
        # a borrowed name whose outer block ended meanwhile (a generator closed inside the
        # set) is this set's to let go now; a name of the set still open elsewhere is not
        held.borrowed = frozenset(
            name for name, lease in held.leases.items() if lease.open_blocks > 0
        )
        return held

    def _kept(self, held: HeldLocks) -> bool:
        """Inside a transaction the names are released after it commits (docs/production.md)."""
        if not (self._until_commit and in_transaction()):
            return False
        max_hold = self._kwargs.get("max_hold")
        own = held._own()
        keep_alive_all(own, max_hold)  # one renewal thread for the set
        for lease in own:
            context.deactivate(lease)
            pending = lease.commit_pending
            if pending is None or not pending():
                pending = release_after_commit(lease, max_hold)
            context.push_findable(lease, pending)  # this transaction re-enters it
        return True


def _by_owner(leases: list[Lease]) -> list[list[Lease]]:
    """The leases grouped by owner value: ``RELEASE_MANY`` compares one owner for a whole
    call, and a set lets go of the leases it took (one owner) and of those it re-entered whose
    outer block ended inside it (a generator closed in the set: their own owner each)."""
    groups: dict[str, list[Lease]] = {}
    for lease in leases:
        groups.setdefault(lease.record.owner, []).append(lease)
    return list(groups.values())


def _unfinished(leases: list[Lease], held: dict[int, bool]) -> None:
    """The set's release was cancelled or interrupted: each lease whose release did not come
    back goes out from the engine's background give-back (found by an attack: a cancelled
    ``alock_many`` exit waiting for a connection left the whole set locked for its TTL)."""
    for lease in leases:
        if id(lease) not in held:
            lease.release_interrupted()


def _lost_borrowed(held: HeldLocks, exc_type: object) -> list[str]:
    """The re-entered names (an outer block still holds them) found lost as the set ends: a
    re-entered ``lock()`` block's exit checks its lease the same way (``check_lost``), so a
    set that re-entered a lease which ran out while it ran does not end quietly."""
    if exc_type is not None:
        return []
    lost = []
    for name, lease in held.leases.items():
        if name not in held.borrowed:
            continue
        try:
            lease.check()
        except LockLost:
            lost.append(name)
    return lost


def _check_all_held(not_held: list[str], exc_type: object, what: str = "lock_many") -> None:
    """Leaving the block after a name was lost raises ``LockLost`` (unless the block raised)."""
    if not_held and exc_type is None:
        raise LockLost(not_held[0], f"its lease ran out or was taken while the {what} block ran")
