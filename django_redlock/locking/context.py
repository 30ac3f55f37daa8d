"""The active leases of the current thread or asyncio task.

A lease is active from its acquisition (``acquire()``, ``aacquire()``, a lock block, a request
lock) until it is released, in the thread or task that acquired it. FencedModel reads the
innermost active lease's token; lock blocks and request locks find a lease they can re-enter.
A lease released elsewhere (another thread) stops counting at once: released leases are
skipped, whichever context still lists them.

Each thread or task keeps its own :class:`~.frames.Frame` (in a ``contextvars`` variable): an
insertion-ordered list of entries plus indexes by ``(alias, name)`` and by token (see
:mod:`.frames`).
A child task (or a ``sync_to_async`` thread) starts a frame of its own on top of its parent's:
its writes are fenced by its parent's lease, but it never re-enters the parent's lease (another
task is another caller).
"""

from __future__ import annotations

import contextvars
import weakref
from collections.abc import Callable, Iterable, Mapping

from .frames import (
    NODES_ATTR,
    SEQ,
    Entry,
    Frame,
    Key,
    TokenHolder,
    current_owner,
    entries_of,
)

_frame: contextvars.ContextVar[Frame | None] = contextvars.ContextVar(
    "django_redlock_active_leases", default=None
)


def _own_frame() -> Frame:
    """This thread's or task's frame, started on top of an inherited one when needed (a new
    task or thread; or this task after ``sync_to_async`` copied a thread's frame back into
    its context: its older frame stays below and is still searched as its own)."""
    frame = _frame.get()
    owner = current_owner()
    if frame is None or frame.owner != owner:
        while frame is not None and not frame.holds_any():
            frame = frame.parent  # empty frames of finished callers: keep the chain short
        frame = Frame(owner, frame)
        _frame.set(frame)
    return frame


def push(lease: TokenHolder, within: object = None) -> object:
    """Enter ``lease`` (a lock block, a request lock): the innermost active lease, and one
    that this thread or task may re-enter, while ``within`` (the lock block, held weakly;
    None: until popped) exists. Returns the token for :func:`pop`."""
    frame = _own_frame()
    return frame.add(Entry(frame, lease, True, within=within))


def bind(lease: TokenHolder, within: object) -> None:
    """Tie the entries that activated ``lease`` in this thread or task (its ``acquire()``'s)
    to the lock block ``within``, held weakly: they end with the block even where its exit
    never ran (see :attr:`.frames.Entry.within`)."""
    owner = current_owner()
    for entry in entries_of(lease):
        if entry.within is None and entry.frame.owner == owner:
            entry.within = weakref.ref(within)


def push_findable(lease: TokenHolder, usable: Callable[[], bool]) -> object:
    """Let this thread or task re-enter ``lease`` while ``usable()`` is true, without making
    it guard writes (a lease kept until its transaction commits). Token for :func:`pop`."""
    frame = _own_frame()
    return frame.add(Entry(frame, lease, True, fences=False, usable=usable))


def pop(token: object) -> None:
    """Undo the :func:`push` that returned ``token``, and only that entry (leases activated
    meanwhile stay active)."""
    if not isinstance(token, Entry):
        raise TypeError("pop() takes the token that push() returned.")
    if token.frame.owner == current_owner():
        token.frame.drop(token)
    else:
        token.dead = True


def activate(lease: TokenHolder, key: Key | None = None) -> None:
    """Make ``lease`` the innermost active lease until :func:`deactivate` (``acquire()``);
    ``key``: its ``(alias, name)``, when the caller has it at hand."""
    frame = _own_frame()
    frame.add(Entry(frame, lease, False, key=key))


def activate_all(leases: Iterable[TokenHolder]) -> None:
    """:func:`activate` each of ``leases`` in order (the last is the innermost)."""
    frame = _own_frame()
    for lease in leases:
        frame.add(Entry(frame, lease, False))


def deactivate(lease: TokenHolder) -> object:
    """Forget ``lease`` in every frame that lists it (it was released, or is kept only for a
    commit): it guards no write and is re-entered no more. Returns the calling thread or
    task (as :func:`_owner`)."""
    owner = current_owner()
    entries = getattr(lease, NODES_ATTR, None)
    if not entries:
        return owner
    if len(entries) == 1:  # the common case, without the copy
        entry = entries[0]
        if entry.frame.owner == owner:
            entry.frame.drop(entry)
        else:
            entry.dead = True
        return owner
    for entry in list(entries):
        if entry.frame.owner == owner:
            entry.frame.drop(entry)
        else:
            entry.dead = True
    return owner


def clear() -> None:
    """Forget every active lease of this context (the leases stay held and valid). For test
    suites: a lease from ``acquire()`` that one test never released would otherwise keep
    guarding FencedModel writes in the next tests of the same thread."""
    _frame.set(Frame(current_owner(), None))


def current_lease() -> TokenHolder | None:
    """The innermost active lease (also one a parent task holds), or ``None``."""
    frame = _frame.get()
    while frame is not None:
        lease = frame.innermost()
        if lease is not None:
            return lease
        frame = frame.parent
    return None


def active_with_token(token: int) -> TokenHolder | None:
    """The innermost active lease (of this thread or task, or inherited from its parent)
    whose token is ``token``, or None: a row claimed with one lease of a ``lock_many`` set is
    saved with that lease's token, not the innermost lease's."""
    owner = current_owner()
    frame = _frame.get()
    while frame is not None:
        for entry in reversed(frame.with_token(token, owner)):
            if entry.fences and entry.live():
                return entry.lease
        frame = frame.parent
    return None


def current_token() -> int | None:
    """The fencing token of the innermost active lease, or ``None``."""
    lease = current_lease()
    return None if lease is None else lease.token


def _own_entries(alias: str | None, name: str) -> list[Entry]:
    """The live entries of ``name`` that this very thread or task made, innermost last."""
    owner = current_owner()
    found: list[Entry] = []
    frame = _frame.get()
    while frame is not None:
        if frame.owner == owner:
            found[:0] = [e for e in frame.keyed((alias, name)) if e.live()]
        frame = frame.parent
    return found


def find(alias: str, name: str, kind: str = "") -> TokenHolder | None:
    """The innermost lease of ``name`` on ``alias`` (of ``kind``: '' a lock, 'read',
    'write', 'permit') that this very thread or task entered with a lock block, a request
    lock or ``lock_many`` (for re-entering it), or None. Bare ``acquire()`` leases are never
    re-entered."""
    innermost: Entry | None = None
    resumed: Entry | None = None  # a running generator's, innermost while it runs
    for entry in reversed(_own_entries(alias, name)):
        if (
            entry.enterable
            and not entry.suspended
            and getattr(entry.lease, "kind", "") == kind
            and (entry.usable is None or entry.usable())
        ):
            if innermost is None:
                innermost = entry
            if entry.order != entry.seq and (resumed is None or entry.order > resumed.order):
                resumed = entry
    if resumed is not None and (innermost is None or resumed.order > innermost.order):
        return resumed.lease
    return None if innermost is None else innermost.lease


def held(alias: str, name: str) -> list[TokenHolder]:
    """Every live lease of ``name`` on ``alias`` that this very thread or task activated
    (re-enterable or not; a lease kept for a commit while its transaction lasts), innermost
    last; not a suspended generator's (another holder for its consumer)."""
    return [
        entry.lease
        for entry in _own_entries(alias, name)
        if not entry.suspended and (entry.usable is None or entry.usable())
    ]


def held_now() -> list[tuple[Key, TokenHolder]]:
    """Every lease this thread or task holds now, with its ``(alias, name)``: its own and
    those of the callers it runs for (a parent task, the task a ``sync_to_async`` thread
    serves), a lease kept until its transaction commits included. For the lock-order
    checker: it reads only, never indexes or drops."""
    found: list[tuple[Key, TokenHolder]] = []
    frame = _frame.get()
    while frame is not None:
        for entry in list(frame.stack):
            if entry.live() and (entry.usable is None or entry.usable()):
                found.append((entry.key, entry.lease))
        frame = frame.parent
    return found


def push_set(leases: Mapping[str, TokenHolder]) -> list[object]:
    """:func:`push` each lease of a ``lock_many`` set (re-enterable by name); tokens to
    :func:`pop` each."""
    return [push(lease) for lease in leases.values()]


class Suspensions:
    """The leases a generator activated while it ran (its ``@lock`` lease, and blocks its
    body left open across a ``yield``): while the generator is suspended at a ``yield``
    they are not its caller's: they guard none of the caller's writes (the caller's own
    block is the innermost lease there) and the caller's blocks do not re-enter them (a
    second generator of the same name, or a block of it, is another holder: busy, as for
    another thread). Each resumption makes them the generator's again."""

    __slots__ = ("_mark", "_mine", "_visits")

    def __init__(self) -> None:
        self._mark = next(SEQ)
        self._mine: list[Entry] = []
        #: the generator's leases lent to the thread or task that resumed it, when that is
        #: not the one that activated them (tokens for :func:`pop`, at the next suspension)
        self._visits: list[object] = []

    def suspend(self) -> None:
        """The generator yields: its entries stop guarding writes."""
        mark, found = self._mark, []
        owner = current_owner()
        frame = _frame.get()
        while frame is not None and frame.owner == owner:
            for entry in reversed(frame.stack):
                if entry.seq <= mark:
                    frame = None
                    break
                if entry.fences and entry.live():
                    found.append(entry)
            else:
                frame = frame.parent
        self.end_visits()
        mine = [entry for entry in self._mine if entry.live()] + found
        for entry in mine:
            entry.fences = False
            entry.suspended = True
        self._mine = mine

    def resume(self) -> None:
        """The generator runs again: its entries guard its writes. Resumed by another thread
        or task than the one that activated them, they stay suspended there and are lent to
        this one until the next suspension (its body's blocks re-enter them, its writes
        carry their tokens)."""
        owner = current_owner()
        for entry in self._mine:
            if entry.frame.owner == owner:
                entry.fences = True
                entry.suspended = False
                entry.order = next(SEQ)  # innermost while the generator runs
            elif entry.live():
                self._visits.append(push(entry.lease))
        self._mark = next(SEQ)

    def end_visits(self) -> None:
        """Take back what :meth:`resume` lent to another thread or task."""
        visits, self._visits = self._visits, []
        for token in reversed(visits):
            pop(token)
