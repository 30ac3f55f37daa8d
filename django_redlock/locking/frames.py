"""The data of the active-lease context: one thread's or task's frame of activated leases.

A :class:`Frame` is an insertion-ordered list of :class:`Entry` (one activation of a lease)
plus indexes by ``(alias, name)`` and by token, built lazily, so pushing, popping and
forgetting a lease cost the same whether the process holds ten leases or a hundred thousand.
:mod:`.context` keeps each thread's or task's frame in a ``contextvars`` variable.
"""

from __future__ import annotations

import asyncio
import itertools
import threading
import weakref
from collections.abc import Callable
from typing import Any, Protocol


class TokenHolder(Protocol):
    """What the context needs from a lease."""

    @property
    def name(self) -> str: ...

    @property
    def token(self) -> int: ...


Key = tuple[str | None, str]


class Entry:
    """One activation of a lease in one frame."""

    __slots__ = (
        "dead",
        "enterable",
        "fences",
        "frame",
        "indexed",
        "key",
        "lease",
        "order",
        "seq",
        "suspended",
        "usable",
        "within",
    )

    def __init__(
        self,
        frame: Frame,
        lease: TokenHolder,
        enterable: bool,
        fences: bool = True,
        usable: Callable[[], bool] | None = None,
        key: Key | None = None,
        within: object = None,
    ) -> None:
        self.frame = frame
        self.lease = lease
        self.key: Key = (getattr(lease, "alias", None), lease.name) if key is None else key
        #: in the frame's ``by_key`` and ``by_token`` indexes (see :attr:`Frame.fresh`)
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
        self.seq = next(SEQ)
        #: how inner it is now: its activation, or a generator's latest resumption (while
        #: the generator runs, its leases are innermost, not the ones its consumer took since)
        self.order = self.seq
        #: activated by a generator that is suspended at a ``yield``: its caller (the
        #: generator's consumer) neither fences with it nor re-enters it
        self.suspended = False
        #: the lock block that entered it, weakly: once the block is gone, so is the entry
        #: (a block whose ``__exit__`` an interrupt stopped on its first instruction never
        #: popped it: the thread re-entered that lease in every later block, then, once it
        #: ran out, raised LockLost in each of them for good)
        self.within = None if within is None else weakref.ref(within)

    def live(self) -> bool:
        lease, within = self.lease, self.within
        return not (
            self.dead
            or getattr(lease, "released", False)
            or getattr(lease, "foreign", False)
            or (within is not None and within() is None)
        )


class Frame:
    """The leases one thread or task activated, innermost last."""

    __slots__ = ("by_key", "by_token", "dead", "fresh", "fresh_dead", "owner", "parent", "stack")

    def __init__(self, owner: object, parent: Frame | None) -> None:
        self.owner = owner
        self.parent = parent
        #: every entry, in activation order; entries dropped from the middle stay (marked
        #: dead) until more than half are dead, then the list is rebuilt: O(1) amortized
        self.stack: list[Entry] = []
        self.dead = 0
        #: the entries of each (alias, name), in activation order
        self.by_key: dict[Key, list[Entry]] = {}
        #: the entries of each token (a row claimed with one lease of a set saves with it)
        self.by_token: dict[int, list[Entry]] = {}
        #: entries added since the indexes were last looked at, in order: indexed on the next
        #: lookup, so a lease acquired and released in between (most are) never is
        self.fresh: list[Entry] = []
        #: fresh entries dropped out of order (still listed, skipped): when they are more than
        #: half, the list is rebuilt without them (O(1) amortized, as for ``stack``)
        self.fresh_dead = 0

    def add(self, entry: Entry) -> Entry:
        self.stack.append(entry)
        self.fresh.append(entry)
        entries_of(entry.lease).append(entry)
        return entry

    def _index(self) -> None:
        """Index the fresh entries (called by the frame's owner only)."""
        for entry in self.fresh:
            if not entry.dead:
                self.by_key.setdefault(entry.key, []).append(entry)
                self.by_token.setdefault(entry.lease.token, []).append(entry)
                entry.indexed = True
        self.fresh, self.fresh_dead = [], 0

    def keyed(self, key: Key) -> list[Entry]:
        """The entries of ``key``, in activation order (called by the frame's owner only)."""
        if self.fresh:
            self._index()
        return self.by_key.get(key, [])

    def with_token(self, token: int, owner: object) -> list[Entry]:
        """The entries of ``token``, in activation order. ``owner``: the calling thread or
        task; in a frame it does not own (a parent's) the fresh entries are looked through,
        read only, not indexed."""
        if self.fresh and self.owner == owner:
            self._index()
        if not self.fresh:
            return self.by_token.get(token, [])
        fresh = [e for e in list(self.fresh) if not e.dead and e.lease.token == token]
        return [*self.by_token.get(token, ()), *fresh]

    def drop(self, entry: Entry) -> None:
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
        _remove(entries_of(entry.lease), entry)
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
        stale: list[Entry] = []
        found: TokenHolder | None = None
        for entry in reversed(self.stack):
            if not entry.live():
                stale.append(entry)
            elif entry.fences:
                found = entry.lease
                break
        if stale and self.owner == current_owner():
            for entry in stale:
                self.drop(entry)
        return found


def _unindex(index: dict[Any, list[Entry]], key: Any, entry: Entry) -> None:
    """Remove ``entry`` from ``index[key]`` (and the key once its list is empty)."""
    same = index.get(key)
    if same is not None:
        _remove(same, entry)
        if not same:
            del index[key]


def _remove(entries: list[Entry], entry: Entry) -> None:
    """Remove ``entry`` from a short list, looking from its end (usually where it is)."""
    if entries and entries[-1] is entry:
        entries.pop()
        return
    for i in range(len(entries) - 1, -1, -1):
        if entries[i] is entry:
            del entries[i]
            return


NODES_ATTR = "_redlock_context_entries"
#: numbers every entry in activation order, process-wide (``next()`` is atomic in CPython)
SEQ = itertools.count()


def entries_of(lease: TokenHolder) -> list[Entry]:
    """The entries of ``lease`` in any frame (kept on the lease: forgetting it is O(1))."""
    entries: list[Entry] | None = getattr(lease, NODES_ATTR, None)
    if entries is None:
        entries = []
        setattr(lease, NODES_ATTR, entries)
    return entries


def current_owner() -> object:
    """The running asyncio task, else the thread: who a frame belongs to."""
    # _get_running_loop() returns None outside a loop instead of raising (cheap on every acquire)
    loop = asyncio._get_running_loop()
    task = None if loop is None else asyncio.current_task(loop)
    return task if task is not None else threading.get_ident()
