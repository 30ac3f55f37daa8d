"""Waiting for a release's wake-up (``BLPOP`` on the name's wake-up list), sync and asyncio;
on a single node the wait is piped with the next attempt, so the server runs that attempt the
moment a release wakes the waiter (docs/algorithm.md, "Wake-ups")."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from .drive import PlanMaker
from .piped_lane import apiped_acquire, piped_acquire
from .plans import register_plan, waited_reply
from .policy import AwaitRelease, registration_ms
from .pools.channels import ChannelPools
from .pools.pick import pick
from .replies import NodeFailure
from .state import WAIT_MARK_MS, AcquireFailure, AliasState, LeaseRecord
from .targets import Target, Waiting, refused
from .transport.blpop import MIN_BLOCK, blpop_command

Outcome = LeaseRecord | AcquireFailure

#: How late (seconds) a piped wait's attempt may run and still register only within the
#: caller's timeout (see :meth:`ReleaseWaits.piped`).
PIPE_MARGIN = 0.25


class ReleaseWaits:
    """An engine's waits for releases: plain (:meth:`wait`) or piped with the next attempt
    (:meth:`piped`), on its pools' blocking connections."""

    def __init__(self, state: AliasState, pools: ChannelPools, node_count: int) -> None:
        self.state = state
        self.pools = pools
        self.node_count = node_count
        self._every = tuple(range(node_count))
        #: False once a node refused a piped ``BLPOP`` (an ACL without it): wait the old way
        self.piping = True

    def piped(
        self, target: Target, waiting: Waiting | None, step: AwaitRelease
    ) -> tuple[bool, Outcome] | None:
        """On a single node: block in ``BLPOP`` and make the next attempt in one write, so the
        server runs the attempt the moment a release wakes us (a hand-off then costs no round
        trip after the wake-up). Returns (woken, the attempt's outcome), or None where this
        does not apply (several nodes, ``lock_many``, a short wait, a node that refused)."""
        carried = self._carried(target, waiting, step)
        if carried is None or waiting is None:
            return None
        job = target.piped_attempt(waiting, carried, step.seconds)
        started = time.monotonic()
        channel = self.pools.blocking_channel()
        if channel is None:  # no blocking connection to be had: wait by polling
            return None
        try:  # the lane (a plain grant), else the plan resumed from its round
            outcome, ahead = self.pools.run_blocking_with(piped_acquire, job, channel)
        except BaseException:  # an interrupt, maybe before run_blocking_with's own clean-up
            self.pools.abandon_blocking(channel)
            raise
        rest = _not_waited(outcome, ahead, step, started, waiting)
        if rest > 0:  # never after a grant: an interrupt there would lose it
            time.sleep(rest)
        return self._outcome(target, outcome, ahead)

    async def apiped(
        self, target: Target, waiting: Waiting | None, step: AwaitRelease
    ) -> tuple[bool, Outcome] | None:
        """Asyncio twin of :meth:`piped`."""
        carried = self._carried(target, waiting, step)
        if carried is None or waiting is None:
            return None
        job = target.piped_attempt(waiting, carried, step.seconds)
        pools = await self.pools.loops.loop_pools()
        channel = pools.blocking.pop(pick(pools.blocking)) if pools.blocking else None
        if channel is None:
            if not self.pools.budget.take(self._every, blocking=True):
                self.pools.budget.make_room(self._every)  # a later wait blocks
                return None  # no blocking connection to be had: wait by polling
            pools.opened()
        started = time.monotonic()
        loops = self.pools.loops
        outcome, ahead = await loops.arun_blocking_with(apiped_acquire, job, pools, channel)
        rest = _not_waited(outcome, ahead, step, started, waiting)
        if rest > 0:  # never after a grant (nor an await point there: a cancellation would
            await asyncio.sleep(rest)  # land between the grant and its caller, and lose it)
        return self._outcome(target, outcome, ahead)

    def _carried(
        self, target: Target, waiting: Waiting | None, step: AwaitRelease
    ) -> tuple[tuple[str | int, ...], ...] | None:
        """The commands an attempt piped behind ``step``'s wait carries ahead of it (the
        registration, the ``BLPOP``), or None where piping does not apply."""
        if not (self.piping and waiting is not None and self.node_count == 1):
            return None
        if target.many or step.seconds < MIN_BLOCK:
            return None
        # The piped attempt's registration is sized before the wait, and a BLPOP can return
        # late on a loaded server: near the caller's deadline it could outlive the caller, so
        # the last stretch of a finite timeout waits the usual way.
        if waiting.deadline is not None and (
            waiting.deadline - time.monotonic() - step.seconds < PIPE_MARGIN + WAIT_MARK_MS / 1000
        ):
            return None
        name = target.name
        before: tuple[tuple[str | int, ...], ...] = ()
        mark_ms = registration_ms(waiting.deadline) if step.mark else 0
        if mark_ms > 0:
            before = (self.state.mark_command(name, waiting.waiter, mark_ms),)
        return (*before, blpop_command(self.state.keys.wake(name), step.seconds))

    def _outcome(self, target: Target, outcome: Any, ahead: list[Any]) -> tuple[bool, Outcome]:
        popped = waited_reply(ahead)
        if any(refused(reply) for reply in (popped, *ahead[:1], *ahead[-1:])):
            # e.g. NOPERM: BLPOP (or TIME) is refused, so the attempt did not wait (or its
            # validity counted from the write): wait the old way from now on
            self.piping = False
        return isinstance(popped, list), target.seen(outcome, None)

    def wait(self, name: str, seconds: float, mark: Waiting | None = None) -> bool:
        """Wait up to ``seconds`` for a release of ``name`` to wake this thread (True if so);
        ``mark``: first register this waiter (when no failed attempt did)."""
        mark_ms = 0 if mark is None else registration_ms(mark.deadline)
        before = None
        if mark is not None and mark_ms > 0:
            if self.node_count > 1:
                self.pools.run(self._register_elsewhere(name, mark.waiter, mark_ms))
            before = self.state.mark_command(name, mark.waiter, mark_ms)
        return self.pools.waiter.wait(self.state.keys.wake(name), name, seconds, before)

    def _register_elsewhere(self, name: str, waiter: str, mark_ms: int) -> PlanMaker[None]:
        """Register ``waiter`` on the nodes other than the wake-up node (fire-and-forget); the
        wake-up node gets it with the ``BLPOP``."""
        state = self.state
        return lambda nodes: register_plan(state, nodes, name, waiter, mark_ms)

    async def await_release(self, name: str, seconds: float, mark: Waiting | None = None) -> bool:
        """Asyncio twin of :meth:`wait`."""
        mark_ms = 0 if mark is None else registration_ms(mark.deadline)
        before = None
        if mark is not None and mark_ms > 0 and self.node_count > 1:
            await self.pools.loops.arun(self._register_elsewhere(name, mark.waiter, mark_ms))
        pools = await self.pools.loops.loop_pools()
        if mark is not None and mark_ms > 0:
            before = self.state.mark_command(name, mark.waiter, mark_ms)
        pools.opened()
        return await self.pools.waiter.await_release(
            self.state.keys.wake(name), name, seconds, pools.waiting, before
        )


def _not_waited(
    outcome: Any, ahead: list[Any], step: AwaitRelease, started: float, waiting: Waiting | None
) -> float:
    """How long a piped wait whose ``BLPOP`` failed (the node down or gone: it did not block)
    still has to wait, so that a waiter on a dead node waits its step instead of spinning;
    0.0 when it blocked (or was woken), or when its attempt won (the caller gets the lease
    at once). Never past the caller's deadline."""
    if type(outcome) is not AcquireFailure:  # a grant (one lease, or a set's)
        return 0.0
    if ahead and not isinstance(waited_reply(ahead), NodeFailure):
        return 0.0  # it was sent and blocked, or was woken (nothing sent: the link is down)
    now = time.monotonic()
    rest = step.seconds - (now - started)
    if waiting is not None and waiting.deadline is not None:
        rest = min(rest, waiting.deadline - now)
    return max(rest, 0.0)
