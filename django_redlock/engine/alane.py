"""The single-node lane on an event loop: :mod:`.lane`'s acquire and release of a lease on a
one-node alias, each one write and one awaited reply (one future and one timer, no task),
without the plan generators or a request's slots.

As in :mod:`.lane`, the plans stay the source of truth: the lane settles only a plain grant
on a trusted node and a release's answer, resumes :func:`~.plans.acquire_plan` from the round
it made for any other reply, and runs the plan on a channel it cannot use as it is.
``tests/engine/test_alane.py`` runs the lane and the plans on the same replies.
"""

from __future__ import annotations

import time

from .drive import adrive, give_up
from .kinds import KINDS
from .lane import (
    LaneAttempt,
    Outcome,
    granted_record,
    lane_round,
    release_outcome,
    release_tail,
)
from .plans import note_unsure, release_plan
from .state import AliasState, LeaseRecord
from .transport.aio import AsyncChannel


async def alane_acquire(attempt: LaneAttempt, channel: AsyncChannel) -> Outcome:
    """Run ``attempt`` on ``channel`` (a driver for
    :meth:`~.pools.loop_channels.LoopChannels.arun_with`)."""
    link = channel.lane_link()
    if link is None:
        return await adrive(attempt.resume(None), channel)
    state = attempt.state
    tail, sent = lane_round(attempt, link.run_id)
    try:
        reply = await channel.roundtrip(link, attempt.script, tail, state.node_timeout)
        record = granted_record(attempt, sent.owner, sent.started, reply)
        if record is not None:
            return record
        return await adrive(attempt.resume(sent._replace(replies=[reply])), channel)
    except BaseException:  # cancelled mid-call: the plan gives back what it may have got
        give_up(attempt.resume(sent), channel)
        raise


async def alane_release(lease: LeaseRecord, channel: AsyncChannel, state: AliasState) -> bool:
    """Release a lease on a one-node alias on ``channel``; True if it was still held."""
    link = channel.lane_link()
    if link is None or not lease.reached:
        return await adrive(lambda nodes: release_plan(state, nodes, lease), channel)
    if lease.released:
        return False
    was_valid = not lease.lost and lease.deadline > time.monotonic()  # validity() > 0
    lease.released = True
    tail = release_tail(state, lease)
    script = KINDS[lease.kind].release
    reply = await channel.roundtrip(link, script, tail, state.node_timeout)
    held = release_outcome(lease, reply, was_valid)
    if lease.unsure:  # not on the hot path: only when the node did not answer
        note_unsure(lease, channel.links, (reply,))
    return held
