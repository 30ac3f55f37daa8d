"""A held lock: :class:`Lease` (renew, release, learn that it was lost); its auto-extend
drivers are in :mod:`.renewal`."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from .. import signals
from ..engine import (
    LOST,
    RENEWED,
    UNCONFIRMED,
    Engine,
    LeaseRecord,
    Renewal,
    RenewalBound,
    forks,
    handoff,
    release_unconfirmed,
    start_thread,
    why_unconfirmed,
)
from ..exceptions import LockError, LockLost, NodesUnavailable
from ..validation import check_ttl
from . import context
from .renewal import RenewalThread, renew_in_task

if TYPE_CHECKING:
    from ..effects.block import EffectBlock
    from .owner import LeaseOwner

# docs/index.md: one logger name (records carry .module)
logger = logging.getLogger("django_redlock")
#: Makes "lost" reported once per lease (the renewal thread and a release may both find it);
#: one for all leases: a lease is found lost rarely, and a mutex per lease costs every acquire.
_LOST_MUTEX = threading.Lock()


class Lease:
    """A held lock. ``token`` is its fencing token; ``validity`` the seconds it has left.

    Besides its API for applications it has a small surface for the app's own modules
    (blocks, ``lock_many`` sets, renewals, effects): ``record``, ``engine``, ``release_begin``/
    ``release_end``, ``renew_once``... Applications need not use those."""

    def __init__(
        self, manager: LeaseOwner, record: LeaseRecord, engine: Engine | None = None
    ) -> None:
        self._manager = manager
        #: the engine that holds it (``manager.engine_for(record.name)``, when not given)
        self.engine: Engine = manager.engine_for(record.name) if engine is None else engine
        #: what the engine knows of it (owner value, token, the channel it is pinned to...)
        self.record = record
        self._lost_sent = False
        self._renewer: RenewalThread | None = None
        self._renewal_task: asyncio.Task[None] | None = None
        #: until when the renewals go on (set when they start)
        self.renewal_bound: RenewalBound | None = None
        #: set to cut the renewal task's pause short (a shorter ``extend``)
        self.renewal_wakeup: asyncio.Event | None = None
        #: called once when the lease is found lost (``alock(on_lost="cancel")``)
        self.on_lost: Callable[[], None] | None = None
        #: when the lease was released (``time.monotonic()``; None while not released)
        self._released_at: float | None = None
        #: kept for a commit: True once its transaction ended without running the release
        #: (a rollback); the renewals then release it instead of renewing
        self.transaction_ended: Callable[[], bool] | None = None
        #: kept for a commit: True while that commit is still to come (re-entry in it)
        self.commit_pending: Callable[[], bool] | None = None
        #: lock blocks (and request locks, lock_many sets) holding it open now; the last to
        #: end lets it go
        self._blocks = 0
        #: the thread or task that released it
        self.released_by: object = None
        #: its entries in the active-lease context (see ``frames.entries_of``)
        self._redlock_context_entries: list[object] = []
        if (open_handoff := handoff.current()) is not None:
            open_handoff.leases.append(self)  # an interrupted acquire gives it back

    # -- the surface the app's own modules use (blocks, sets, request locks, records) ------
    @property
    def open_blocks(self) -> int:
        """The lock blocks (request locks, ``lock_many`` sets) holding it open now; the last
        to end lets it go."""
        return self._blocks

    def block_opened(self) -> None:
        """A block re-entered or took it: it stays held until that block ends too."""
        self._blocks += 1

    def block_closed(self) -> None:
        """A block of it ended (see :attr:`open_blocks`)."""
        self._blocks -= 1

    @property
    def name(self) -> str:
        return self.record.name

    @property
    def token(self) -> int:
        return self.record.token

    @property
    def alias(self) -> str:
        return self._manager.alias

    @property
    def ttl(self) -> float:
        return self.record.ttl

    @property
    def kind(self) -> str:
        """``""`` (a lock), ``"permit"`` (a semaphore's), ``"read"`` or ``"write"``."""
        return self.record.kind

    @property
    def waited(self) -> float:
        """Seconds the acquire call took (its waits and attempts)."""
        return self.record.waited

    @property
    def attempts(self) -> int:
        """How many attempts the acquire call made (1: the name was free)."""
        return self.record.attempts

    @property
    def votes(self) -> int:
        """How many nodes granted the lease (at least a quorum)."""
        return len(self.record.voters)

    @property
    def voters(self) -> list[str]:
        """The nodes that granted the lease (their labels, passwords masked)."""
        labels = self.engine.labels
        return [labels[i] for i in self.record.voters]

    @property
    def held(self) -> float:
        """Seconds from the acquisition until the release (until now while not released)."""
        end = time.monotonic() if self._released_at is None else self._released_at
        return max(0.0, end - self.record.acquired_at)

    @property
    def validity(self) -> float:
        """Seconds of validity left on a monotonic clock; 0 once lost, expired or released,
        and in a child process for its parent's lease (the child does not hold it)."""
        if self.foreign:
            return 0.0
        return self.record.validity()

    @property
    def lost(self) -> bool:
        """True once the lease expired or a node said someone else owns it (and in a child
        process for its parent's lease: the child cannot count on it)."""
        record = self.record
        return record.lost or (not record.released and record.validity() <= 0) or self.foreign

    @property
    def released(self) -> bool:
        return self.record.released

    @property
    def release_unconfirmed(self) -> bool:
        """True after :meth:`release` returned False because too few nodes confirmed it,
        while it is being sent again in the background (until the lease's validity ends)."""
        return release_unconfirmed(self.record)

    @property
    def foreign(self) -> bool:
        """True in a child process for a lease its parent acquired before the fork."""
        return not self.engine.owns(self.record)

    def ensure_own(self) -> None:
        if self.foreign:
            raise LockError(
                f"Lock {self.name!r} (alias {self.alias!r}) was acquired by the parent process "
                "before a fork; a child process cannot renew or release it (nothing was sent). "
                "Acquire the lock in the child, or let the parent release it."
            )

    def __repr__(self) -> str:  # the owner value is secret and never shown
        return (
            f"<Lease alias={self.alias!r} name={self.name!r} token={self.token} "
            f"validity={self.validity:.3f}>"
        )

    def check(self) -> None:
        """Raise ``LockLost`` if the lease is lost (expired, or a node said someone else owns
        it); call it before a step that must not run unprotected. In a child process, for a
        lease its parent acquired, or after a release too few nodes confirmed: ``LockError``."""
        self.ensure_own()
        if self.release_unconfirmed:
            raise LockError(
                f"Lock {self.name!r} (alias {self.alias!r}) was released, but too few nodes "
                f"confirmed it ({why_unconfirmed(self.record)}): the release is being sent "
                "again in the background until the lease's validity ends."
            )
        if self.lost:
            self._mark_lost("its validity ran out")
            raise LockLost(self.name, "it was found lost by check()")

    def once(self, key: str, *, using: str | None = None) -> EffectBlock:
        """``with lease.once(key) as effect:`` (or ``async with``): run an effect once under
        this lease. ``effect.done``, ``effect.pending`` and ``effect.interrupted`` say what
        earlier holders did; leaving the block without an exception marks it done in the
        caller's transaction, fenced by this lease's token (``django_redlock.models.Effect``
        in database ``using``; docs/effects.md)."""
        from ..effects.block import EffectBlock

        return EffectBlock(self, key, using)

    # -- renewing and releasing (blocking and asyncio twins share everything but the call) --
    def extend(self, ttl: float | None = None) -> None:
        """Renew the lease to ``ttl`` seconds (default: its TTL); raises ``LockLost``. Its
        auto-extend renewals, if any, go on every third of the new TTL."""
        self.ensure_own()
        before = self.record.ttl
        self._extended(self.engine.extend(self.record, self._ttl_for(ttl)), "extend()")
        self._rescheduled(before)

    async def aextend(self, ttl: float | None = None) -> None:
        """Asyncio twin of :meth:`extend`."""
        self.ensure_own()
        before = self.record.ttl
        self._extended(await self.engine.aextend(self.record, self._ttl_for(ttl)), "aextend()")
        self._rescheduled(before)

    def _rescheduled(self, ttl_before: float) -> None:
        """After an extend to a shorter TTL, the renewals' pause (a third of the old TTL) is
        cut to a third of the new one: the lease must not run out while they sleep."""
        if self.record.ttl >= ttl_before:
            return
        renewer, task, wakeup = self._renewer, self._renewal_task, self.renewal_wakeup
        if renewer is not None:
            renewer.hasten(self)
        if task is not None and wakeup is not None:
            task.get_loop().call_soon_threadsafe(wakeup.set)

    def release(self) -> bool:
        """Release the lock. True the first time if it was still held; never deletes a key
        that someone else owns."""
        try:
            if not self.release_begin():
                return False
            held = self.engine.release(self.record)
        except BaseException:  # an interrupt: the release still goes out, from the background
            self.release_interrupted()
            raise
        return self.release_end(held)

    def release_interrupted(self) -> None:
        """:meth:`release` was interrupted (a signal handler raised, or the release failed):
        the renewals stop and the engine sends the release again in the background."""
        if self.foreign:
            return  # the parent's lease: nothing was to be sent
        with contextlib.suppress(Exception):
            self.stop_auto_extend()
        with contextlib.suppress(Exception):
            context.deactivate(self)
        self.engine.release_unfinished(self.record)

    async def arelease(self) -> bool:
        """Asyncio twin of :meth:`release`. A cancellation (``task.cancel()``, ``wait_for``)
        while it runs is passed on, but the release still goes out, as an interrupted
        :meth:`release` does: the engine sends it again from the background until a quorum
        confirms it, so a cancelled caller does not leave its lease held until the TTL. (Not
        a shielded task per call: that cost three turns of the event loop per release.)"""
        if not self.release_begin():
            return False
        try:
            held = await self.engine.arelease(self.record)
        except BaseException:
            self.release_interrupted()
            raise
        return self.release_end(held)

    def _ttl_for(self, ttl: float | None) -> float:
        return self.record.ttl if ttl is None else check_ttl(ttl, self._manager.config.drift_factor)

    def _extended(self, renewal: Renewal, how: str) -> None:
        if renewal.status == RENEWED:
            return
        if renewal.status == UNCONFIRMED:  # still held, for the validity it had
            config = self._manager.config
            raise NodesUnavailable(
                self.name,
                answered=renewal.answered,
                quorum=config.quorum,
                total=len(config.nodes),
                errors=renewal.errors,
            )
        self._mark_lost(f"{how} found it no longer held")
        raise LockLost(self.name, f"it was no longer held when {how} ran")

    def release_begin(self) -> bool:
        """Stop renewing and stop guarding writes here; True if there is something to release."""
        if self.record.generation != forks.current:  # a child's copy of its parent's lease
            self.ensure_own()
        if self._renewer is not None or self._renewal_task is not None:
            self.stop_auto_extend()
        owner = context.deactivate(self)
        if self.record.released:
            return False
        self.released_by = owner  # a block's exit tells its own release apart
        return True

    def release_end(self, held: bool) -> bool:
        """After the engine's release (:meth:`release_begin` first): record it, a loss when it
        was no longer ``held``; ``lock_released`` is sent. Returns ``held``."""
        self._released_at = time.monotonic()
        if not held and not self.given_back_later():
            self._mark_lost("it had expired or was taken when it was released")
        if signals.wanted(signals.lock_released):
            signals.emit(
                signals.lock_released, self._manager, alias=self.alias, name=self.name, lease=self
            )
        return held

    def given_back_later(self) -> bool:
        """True when the release of this (valid) lease was unconfirmed and went to the
        background give-back: not a loss, even if the give-back has already ended (it used to
        count as one when the give-back was confirmed before the caller looked)."""
        return self.record.given_back and self.record.valid_at_release

    def _mark_lost(self, reason: str) -> None:
        self.record.lost = True
        with _LOST_MUTEX:
            if self._lost_sent:
                return
            self._lost_sent = True
        logger.warning("Lock %r (alias %r) lost: %s", self.name, self.alias, reason)
        signals.emit(signals.lock_lost, self._manager, alias=self.alias, name=self.name, lease=self)
        if self.on_lost is not None:
            self.on_lost()

    # -- auto-extend -----------------------------------------------------------------------
    def start_auto_extend(self, max_hold: float | None) -> None:
        """Renew from a daemon thread every third of the TTL until release or ``max_hold``."""
        start_renewals([self], max_hold)

    def astart_auto_extend(self, max_hold: float | None) -> None:
        """Renew from an asyncio task every third of the TTL until release or ``max_hold``."""
        loop = asyncio.get_running_loop()
        self.renewal_bound = RenewalBound(max_hold)
        self.renewal_wakeup = asyncio.Event()
        self._renewal_task = loop.create_task(renew_in_task(self, self.renewal_bound))

    def keep_alive(
        self, max_hold: float | None, *, longer: bool = True
    ) -> Callable[[], None] | None:
        """Renew until released, or for ``max_hold`` from now. Renewals already running go
        on at least that long (unless ``longer`` is False); renewals that stopped for good
        (their ``max_hold`` passed) are started afresh. Returns the call that undoes this
        (stops the renewals it started, or takes off the bound it added), or None."""
        bound = self.renewal_bound
        if (self._renewer is not None or self._renewal_task is not None) and bound is not None:
            if not bound.final:
                return bound.hold(max_hold) if longer else None
            self.stop_auto_extend()  # it only waits for the lease to run out: start afresh
        start_renewals([self], max_hold)
        return self.stop_auto_extend

    def stop_auto_extend(self) -> None:
        renewer = self._renewer
        if renewer is not None:
            renewer.stop(self)  # first: an interrupt in it leaves the renewer to stop again
            self._renewer = None
        task, self._renewal_task = self._renewal_task, None
        if task is not None:
            task.cancel()

    def renew_once(self) -> str:
        if self._ended_without_commit():
            self.release()
            return LOST  # ends the renewals (nothing reported: it was released)
        return self._renewal_status(self.engine.extend(self.record, self.ttl))

    async def arenew_once(self) -> str:
        if self._ended_without_commit():
            self._renewal_task = None  # this very task releases: do not cancel it
            await self.arelease()
            return LOST
        return self._renewal_status(await self.engine.aextend(self.record, self.ttl))

    def _ended_without_commit(self) -> bool:
        """Kept for a commit whose transaction ended without it (a rollback whose discarded
        callback is still referenced, or a commit whose earlier hook raised)."""
        ended = self.transaction_ended
        return ended is not None and ended()

    def _renewal_status(self, renewal: Renewal) -> str:
        if renewal.status == LOST:
            self._mark_lost("a renewal found it no longer held")
        elif renewal.status == UNCONFIRMED:
            logger.info("Lock %r (alias %r): renewal unconfirmed, retrying", self.name, self.alias)
        return renewal.status

    def renewals_ended(self, why: str | None) -> None:
        """The renewals ended without a renewal finding the lease lost: it ran out."""
        if why is not None and not self.record.released:
            self._mark_lost(
                "max_hold reached; the lease ran out"
                if why == "max_hold"
                else "no quorum confirmed a renewal before its validity ran out"
            )


def start_renewals(leases: list[Lease], max_hold: float | None) -> None:
    """Renew ``leases`` (a ``lock_many`` set, or one lease) from one daemon thread, each every
    third of its TTL, until each is released or ``max_hold`` passes: a set of a thousand
    names is one thread, not a thousand."""
    for lease in leases:
        lease.renewal_bound = RenewalBound(max_hold)
    renewer = RenewalThread(leases)
    for lease in leases:
        lease._renewer = renewer
    start_thread(renewer)  # a signal handler's exception here cannot leave it half started


def keep_alive_all(leases: list[Lease], max_hold: float | None) -> list[Lease]:
    """:meth:`Lease.keep_alive` for several leases, those not renewed yet sharing one thread;
    returns those it started renewing."""
    idle = [lease for lease in leases if lease._renewer is None and lease._renewal_task is None]
    if idle:
        start_renewals(idle, max_hold)
    return idle
