"""The single-node lane for a waiter's piped attempt: its registration, its wait for a release
(a ``BLPOP`` between two readings of the node's clock) and the woken attempt, written at once
(see :meth:`.waits.ReleaseWaits.piped`, blocking and asyncio); a plain grant is settled from
the replies without the plan generators, a request's slots or a poll set per call.

As for the first attempt's lane (:mod:`.lane`), the plans stay the source of truth: the lane
settles only a grant on the trusted node within its validity (:func:`.lane.granted_record`,
counted from when the node ran the attempt: the second clock reading), and anything else
resumes :func:`~.plans.acquire_plan` with the round already made (:class:`~.plans.rounds.Sent`,
its start moved by the time the node held the attempt back); a channel the lane cannot use as
it is runs the plan. ``tests/engine/test_piped_lane.py`` runs the lane and the plan on the
same scripted replies and checks the calls they send are the same bytes.
"""

from __future__ import annotations

import time
from typing import Any, NamedTuple

from .drive import adrive, drive, give_up
from .lane import LaneAttempt, Outcome, granted_record, lane_round
from .plans.rounds import Sent, bracketed, held_back
from .state import LeaseRecord
from .transport.aio import AsyncChannel
from .transport.sync import Channel


class PipedAttempt(NamedTuple):
    """A woken attempt carried behind a wait: the attempt (``woken``, registered for after
    the wait), the commands sent ahead of it (a registration, the ``BLPOP``), and how much
    longer than ``NODE_TIMEOUT`` their replies may take (the wait and its slack)."""

    attempt: LaneAttempt
    before: tuple[tuple[str | int, ...], ...]
    wait: float


def piped_acquire(job: PipedAttempt, channel: Channel) -> tuple[Outcome, list[Any]]:
    """Run ``job`` on a blocking ``channel`` (a driver for
    :meth:`~.pools.channels.ChannelPools.run_blocking_with`): its outcome and the replies of
    the commands carried ahead of it (:func:`~.plans.rounds.waited_reply` finds the wait's)."""
    attempt = job.attempt
    link = channel.lane_link()
    if link is None:
        channel.ahead = []
        outcome = drive(attempt.resume(None), channel)
        return outcome, channel.ahead
    tail, sent, carried, timeout = _round(job, link.run_id, link.tick)
    try:
        ahead, reply = channel.piped_call(link, carried, attempt.script, tail, timeout)
        record, resumed = _decided(attempt, sent, ahead, reply)
        if record is not None:
            return record, ahead
        # resumed inside the try: an interrupt before the plan runs would leave a grant
        # (one whose validity ran out, say) to nobody
        return drive(attempt.resume(resumed), channel), ahead
    except BaseException:  # an interrupt mid-call: the plan gives back what it may have got
        give_up(attempt.resume(sent), channel)
        raise


async def apiped_acquire(job: PipedAttempt, channel: AsyncChannel) -> tuple[Outcome, list[Any]]:
    """Asyncio twin of :func:`piped_acquire` (a driver for
    :meth:`~.pools.loop_channels.LoopChannels.arun_blocking_with`)."""
    attempt = job.attempt
    link = channel.lane_link()
    if link is None:
        channel.ahead = []
        outcome = await adrive(attempt.resume(None), channel)
        return outcome, channel.ahead
    tail, sent, carried, timeout = _round(job, link.run_id, link.tick)
    try:
        ahead, reply = await channel.piped_call(link, carried, attempt.script, tail, timeout)
        record, resumed = _decided(attempt, sent, ahead, reply)
        if record is not None:
            return record, ahead
        return await adrive(attempt.resume(resumed), channel), ahead
    except BaseException:  # cancelled mid-call: the plan gives back what it may have got
        give_up(attempt.resume(sent), channel)
        raise


def _round(
    job: PipedAttempt, run_id: str | None, tick: float
) -> tuple[tuple[str, ...], Sent, tuple[tuple[str | int, ...], ...], float]:
    """The round about to be written: the call's tail, what it drew (see
    :func:`.lane.lane_round`), the commands carried ahead (between two clock readings) and
    how long to wait for the replies (as ``attempt_round`` waits: a node ends a timed-out
    ``BLPOP`` on its next cycle, ``tick`` seconds late at worst)."""
    tail, sent = lane_round(job.attempt, run_id)
    timeout = job.attempt.state.node_timeout + job.wait + tick
    return tail, sent, bracketed(job.before), timeout


def _decided(
    attempt: LaneAttempt, sent: Sent, ahead: list[Any], reply: Any
) -> tuple[LeaseRecord | None, Sent]:
    """The lease a plain grant won (its validity counted from when the node ran the attempt:
    the second clock reading), else None; and the round for the plan to resume from."""
    started = sent.started + held_back(ahead, time.monotonic() - sent.started)
    record = granted_record(attempt, sent.owner, started, reply)
    return record, sent._replace(started=started, replies=[reply])
