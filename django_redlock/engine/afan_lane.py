"""The lane for a set of nodes on an event loop: :mod:`.fan_lane`'s acquire and release of a
lease on an alias of several nodes, each one packed call per node written in one pass and one
awaited future (no task, no plan generator, no request).

As in :mod:`.fan_lane`, the plans stay the source of truth: the lane settles only a plain
quorum of grants (with a waiting caller's withdrawal, :func:`.fan_lane.withdrawal`) and a
release's answers, resumes :func:`~.plans.acquire_plan` from the round
it made for anything else, and runs the plan on a channel it cannot use as it is.
``tests/engine/test_alane.py`` runs it on real nodes beside the plans.
"""

from __future__ import annotations

from .drive import adrive, give_up
from .fan_lane import (
    FanRelease,
    acquire_decided,
    fan_round,
    lane_releasable,
    quorum_record,
    withdrawal,
)
from .lane import LaneAttempt, Outcome
from .plans import release_plan
from .state import AliasState, LeaseRecord
from .transport.aio import AsyncChannel


async def afan_acquire(attempt: LaneAttempt, channel: AsyncChannel) -> Outcome:
    """Run ``attempt`` on ``channel`` (a driver for
    :meth:`~.pools.loop_channels.LoopChannels.arun_with`)."""
    links = channel.fan_links()
    if links is None:
        return await adrive(attempt.resume(None), channel)
    state = attempt.state
    decided = acquire_decided(len(links), attempt.permits)
    sent = None
    try:
        tails, sent = fan_round(attempt, tuple(link.run_id for link in links))
        replies = await channel.fan_call(links, attempt.script, tails, state.node_timeout, decided)
        record = quorum_record(state, attempt, sent.owner, sent.started, replies)
        if record is not None:
            withdraw = withdrawal(attempt, links, replies)
            if withdraw is not None:  # written at once: no await between the win and the return
                channel.send_now(withdraw)
            return record
        return await adrive(attempt.resume(sent._replace(replies=replies)), channel)
    except BaseException:  # cancelled mid-call: the plan gives back what it may have got
        if sent is not None:
            give_up(attempt.resume(sent), channel)
        raise


async def afan_release(lease: LeaseRecord, channel: AsyncChannel, state: AliasState) -> bool:
    """Release a lease on ``channel``'s nodes (those it may hold); True if it was still held
    and a quorum confirmed it."""
    links = channel.fan_links() if lane_releasable(lease, len(channel.links)) else None
    if links is None:
        return await adrive(lambda nodes: release_plan(state, nodes, lease), channel)
    if lease.released:
        return False
    release = FanRelease(state, lease, len(links))
    asked = [links[i] for i in release.asked]
    got = await channel.fan_call(
        asked, release.script, release.tails, state.node_timeout, release.decided
    )
    return release.end(links, got)
