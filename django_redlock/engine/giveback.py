"""Releases whose compare-and-delete was not confirmed: sent again, then given back in the
background, so a broken connection never leaves a name locked that nobody can release.

A release counts as done on a node only when the node answered it (:func:`.plans.lease.
counted_release`). Where too few nodes answered (a connection closed before or while the
release was sent, a node that did not answer in time), :func:`confirm` sends it once more at
once, on the connection the new call gets (the driver reconnects a connection that just broke
before it sends). Still unconfirmed, the lease is marked ``unconfirmed``
(``Lease.check()`` says so) and a daemon thread (:class:`GiveBack`) sends it again after
:data:`RETRY_EVERY` seconds, then less often, until a quorum confirms it or the lease's
validity ends (its keys expire on the nodes by then). The grants of a failed attempt whose
give-back did not reach a node (``state.owed``) are given back the same way
(:func:`settle_owed`).

A release a quorum confirmed may still have stragglers: nodes that did not answer it. One
thread per alias (:class:`Stragglers`) sends it to them again until the lease's validity ends,
so not even a minority of the nodes keeps the name for its TTL; the caller's ``release()`` is
not delayed by them.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
from collections.abc import Awaitable, Callable
from time import monotonic, sleep
from typing import Any

from . import starter
from .plans import release_again_plan
from .plans.lease import late_answers
from .state import AliasState, LeaseRecord

logger = logging.getLogger("django_redlock")

#: Seconds before the first background send of an unconfirmed release; doubled after each
#: send that was not confirmed, up to :data:`RETRY_AT_MOST`.
RETRY_EVERY = 0.1
RETRY_AT_MOST = 1.0

Run = Callable[[Callable[[Any], Any]], bool]
ARun = Callable[[Callable[[Any], Any]], Awaitable[bool]]


def _again(
    state: AliasState, lease: LeaseRecord, *, background: bool = False
) -> Callable[[Any], Any]:
    return lambda nodes: release_again_plan(state, nodes, lease, background=background)


def confirm(state: AliasState, lease: LeaseRecord, held: bool, run: Run, background: Run) -> bool:
    """``held`` (the release's outcome), once the release is confirmed where it was not:
    sent again now with ``run``, then in the background with ``background`` (see the module
    docstring)."""
    if _answered(state, lease, background):
        return held
    try:
        confirmed = run(_again(state, lease))
    except Exception as exc:  # the nodes are down: the background give-back keeps trying
        logger.debug("Release of %r: sending it again failed: %r", lease.name, exc)
        confirmed = False
    return _settled(state, lease, confirmed, background)


async def aconfirm(
    state: AliasState, lease: LeaseRecord, held: bool, arun: ARun, background: Run
) -> bool:
    """Asyncio twin of :func:`confirm` (the background give-back runs in a thread)."""
    if _answered(state, lease, background):
        return held
    try:
        confirmed = await arun(_again(state, lease))
    except Exception as exc:
        logger.debug("Release of %r: sending it again failed: %r", lease.name, exc)
        confirmed = False
    return _settled(state, lease, confirmed, background)


def _answered(state: AliasState, lease: LeaseRecord, run: Run) -> bool:
    """True when the release's outcome is known: every node answered, or a quorum confirmed
    it (the nodes left are stragglers, sent to in the background, as are nodes to look at
    once more for a late grant)."""
    if (lease.unsure and lease.settled) or (lease.recheck and not lease.unsure):
        Stragglers.add(state, lease, run)
    return not lease.unsure or lease.settled


def _settled(state: AliasState, lease: LeaseRecord, confirmed: bool, run: Run) -> bool:
    """After the release was sent again: its outcome, with a background give-back started
    only for nodes that still did not answer (not for ones that said "not yours")."""
    if confirmed:
        if lease.unsure or lease.recheck:
            Stragglers.add(state, lease, run)
        return lease.valid_at_release
    if lease.unsure:
        GiveBack(state, lease, run).begin()
    return False


def _pending(state: AliasState, lease: LeaseRecord) -> bool:
    """Whether ``lease``'s release is still worth sending: nodes did not answer it (late
    answers counted first), its keys have not expired, and its engine is open."""
    late_answers(lease)
    return bool(lease.unsure or lease.recheck) and monotonic() < lease.deadline and not state.closed


class GiveBack(threading.Thread):
    """Sends one unconfirmed release again until a quorum confirms it or the lease's validity
    ends; ``unconfirmed`` (on the record) is True meanwhile."""

    #: the give-backs running now, by lease record (read by ``Lease.check()`` and tests)
    running: dict[int, GiveBack] = {}
    _lock = threading.Lock()

    def __init__(
        self, state: AliasState, lease: LeaseRecord, run: Run, *, quiet: bool = False
    ) -> None:
        super().__init__(name=f"redlock-give-back {lease.name}", daemon=True)
        self._state, self._lease, self._run, self._quiet = state, lease, run, quiet

    def begin(self) -> None:
        """Start it, safely in the main thread (see :mod:`.starter`): once this returns,
        ``running`` lists it; an interrupt during the call leaves it starting soon after.
        Not while the interpreter exits (no thread would run): the keys expire with their
        TTL."""
        if sys.is_finalizing():
            return
        self._lease.given_back = True
        starter.start_thread(self)

    def start(self) -> None:
        """Register and start it (called by :meth:`begin`, never in the main thread
        directly: there a signal handler's exception could kill the new thread)."""
        with GiveBack._lock:
            GiveBack.running[id(self._lease)] = self
        try:
            super().start()
        except BaseException:  # cannot start new thread: its keys expire with their TTL
            with GiveBack._lock:
                GiveBack.running.pop(id(self._lease), None)
            raise
        if self._quiet:  # a failed attempt's grant: nobody holds it, nothing to report
            logger.debug("Giving back the grant of a failed attempt on %r", self._lease.name)
        else:
            logger.warning(
                "Release of lock %r not confirmed by a quorum of nodes (%s): giving it back "
                "in the background until its validity ends",
                self._lease.name,
                why_unconfirmed(self._lease),
            )

    def run(self) -> None:
        lease, pause = self._lease, RETRY_EVERY
        try:
            while _pending(self._state, lease):
                sleep(min(pause, max(0.0, lease.deadline - monotonic())))
                pause = min(pause * 2, RETRY_AT_MOST)
                try:
                    if self._run(_again(self._state, lease, background=True)):
                        break
                except Exception:
                    continue
        finally:
            with GiveBack._lock:
                GiveBack.running.pop(id(lease), None)
        if _pending(self._state, lease):
            Stragglers.add(self._state, lease, self._run)


class Stragglers(threading.Thread):
    """Sends the releases a quorum confirmed again to the nodes that did not answer them, one
    thread per alias for all of them (a node down for minutes must not start a thread per
    release); at most :attr:`LIMIT` waiting, the oldest dropped (their keys expire anyway)."""

    LIMIT = 10_000
    #: reentrant: ``add`` builds a thread under it, and a collection the allocation sets off
    #: may finalize an unclosed ``@lock`` generator, whose release adds to the stragglers
    _lock = threading.RLock()

    def __init__(self, state: AliasState, run: Run) -> None:
        super().__init__(name="redlock-give-back stragglers", daemon=True)
        self._state, self._run = state, run
        #: the releases to send again, with when each was added
        self._waiting: list[tuple[LeaseRecord, float]] = []

    @classmethod
    def add(cls, state: AliasState, lease: LeaseRecord, run: Run) -> None:
        if state.closed or sys.is_finalizing():  # a worker would stop at once, or never run
            return
        new = None
        with cls._lock:
            worker = state.stragglers
            # a worker not started yet (``ident`` None) is starting: it takes this one too
            if not isinstance(worker, Stragglers) or not (
                worker.ident is None or worker.is_alive()
            ):
                worker = new = state.stragglers = Stragglers(state, run)
            worker._waiting.append((lease, monotonic()))
            del worker._waiting[: -cls.LIMIT]
        if new is not None:
            try:
                starter.start_thread(new)  # never split by a signal handler's exception
            except RuntimeError:  # cannot start new thread: the next add() tries again
                with cls._lock:
                    if state.stragglers is new:
                        state.stragglers = None
                raise
        logger.debug("Release of %r: sending it again to the nodes that did not answer", lease.name)

    def run(self) -> None:
        pause = RETRY_EVERY
        while not self._state.closed:
            sleep(pause)
            now = monotonic()
            with Stragglers._lock:
                self._waiting[:] = [w for w in self._waiting if _pending(self._state, w[0])]
                due = [r for r, since in self._waiting if _due(r, now - since, now)]
            for lease in due:
                try:
                    self._run(_again(self._state, lease, background=True))
                except Exception as exc:  # no traceback: formatting one races other threads'
                    logger.debug("Release of %r: a straggler failed: %r", lease.name, exc)
            with Stragglers._lock:
                if not any(r.unsure or r.recheck for r, _ in self._waiting):
                    if self._state.stragglers is self:  # the next add() starts a new thread
                        self._state.stragglers = None
                    return
            pause = min(pause * 2, RETRY_AT_MOST)


def _due(lease: LeaseRecord, waited: float, now: float) -> bool:
    """Whether a straggler that waited ``waited`` seconds is sent again now: at once when a
    node's connection broke or it refused; after :data:`RETRY_AT_MOST` while every unsure
    node's release is on the wire with its answer not read yet (the next call on that
    connection reads it, so a busy process sends nothing twice; a node that never answers is
    sent to after that); a node only to look at once more, at its time."""
    if not lease.unsure:
        return now >= min(lease.recheck.values(), default=0.0)
    late = lease.late
    if all((slot := late.get(i)) is not None and not slot.done for i in lease.unsure):
        return waited >= RETRY_AT_MOST
    return True


def _after_fork_in_child() -> None:
    """A child process gives back none of its parent's leases, and must not wait for a lock
    a parent's give-back thread held at the fork."""
    GiveBack._lock = threading.Lock()
    GiveBack.running = {}
    Stragglers._lock = threading.RLock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def settle_owed(state: AliasState, run: Run) -> None:
    """Give back, in the background, the grants whose give-back an attempt could not send
    (``state.owed``: the connection to their node had broken with the reply unread)."""
    if state.owed:  # popped in the starter: an interrupt cannot drop one between pop and start
        starter.call_soon(lambda: _give_back_owed(state, run))


def _give_back_owed(state: AliasState, run: Run) -> None:
    while state.owed:
        GiveBack(state, state.owed.pop(), run, quiet=True).begin()


def why_unconfirmed(lease: LeaseRecord) -> str:
    """Why ``lease``'s release is unconfirmed: each node's reason (a refused command names
    the permission its ACL user lacks), or the usual causes when none was recorded."""
    return lease.unsure_why or "a connection broke, or nodes did not answer"


def unconfirmed(lease: LeaseRecord) -> bool:
    """True while ``lease``'s release is not confirmed and its give-back is still trying."""
    return id(lease) in GiveBack.running
