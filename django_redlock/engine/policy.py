"""When to try again and when to renew, as I/O-free generators (like the plans).

:func:`acquire_policy` yields :class:`Attempt`, :class:`AwaitRelease` and :class:`Pause` steps
and receives what each step gave; :func:`renewal_policy` yields :class:`Pause` and
:class:`Renew`. A sync and an asyncio driver of a few lines each run them (``Engine.acquire``
and ``Engine.aacquire``; the lease's renewal thread and task), so waiting, backoff and renewal
are written once. :class:`Stepper` is the small loop every driver uses.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Generator
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from .state import LOST, RENEWED, WAIT_MARK_MS, AcquireFailure, LeaseRecord

T = TypeVar("T")

#: Longest single backoff between attempts when no wake-up arrives, seconds. Each attempt
#: renews the caller's registration as a waiter (``WAIT_MARK_MS``, 1 s), so one wait must end
#: well within it, round trips and scheduling included: a blocked waiter is always registered.
MAX_BACKOFF = 0.8
#: A woken waiter that still finds the name busy on some nodes while others granted it (the
#: release has not reached every node yet) retries this often, this many times, while the name
#: is reserved for it, before waiting again. One that no node granted lost the name to another
#: caller (the node it blocks on woke it after the release ran there): it waits again at once.
HANDOFF_RETRY = 0.0005
HANDOFF_RETRIES = 10
#: A permit whose token lost a race on a lagging node (no one holds the name: see
#: :attr:`~.state.AcquireFailure.raced`) is tried again at once this many times, a
#: ``timeout=0`` call too (else about a third of twelve simultaneous first permits of distinct
#: free semaphores on three nodes failed).
RACED_RETRIES = 10


@dataclass(frozen=True, slots=True)
class Attempt:
    """Run one acquire plan; receives its :class:`LeaseRecord` or :class:`AcquireFailure`."""

    woken: bool


@dataclass(frozen=True, slots=True)
class AwaitRelease:
    """Block until a release wakes us or ``seconds`` pass; receives True if woken. ``mark``:
    first register as a waiter (when no failed attempt did)."""

    seconds: float
    mark: bool = False


@dataclass(frozen=True, slots=True)
class Pause:
    """Sleep ``seconds``; receives None."""

    seconds: float


@dataclass(frozen=True, slots=True)
class Renew:
    """Extend the lease once; receives True if it was renewed (False: lost)."""


AcquireStep = Attempt | AwaitRelease | Pause
RenewalStep = Pause | Renew


class Stepper(Generic[T]):
    """Runs a step generator: ``step`` is the pending step (None once finished), ``send()``
    answers it, ``result`` is the generator's return value."""

    __slots__ = ("_steps", "result", "step")

    def __init__(self, steps: Generator[Any, Any, T]) -> None:
        self._steps = steps
        self.result: T | None = None
        self.step: Any = None
        self.send(None)

    def send(self, reply: Any) -> None:
        try:
            self.step = self._steps.send(reply)
        except StopIteration as done:
            self.step, self.result = None, done.value


def backoff_delay(base: float, attempt: int) -> float:
    """Full-jitter exponential backoff: uniform in [base/2, base * 2**attempt], capped."""
    ceiling = min(MAX_BACKOFF, base * (2 ** min(attempt, 16)))
    return random.uniform(min(base / 2, ceiling), ceiling)


def registration_ms(deadline: float | None, after: float = 0.0) -> int:
    """How long a waiter registered now (or ``after`` seconds from now: an attempt piped
    behind a wait) stays registered, ms: ``WAIT_MARK_MS``, or less when the caller's
    ``deadline`` (``time.monotonic()``; None: none) comes sooner, so a caller that gives up
    stops counting then; 0 (do not register) once the deadline has passed."""
    if deadline is None:
        return WAIT_MARK_MS
    return max(0, min(WAIT_MARK_MS, int((deadline - time.monotonic() - after) * 1000)))


class Patience:
    """When to try again: after a release wakes us, or at most a jittered exponential backoff,
    the holder's remaining TTL and what is left of ``timeout``; a woken waiter first retries
    quickly while the hand-off is reserved for it."""

    def __init__(
        self, retry_delay: float, timeout: float | None, started: float | None = None
    ) -> None:
        self._retry_delay = retry_delay
        start = time.monotonic() if started is None else started
        self._deadline = None if timeout is None else start + timeout
        self._attempt = 0
        self._quick = 0

    def _backoff(self) -> float:
        delay = backoff_delay(self._retry_delay, self._attempt)
        self._attempt += 1
        return delay

    def first_wait(self) -> float:
        """How long to wait in line before the first attempt (see :func:`acquire_policy`)."""
        delay = self._backoff()
        return delay if self._deadline is None else min(delay, self._deadline - time.monotonic())

    def next_step(self, failure: AcquireFailure, woken: bool) -> AwaitRelease | Pause | None:
        """What to do before the next attempt, or None when the timeout is used up."""
        remaining = None if self._deadline is None else self._deadline - time.monotonic()
        if remaining is not None and remaining <= 0:
            return None
        if failure.retried_quickly(woken) and self._quick < HANDOFF_RETRIES:
            self._quick += 1
            return Pause(HANDOFF_RETRY if remaining is None else min(HANDOFF_RETRY, remaining))
        self._quick = 0
        delay = self._backoff()
        if failure.retry_after is not None:
            delay = min(delay, failure.retry_after + 0.001)
        return AwaitRelease(delay if remaining is None else min(delay, remaining))


def acquire_policy(
    retry_delay: float,
    timeout: float | None,
    *,
    queue_first: bool = False,
    first: AcquireFailure | None = None,
    started: float | None = None,
) -> Generator[AcquireStep, Any, LeaseRecord | AcquireFailure]:
    """Attempts until one succeeds or ``timeout`` (counted from ``started``) runs out
    (0: one attempt; None: forever), or until one fails for a reason no wait ends
    (:attr:`~.state.AcquireFailure.final`: the name is taken as another kind). A permit
    whose token lost a race (:attr:`~.state.AcquireFailure.raced`) is tried again at once,
    up to :data:`RACED_RETRIES` times, with ``timeout=0`` too (its give-back registered
    nobody, so a wait after the last of them registers first).

    ``first``: the failure of a first attempt the driver already made (the common case, a free
    name, then needs no policy at all). ``queue_first``: this process has just handed the name
    to a waiter, so a first attempt is bound to fail; the caller goes straight to the back of
    the line (registering as a waiter in the same write as its ``BLPOP``), which saves a
    doomed round trip per hand-off. If the wake-up never comes, its wait (one backoff step)
    ends and it tries normally."""
    patience, woken, raced = Patience(retry_delay, timeout, started), False, 0
    if queue_first:
        woken = yield AwaitRelease(patience.first_wait(), mark=True)
    result: LeaseRecord | AcquireFailure = first if first is not None else (yield Attempt(woken))
    while isinstance(result, AcquireFailure) and not result.final:
        if result.raced and raced < RACED_RETRIES:  # nobody holds it: again, at once
            raced += 1
            result = yield Attempt(woken)
            continue
        if timeout == 0:
            break
        step = patience.next_step(result, woken)
        if step is None:
            break
        if isinstance(step, AwaitRelease):
            if result.raced:  # its give-back registered nobody (it was to try again at once)
                step = AwaitRelease(step.seconds, mark=True)
            woken = yield step
        else:
            yield step  # a woken waiter stays woken while it retries quickly
        result = yield Attempt(woken)
    return result


class RenewalBound:
    """Until when a lease's renewals go on: the latest of the bounds held on it, each
    ``max_hold`` seconds from when it was taken (None: no bound). A re-entered block that
    asks to be kept alive longer than the outer block holds a later bound while it runs."""

    __slots__ = ("_until", "final")

    def __init__(self, max_hold: float | None) -> None:
        self._until: list[float | None] = [_until(max_hold)]
        #: True once the renewals stopped for good and the lease is left to run out
        self.final = False

    def hold(self, max_hold: float | None) -> Callable[[], None]:
        """Keep renewing for ``max_hold`` (None: until stopped) from now; returns the call
        that takes this bound off again."""
        until = _until(max_hold)
        self._until.append(until)
        return lambda: self._until.remove(until)

    def passed(self) -> bool:
        bounds = self._until
        return None not in bounds and time.monotonic() >= max(b for b in bounds if b is not None)


def _until(max_hold: float | None) -> float | None:
    return None if max_hold is None else time.monotonic() + max_hold


def renewal_policy(
    lease: LeaseRecord, bound: RenewalBound
) -> Generator[RenewalStep, Any, str | None]:
    """Renew every third of the TTL. ``Renew`` receives ``RENEWED``, ``LOST`` or
    ``UNCONFIRMED`` (see :class:`~.state.Renewal`).

    An unconfirmed renewal (nodes slow or down) is retried every tenth of the TTL while the
    lease is still valid. Returns None after a renewal found the lease lost (already reported),
    ``"ran out"`` when its validity ran out before a quorum confirmed a renewal, and
    ``"max_hold"`` when every ``bound`` passed and the lease then ran out on its own."""
    while True:
        yield Pause(lease.ttl / 3)
        if bound.passed():
            bound.final = True
            yield Pause(lease.validity())
            return "max_hold"
        while (outcome := (yield Renew())) != RENEWED:
            if outcome == LOST:
                return None
            left = lease.validity()
            if left <= 0:
                return "ran out"
            yield Pause(min(lease.ttl / 10, left / 2))
