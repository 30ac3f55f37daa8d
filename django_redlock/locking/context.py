"""The active leases of the current thread or asyncio task.

A lease is active from its acquisition (``acquire()``, ``aacquire()``, a lock block, a request
lock) until it is released, in the thread or task that acquired it. FencedModel reads the
innermost active lease's token; lock blocks and request locks find a lease they can re-enter.
A lease released elsewhere (another thread) stops counting at once: released leases are
skipped, whichever context still lists them.

Each thread or task keeps its own :class:`_Frame` (in a ``contextvars`` variable): an
insertion-ordered dict of entries plus an index by ``(alias, name)``, so pushing, popping and
forgetting a lease cost the same whether the process holds ten leases or a hundred thousand.
A child task (or a ``sync_to_async`` thread) starts a frame of its own on top of its parent's:
its writes are fenced by its parent's lease, but it never re-enters the parent's lease (another
task is another caller).
"""

from __future__ import annotations

import asyncio
import contextvars
import itertools
import threading
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Protocol


class TokenHolder(Protocol):
    """What the context needs from a lease."""

    @property
    def name(self) -> str: ...

    @property
    def token(self) -> int: ...


Key = tuple[str | None, str]


class _Entry:
    """One activation of a lease in one frame."""

    __slots__ = (
        "dead",
        "enterable",
        "fences",
        "frame",
        "indexed",
        "key",
        "lease",
        "seq",
        "suspended",
        "usable",
    )

    def __init__(
        self,
        frame: _Frame,
        lease: TokenHolder,
        enterable: bool,
        fences: bool = True,
        usable: Callable[[], bool] | None = None,
        key: Key | None = None,
    ) -> None:
        self.frame = frame
        self.lease = lease
        self.key: Key = (getattr(lease, "alias", None), lease.name) if key is None else key
        #: in the frame's ``by_key`` and ``by_token`` indexes (see :attr:`_Frame.fresh`)
        self.indexed = False
        #: entered by a lock block or a request lock (re-enterable), not by a bare ``acquire()``
        self.enterable = enterable
        #: guards FencedModel writes (False: only findable, e.g. a lease kept until a commit)
        self.fences = fences
        #: for a findable-only entry: whether it may be re-entered now (same transaction)
        self.usable = usable
        #: forgotten from another thread: skipped, and dropped by the frame's owner
        self.dead = False
        #: the order of activation among all entries (a generator's run finds its own)
        self.seq = next(_SEQ)
        #: activated by a generator that is suspended at a ``yield``: its caller (the
        #: generator's consumer) neither fences with it nor re-enters it
        self.suspended = False

    def live(self) -> bool:
        lease = self.lease
        return not (
            self.dead or getattr(lease, "released", False) or getattr(lease, "foreign", False)
        )


class _Frame:
    """The leases one thread or task activated, innermost last."""

    __slots__ = ("by_key", "by_token", "dead", "fresh", "fresh_dead", "owner", "parent", "stack")

    def __init__(self, owner: object, parent: _Frame | None) -> None:
        self.owner = owner
        self.parent = parent
        #: every entry, in activation order; entries dropped from the middle stay (marked
        #: dead) until more than half are dead, then the list is rebuilt: O(1) amortized
        self.stack: list[_Entry] = []
        self.dead = 0
        #: the entries of each (alias, name), in activation order
        self.by_key: dict[Key, list[_Entry]] = {}
        #: the entries of each token (a row claimed with one lease of a set saves with it)
        self.by_token: dict[int, list[_Entry]] = {}
        #: entries added since the indexes were last looked at, in order: indexed on the next
        #: lookup, so a lease acquired and released in between (most are) never is
        self.fresh: list[_Entry] = []
        #: fresh entries dropped out of order (still listed, skipped): when they are more than
        #: half, the list is rebuilt without them (O(1) amortized, as for ``stack``)
        self.fresh_dead = 0

    def add(self, entry: _Entry) -> _Entry:
        self.stack.append(entry)
        self.fresh.append(entry)
        _entries_of(entry.lease).append(entry)
        return entry

    def _index(self) -> None:
        """Index the fresh entries (called by the frame's owner only)."""
        for entry in self.fresh:
            if not entry.dead:
                self.by_key.setdefault(entry.key, []).append(entry)
                self.by_token.setdefault(entry.lease.token, []).append(entry)
                entry.indexed = True
        self.fresh, self.fresh_dead = [], 0

    def keyed(self, key: Key) -> list[_Entry]:
        """The entries of ``key``, in activation order (called by the frame's owner only)."""
        if self.fresh:
            self._index()
        return self.by_key.get(key, [])

    def with_token(self, token: int, owner: object) -> list[_Entry]:
        """The entries of ``token``, in activation order. ``owner``: the calling thread or
        task; in a frame it does not own (a parent's) the fresh entries are looked through,
        read only, not indexed."""
        if self.fresh and self.owner == owner:
            self._index()
        if not self.fresh:
            return self.by_token.get(token, [])
        fresh = [e for e in list(self.fresh) if not e.dead and e.lease.token == token]
        return [*self.by_token.get(token, ()), *fresh]

    def drop(self, entry: _Entry) -> None:
        """Remove ``entry`` (called by the frame's owner only)."""
        if entry.frame is not self:
            entry.dead = True
            return
        if entry.indexed:
            _unindex(self.by_key, entry.key, entry)
            _unindex(self.by_token, entry.lease.token, entry)
            entry.indexed = False
        elif self.fresh and self.fresh[-1] is entry:
            self.fresh.pop()
        else:  # it stays listed until indexed or rebuilt, and is skipped as dead
            self.fresh_dead += 1
            if self.fresh_dead > 16 and self.fresh_dead * 2 > len(self.fresh):
                self.fresh = [e for e in self.fresh if e is not entry and not e.dead]
                self.fresh_dead = 0
        _remove(_entries_of(entry.lease), entry)
        if entry.dead:
            return  # dropped before
        entry.dead = True
        stack = self.stack
        if stack and stack[-1] is entry:
            stack.pop()
            while stack and stack[-1].dead:
                stack.pop()
                self.dead -= 1
            self.dead = max(self.dead, 0)
            return
        self.dead += 1
        if self.dead > 16 and self.dead * 2 > len(stack):
            self.stack = [e for e in stack if not e.dead]
            self.dead = 0

    def holds_any(self) -> bool:
        """True unless every entry is gone (read only: another thread may own the frame)."""
        return any(not entry.dead for entry in reversed(self.stack))

    def innermost(self) -> TokenHolder | None:
        """The innermost live fencing lease of this frame (dropping dead ones on the way)."""
        stale: list[_Entry] = []
        found: TokenHolder | None = None
        for entry in reversed(self.stack):
            if not entry.live():
                stale.append(entry)
            elif entry.fences:
                found = entry.lease
                break
        if stale and self.owner == _owner():
            for entry in stale:
                self.drop(entry)
        return found


def _unindex(index: dict[Any, list[_Entry]], key: Any, entry: _Entry) -> None:
    """Remove ``entry`` from ``index[key]`` (and the key once its list is empty)."""
    same = index.get(key)
    if same is not None:
        _remove(same, entry)
        if not same:
            del index[key]


def _remove(entries: list[_Entry], entry: _Entry) -> None:
    """Remove ``entry`` from a short list, looking from its end (usually where it is)."""
    if entries and entries[-1] is entry:
        entries.pop()
        return
    for i in range(len(entries) - 1, -1, -1):
        if entries[i] is entry:
            del entries[i]
            return


_NODES_ATTR = "_redlock_context_entries"
#: numbers every entry in activation order, process-wide (``next()`` is atomic in CPython)
_SEQ = itertools.count()


def _entries_of(lease: TokenHolder) -> list[_Entry]:
    """The entries of ``lease`` in any frame (kept on the lease: forgetting it is O(1))."""
    entries: list[_Entry] | None = getattr(lease, _NODES_ATTR, None)
    if entries is None:
        entries = []
        setattr(lease, _NODES_ATTR, entries)
    return entries


_frame: contextvars.ContextVar[_Frame | None] = contextvars.ContextVar(
    "django_redlock_active_leases", default=None
)


def _owner() -> object:
    # _get_running_loop() returns None outside a loop instead of raising (cheap on every acquire)
    loop = asyncio._get_running_loop()
    task = None if loop is None else asyncio.current_task(loop)
    return task if task is not None else threading.get_ident()


def _own_frame() -> _Frame:
    """This thread's or task's frame, started on top of an inherited one when needed (a new
    task or thread; or this task after ``sync_to_async`` copied a thread's frame back into
    its context: its older frame stays below and is still searched as its own)."""
    frame = _frame.get()
    owner = _owner()
    if frame is None or frame.owner != owner:
        while frame is not None and not frame.holds_any():
            frame = frame.parent  # empty frames of finished callers: keep the chain short
        frame = _Frame(owner, frame)
        _frame.set(frame)
    return frame


def push(lease: TokenHolder) -> object:
    """Enter ``lease`` (a lock block, a request lock): the innermost active lease, and one
    that this thread or task may re-enter. Returns the token for :func:`pop`."""
    frame = _own_frame()
    return frame.add(_Entry(frame, lease, True))


def push_findable(lease: TokenHolder, usable: Callable[[], bool]) -> object:
    """Let this thread or task re-enter ``lease`` while ``usable()`` is true, without making
    it guard writes (a lease kept until its transaction commits). Token for :func:`pop`."""
    frame = _own_frame()
    return frame.add(_Entry(frame, lease, True, fences=False, usable=usable))


def pop(token: object) -> None:
    """Undo the :func:`push` that returned ``token``, and only that entry (leases activated
    meanwhile stay active)."""
    if not isinstance(token, _Entry):
        raise TypeError("pop() takes the token that push() returned.")
    if token.frame.owner == _owner():
        token.frame.drop(token)
    else:
        token.dead = True


def activate(lease: TokenHolder, key: Key | None = None) -> None:
    """Make ``lease`` the innermost active lease until :func:`deactivate` (``acquire()``);
    ``key``: its ``(alias, name)``, when the caller has it at hand."""
    frame = _own_frame()
    frame.add(_Entry(frame, lease, False, key=key))


def activate_all(leases: Iterable[TokenHolder]) -> None:
    """:func:`activate` each of ``leases`` in order (the last is the innermost)."""
    frame = _own_frame()
    for lease in leases:
        frame.add(_Entry(frame, lease, False))


def deactivate(lease: TokenHolder) -> object:
    """Forget ``lease`` in every frame that lists it (it was released, or is kept only for a
    commit): it guards no write and is re-entered no more. Returns the calling thread or
    task (as :func:`_owner`)."""
    owner = _owner()
    entries = getattr(lease, _NODES_ATTR, None)
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
    _frame.set(_Frame(_owner(), None))


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
    owner = _owner()
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


def _own_entries(alias: str | None, name: str) -> list[_Entry]:
    """The live entries of ``name`` that this very thread or task made, innermost last."""
    owner = _owner()
    found: list[_Entry] = []
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
    for entry in reversed(_own_entries(alias, name)):
        if (
            entry.enterable
            and not entry.suspended
            and getattr(entry.lease, "kind", "") == kind
            and (entry.usable is None or entry.usable())
        ):
            return entry.lease
    return None


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
        self._mark = next(_SEQ)
        self._mine: list[_Entry] = []
        #: the generator's leases lent to the thread or task that resumed it, when that is
        #: not the one that activated them (tokens for :func:`pop`, at the next suspension)
        self._visits: list[object] = []

    def suspend(self) -> None:
        """The generator yields: its entries stop guarding writes."""
        mark, found = self._mark, []
        owner = _owner()
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
        owner = _owner()
        for entry in self._mine:
            if entry.frame.owner == owner:
                entry.fences = True
                entry.suspended = False
            elif entry.live():
                self._visits.append(push(entry.lease))
        self._mark = next(_SEQ)

    def end_visits(self) -> None:
        """Take back what :meth:`resume` lent to another thread or task."""
        visits, self._visits = self._visits, []
        for token in reversed(visits):
            pop(token)
