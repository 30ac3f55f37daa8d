"""What one acquire call carries through the engine's loops: its :class:`Target` (the names,
the kind, how an attempt is made), its :class:`Waiting` registration, the count of waiting
calls, and small helpers of the loops. No I/O."""

from __future__ import annotations

import math
import threading
import time
from typing import Any

from . import forks
from .drive import PlanMaker
from .keyspace import new_waiter
from .kinds import PERMIT
from .lane import LaneAttempt
from .piped_lane import PipedAttempt
from .plans import acquire_limits_plan, acquire_many_plan, acquire_plan
from .plans.rounds import Sent
from .policy import Attempt, Stepper, registration_ms
from .pools.budget import SPARE
from .replies import NodeFailure
from .state import AcquireFailure, AliasState, LeaseRecord
from .transport.aio import AsyncChannel
from .transport.blpop import SLACK
from .transport.sync import Channel

Outcome = LeaseRecord | AcquireFailure


class WaiterCount:
    """How many acquire calls are waiting now: ``with count:`` around one call's waiting.
    Entered only by a call whose first attempt failed, so a free name costs nothing."""

    __slots__ = ("_mutex", "value")

    def __init__(self) -> None:
        self._mutex = threading.Lock()
        self.value = 0

    def __enter__(self) -> None:
        with self._mutex:
            self.value += 1

    def __exit__(self, *exc_info: object) -> None:
        with self._mutex:
            self.value -= 1


class Target:
    """What one acquire call asks for: a lock, one permit of a semaphore (``permits`` > 0),
    a set of names (``lock_many``) or a permit of each of several semaphores (``limits``: the
    permits of each name, in order), and the name it waits for (for a set: the one its last
    attempt found busy)."""

    __slots__ = (
        "attempts",
        "lane",
        "limits",
        "many",
        "name",
        "names",
        "permits",
        "rw",
        "started",
        "state",
        "ttl",
    )

    def __init__(
        self,
        state: AliasState,
        names: tuple[str, ...],
        ttl: float,
        permits: int,
        rw: str = "",
        limits: tuple[int, ...] = (),
    ) -> None:
        self.state, self.names, self.ttl, self.permits, self.rw = state, names, ttl, permits, rw
        self.limits = limits
        self.name = names[0]
        self.many = len(names) > 1
        #: one name (a lock, a permit, a read or a write lease): what the lanes take
        self.lane = not self.many
        self.started = time.monotonic()
        self.attempts = 0

    def lane_attempt(self, waiting: Waiting | None, woken: bool = False) -> LaneAttempt:
        """An attempt of a lease on one name, for the lanes: the first, or one of the acquire
        loop's (``woken``: a release woke this caller, as :meth:`attempt`'s)."""
        waiter, mark_ms = "", 0
        if waiting is not None:
            waiter, mark_ms = waiting.waiter, registration_ms(waiting.deadline)
        return LaneAttempt(
            self.state,
            self.name,
            self.ttl,
            waiter,
            mark_ms,
            woken,
            lambda sent: self.attempt(waiting, woken, sent=sent),
            PERMIT if self.permits else self.rw,
            self.permits,
        )

    def piped_attempt(
        self, waiting: Waiting, before: tuple[tuple[str | int, ...], ...], wait: float
    ) -> PipedAttempt:
        """A woken attempt on one name carried behind ``before`` (a waiter's registration
        and ``BLPOP`` of up to ``wait`` seconds), for the piped wait's lane; it registers
        as :meth:`attempt` does (when it runs: after the wait, at worst)."""
        attempt = LaneAttempt(
            self.state,
            self.name,
            self.ttl,
            waiting.waiter,
            registration_ms(waiting.deadline, wait),
            True,
            lambda sent: self.attempt(waiting, True, before, wait, sent=sent),
            PERMIT if self.permits else self.rw,
            self.permits,
        )
        return PipedAttempt(attempt, before, wait + SLACK)

    def attempt(
        self,
        waiting: Waiting | None,
        woken: bool,
        before: tuple[tuple[str | int, ...], ...] = (),
        wait: float = 0.0,
        sent: Sent | None = None,
    ) -> PlanMaker[Any]:
        """The attempt's plan; ``before`` (a single lock, semaphore or read-write lease):
        commands sent ahead of it that block up to ``wait`` seconds (a ``BLPOP``); ``sent``:
        its first round, already made by the single-node lane."""
        state, ttl = self.state, self.ttl
        waiter, mark_ms = "", 0
        if waiting is not None:  # None: timeout=0, never registers as a waiter
            # an attempt piped behind a wait registers when it runs: after the wait, at worst
            waiter, mark_ms = waiting.waiter, registration_ms(waiting.deadline, wait)
        wait += SLACK if wait else 0.0
        if self.many and self.limits:
            names, limits = self.names, self.limits
            # a woken caller may use the reservation of the semaphore it waited for only
            index = names.index(self.name) + 1 if woken else 0
            return lambda nodes: acquire_limits_plan(
                state, nodes, names, limits, ttl, waiter=waiter, mark_ms=mark_ms, woken=index
            )
        if self.many:
            names = self.names
            return lambda nodes: acquire_many_plan(
                state, nodes, names, ttl, waiter=waiter, mark_ms=mark_ms, woken=woken
            )
        name, permits, rw = self.name, self.permits, self.rw
        return lambda nodes: acquire_plan(
            state,
            nodes,
            name,
            ttl,
            waiter=waiter,
            mark_ms=mark_ms,
            woken=woken,
            permits=permits,
            rw=rw,
            before=before,
            wait=wait,
            sent=sent,
        )

    def seen(self, result: Any, channel: Channel | AsyncChannel | None) -> Any:
        """Count the attempt and stamp its outcome with the call's wait so far (what signals
        and metrics report); pin won leases to ``channel`` (None: to none); after a failed
        set, wait for its busy name."""
        self.attempts += 1
        now = time.monotonic()
        if type(result) is AcquireFailure:
            result.waited, result.attempts = now - self.started, self.attempts
            if result.busy_name is not None:
                self.name = result.busy_name
            return result
        generation = forks.current
        for record in result if isinstance(result, list) else (result,):
            record.pinned, record.generation = channel, generation  # as pin() does
            record.waited, record.attempts, record.acquired_at = (
                now - self.started,
                self.attempts,
                now,
            )
        return result


class Waiting:
    """One ``acquire()`` call that waits: its waiter id (one per call, registered on the nodes
    by its failed attempts) and its deadline (``time.monotonic()``; None: no timeout)."""

    __slots__ = ("deadline", "waiter")

    def __init__(self, waiter: str, deadline: float | None) -> None:
        self.waiter = waiter
        self.deadline = deadline

    @classmethod
    def of(cls, started: float, timeout: float | None) -> Waiting | None:
        """None for ``timeout=0`` (one attempt, never registered)."""
        if timeout == 0:
            return None
        return cls(new_waiter(), None if timeout is None else started + timeout)


def answer_piped(run: Stepper[Any], woken: bool, outcome: Outcome) -> None:
    """Answer a policy's wait, and the attempt it asks next, with a piped wait's outcome."""
    run.send(woken)
    assert isinstance(run.step, Attempt)  # the attempt that was piped with the wait
    run.send(outcome)


def refused(reply: Any) -> bool:
    """True for a reply saying the node refuses the command (an ACL without it)."""
    return isinstance(reply, NodeFailure) and reply.reason.startswith("ResponseError")


def pin(result: Outcome, channel: Channel | AsyncChannel | None) -> Outcome:
    """Remember the channel a won lease was acquired on (its renewals and release follow it)
    and the process generation it belongs to."""
    if isinstance(result, LeaseRecord):
        result.pinned = channel
        result.generation = forks.current
    return result


def deadline_of(waiting: Waiting | None) -> float:
    """How long an attempt may wait for a connection: until the acquire's deadline (forever
    without one); a ``timeout=0`` attempt: :data:`SPARE`."""
    if waiting is None:
        return SPARE
    return math.inf if waiting.deadline is None else waiting.deadline
