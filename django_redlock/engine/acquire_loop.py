"""The acquire loop of one call, written once for both drivers.

After a first attempt that failed (or none, for a caller that queues at once), the acquire
policy decides what comes next. :func:`acquire_loop` turns its steps into the I/O requests
below and returns the outcome; ``Engine._acquire`` (blocking) and ``Engine._aacquire``
(asyncio) each carry the requests out in a few lines, so which attempt to make, when to pipe
an attempt behind a wait and when to register as a waiter are decided in one place.
"""

from __future__ import annotations

from collections.abc import Generator
from dataclasses import dataclass
from typing import Any

from .policy import AcquireStep, Attempt, AwaitRelease, Pause, Stepper
from .targets import Outcome, Target, Waiting, answer_piped, deadline_of


@dataclass(frozen=True, slots=True)
class Try:
    """Make one attempt (the target's lane, else its plan: ``Engine._run_attempt``), waiting
    for a connection until ``until``; receives what ``ChannelPools.run`` returns (the outcome
    and the channel it ran on). ``woken``: a release woke the caller."""

    until: float
    woken: bool = False


@dataclass(frozen=True, slots=True)
class Pipe:
    """Wait for a release with the next attempt written behind the wait (single node);
    receives (woken, outcome), or None where piping does not apply."""

    step: AwaitRelease


@dataclass(frozen=True, slots=True)
class Wait:
    """Wait up to ``seconds`` for a release of ``name`` the usual way; receives True if one
    woke us. ``mark``: register as a waiter first (when no failed attempt did)."""

    name: str
    seconds: float
    mark: Waiting | None


LoopRequest = Try | Pipe | Wait | Pause


def acquire_loop(
    target: Target, waiting: Waiting | None, policy: Generator[AcquireStep, Any, Outcome]
) -> Generator[LoopRequest, Any, Any]:
    """Run ``policy`` for ``target``: yields the requests above, returns the outcome."""
    run = Stepper(policy)
    while run.step is not None:
        step = run.step
        if isinstance(step, Attempt):
            ran = yield Try(deadline_of(waiting), step.woken)
            run.send(target.seen(*ran))
        elif isinstance(step, AwaitRelease):
            piped = yield Pipe(step)
            if piped is None:
                mark = waiting if step.mark or target.many else None
                run.send((yield Wait(target.name, step.seconds, mark)))
            else:
                answer_piped(run, *piped)
        else:
            yield step  # a Pause: sleep
            run.send(None)
    return run.result
