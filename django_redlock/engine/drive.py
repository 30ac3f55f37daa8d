"""Run one plan on one channel to its end: blocking (:func:`drive`) or asyncio
(:func:`adrive`); a caller that gives up mid-call lets the plan undo what it may have done."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from .replies import Request
from .state import Abandoned, NodeView, Plan
from .transport.aio import AsyncChannel
from .transport.sync import Channel

T = TypeVar("T")
#: Makes a plan for the nodes of a channel (its links).
PlanMaker = Callable[[Sequence[NodeView]], Plan[T]]


def drive(make_plan: PlanMaker[T], channel: Channel) -> T:
    # the generator protocol by hand, not a Stepper: this loop runs for every lock call
    channel.prepare()
    plan = make_plan(channel.links)
    try:
        request = next(plan)
        while True:
            try:
                replies = channel.execute(request)
            except BaseException:  # an interrupt (KeyboardInterrupt, a worker timeout) mid-call
                _abandon(plan, channel.execute)
                raise
            request = plan.send(replies)
    except StopIteration as done:
        return done.value  # type: ignore[no-any-return]


def _abandon(plan: Plan[Any], send_now: Callable[[Request], Any]) -> None:
    """The caller gave up while a request was in flight: let the plan undo what it may have
    done (fire-and-forget requests, sent at once), whatever it was."""
    try:
        request = plan.throw(Abandoned())
        while True:
            send_now(request)
            request = plan.send([None] * len(request.calls))
    except (Abandoned, StopIteration):
        pass


def give_up(make_plan: PlanMaker[Any], channel: Channel | AsyncChannel) -> None:
    """Run a plan that only undoes (one resumed from an abandoned :class:`~.plans.rounds.Sent`
    round: it yields its fire-and-forget give-backs, then raises ``Abandoned``); on an
    asyncio channel they are written at once, without an await."""
    send: Callable[[Request], Any] = (
        channel.execute if isinstance(channel, Channel) else channel.send_now
    )
    plan = make_plan(channel.links)
    try:
        request = next(plan)
        while True:
            send(request)
            request = plan.send([None] * len(request.calls))
    except (Abandoned, StopIteration):
        pass


async def adrive(make_plan: PlanMaker[T], channel: AsyncChannel) -> T:
    """Asyncio twin of :func:`drive`."""
    await channel.prepare()
    plan = make_plan(channel.links)
    try:
        request = next(plan)
        while True:
            try:
                replies = await channel.execute(request)
            except BaseException:  # cancelled (task.cancel, wait_for, timeout) mid-call
                _abandon(plan, channel.send_now)
                raise
            request = plan.send(replies)
    except StopIteration as done:
        return done.value  # type: ignore[no-any-return]
