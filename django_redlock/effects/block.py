"""``lease.once(key)``: the block around one effect, for ``with`` and ``async with``."""

from __future__ import annotations

import asyncio
import threading
import weakref
from types import TracebackType
from typing import Protocol

from asgiref.sync import sync_to_async
from django.db import router

from ..exceptions import LockError, LockLost
from . import ledger
from .model import MAX_ALIAS_LENGTH, MAX_KEY_LENGTH


class HeldLease(Protocol):
    """What an effect's block reads of its lease (a :class:`~django_redlock.Lease`)."""

    @property
    def kind(self) -> str: ...
    @property
    def alias(self) -> str: ...
    @property
    def name(self) -> str: ...
    @property
    def token(self) -> int: ...
    @property
    def released(self) -> bool: ...
    @property
    def lost(self) -> bool: ...
    @property
    def validity(self) -> float: ...
    def ensure_own(self) -> None: ...


#: Per lease, the (database, key) of its effect blocks open now: one block per key and lease
#: at a time, whichever thread or task opens or leaves it, and in whatever order.
_open: weakref.WeakKeyDictionary[object, set[tuple[str, str]]] = weakref.WeakKeyDictionary()
_open_mutex = threading.Lock()

#: The longest a begin inside a transaction waits for the effect's row (or the lease's
#: validity, if longer than a second and shorter)
MAX_BEGIN_WAIT = 10.0

#: Lease kinds with one holder at a time: only their tokens order the holders of an effect.
_EXCLUSIVE_KINDS = ("", "write")


def check_key(key: object) -> str:
    """An effect key: a non-empty str of at most 255 characters, encodable as UTF-8, without
    NUL (PostgreSQL cannot store it). A str subclass is checked as the str it holds."""
    if not isinstance(key, str):
        raise TypeError(f"An effect key must be a str, got {type(key).__name__}.")
    key = str.__str__(key)
    if not key or len(key) > MAX_KEY_LENGTH:
        raise ValueError(
            f"An effect key must have 1 to {MAX_KEY_LENGTH} characters, got {len(key)}."
        )
    try:
        key.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ValueError(f"An effect key must be valid text: {exc}.") from None
    if "\x00" in key:
        raise ValueError("An effect key must not contain NUL (\\x00): databases cannot store it.")
    return key


class Effect:
    """What ``with lease.once(key) as effect`` yields: the effect's state when the block
    began. ``done``: an earlier block did it (skip it). ``pending``: never done (run it).
    ``interrupted``: pending, and an earlier holder began it and did not finish (it may or
    may not have happened: check before doing it again). ``attempts`` counts the begins,
    this one included."""

    __slots__ = ("attempts", "done", "interrupted", "key")

    def __init__(self, key: str, begun: ledger.Begun) -> None:
        self.key = key
        self.done = begun.done
        self.interrupted = begun.interrupted
        self.attempts = begun.attempts

    @property
    def pending(self) -> bool:
        return not self.done

    def __repr__(self) -> str:
        state = "done" if self.done else "interrupted" if self.interrupted else "pending"
        return f"<Effect key={self.key!r} {state} attempts={self.attempts}>"


class EffectBlock:
    """The block of :meth:`Lease.once`: begins the effect on entry (committed at once),
    marks it done when left without an exception (in the caller's transaction, fenced by
    the lease's token; a newer holder's begin makes it ``StaleTokenError``)."""

    def __init__(self, lease: HeldLease, key: str, using: str | None) -> None:
        kind = lease.kind
        if kind not in _EXCLUSIVE_KINDS:
            raise TypeError(
                f"lease.once() needs a lock or write lease, one holder at a time; a {kind} "
                "lease is shared, so its token orders nothing."
            )
        if len(lease.alias) > MAX_ALIAS_LENGTH:
            raise ValueError(
                f"lease.once() records the lease's alias, at most {MAX_ALIAS_LENGTH} "
                f"characters; alias {lease.alias[:40]!r}... has {len(lease.alias)}."
            )
        self._lease = lease
        self._key = check_key(key)
        from .model import Effect as EffectRow

        self._using = using if using is not None else router.db_for_write(EffectRow)
        self._holder = ledger.Holder(lease.alias, lease.name, lease.token)
        self._effect: Effect | None = None
        self._marked = False

    def _enter(self) -> Effect:
        if self._effect is not None:
            raise LockError(f"The block of effect {self._key!r} was already entered once.")
        lease = self._lease
        lease.ensure_own()
        if lease.released:
            raise LockError(
                f"Effect {self._key!r}: lock {lease.name!r} was already released; run the "
                "effect while the lease is held."
            )
        if lease.lost:
            raise LockLost(lease.name, f"it was lost before effect {self._key!r} began")
        mark = (self._using, self._key)
        with _open_mutex:
            marks = _open.setdefault(lease, set())
            if mark in marks:
                raise LockError(
                    f"Effect {self._key!r} is already open under this lease (token "
                    f"{lease.token}); one block per effect and lease at a time, so a block "
                    "cannot run inside its own effect, and two threads or tasks sharing the "
                    "lease cannot run it together."
                )
            marks.add(mark)
        self._marked = True
        try:
            wait = min(max(lease.validity, 1.0), MAX_BEGIN_WAIT)
            begun = ledger.begin(self._key, self._holder, self._using, wait)
            self._effect = Effect(self._key, begun)
        except BaseException:
            self._unmark()
            raise
        return self._effect

    def _unmark(self) -> None:
        if self._marked:
            self._marked = False
            with _open_mutex:
                _open.get(self._lease, set()).discard((self._using, self._key))

    def _exit(self, failed: bool) -> None:
        self._unmark()
        effect = self._effect
        if failed or effect is None or effect.done:
            return  # an exception leaves it begun: the next holder sees it interrupted
        ledger.complete(self._key, self._holder, self._using)

    def __enter__(self) -> Effect:
        return self._enter()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._exit(exc_type is not None)

    async def __aenter__(self) -> Effect:
        # The begin runs in a worker thread, which a cancellation cannot stop: a caller
        # cancelled meanwhile never reaches __aexit__, so the key's mark is taken off once
        # the thread is done (else every later once(key) under this lease: "already open"),
        # and the cancellation goes on after that (a database write: at most MAX_BEGIN_WAIT).
        entering = asyncio.ensure_future(sync_to_async(self._enter)())
        try:
            return await asyncio.shield(entering)
        except asyncio.CancelledError:
            entering.add_done_callback(self._entered_for_nobody)
            await asyncio.wait({entering})
            raise

    def _entered_for_nobody(self, entering: asyncio.Future[Effect]) -> None:
        """A cancelled entry's begin has ended: nobody runs the block. Its ledger row stays
        begun (the next holder sees it interrupted, as after any block that did not end)."""
        if not entering.cancelled():
            entering.exception()  # retrieved: a failed begin was the caller's, who has gone
        self._unmark()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._unmark()
        effect = self._effect
        if exc_type is not None or effect is None or effect.done:
            return
        await sync_to_async(ledger.complete)(self._key, self._holder, self._using)
