"""The lane for a set of nodes: a lease of any kind (a lock, a semaphore's permit, a read or a
write lease) on an alias of several nodes acquired and released with one packed call per node,
all written before any reply is read, the replies counted into a quorum, without the plan
generators, a request's calls or a poll set per call.

As for the single-node lane (:mod:`.lane`), the plans stay the source of truth. The lane
settles only a plain quorum of grants (:func:`quorum_record`: every winner at the same token
and, for a permit, the same slot, within the validity; a waiting caller's registration is
withdrawn where the attempt may have made one, with the plan's own request,
:func:`withdrawal`) and a release's answers (:func:`fan_release`, counted by
:func:`~.plans.counted_release`). Anything else resumes :func:`~.plans.acquire_plan` with the
round already made (:class:`~.plans.rounds.Sent`); a channel the lane cannot use as it is
runs the plan. The lane is used where the plans would ask every node at once (not with
``FAN_OUT = "quorum"``). ``tests/engine/test_fan_lane_plans.py`` runs the lane and the plans
on the same scripted replies and checks the calls they send are the same bytes.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

from . import scripts
from .drive import drive, give_up
from .keyspace import TOKEN_LIMIT, quorum, wake_node
from .kinds import KINDS, LOCK
from .lane import (
    LaneAttempt,
    Outcome,
    acquire_tail,
    lease_of,
    opening,
    permit_slot,
    release_tail,
)
from .plans import counted_release, note_unsure, release_plan
from .plans.acquire import attempt_settled
from .plans.rounds import Sent
from .plans.waiters import withdraw_registered
from .replies import NOT_INVOLVED, NodeFailure, Request, Slot, statuses_of
from .state import DRIFT_ALLOWANCE, AliasState, LeaseRecord
from .transport.sync import Channel

_GRANTED, _UNTRUSTED = scripts.GRANTED, scripts.UNTRUSTED
_NOT_INVOLVED = NodeFailure(NOT_INVOLVED, sent=False)


def _granted(reply: Any) -> bool:
    return type(reply) is list and reply[0] == _GRANTED


def quorum_record(
    state: AliasState,
    attempt: LaneAttempt,
    owner: str,
    started: float,
    replies: Sequence[Any],
) -> LeaseRecord | None:
    """The lease an attempt on several nodes won, exactly as :func:`~.plans.acquire_plan`
    builds it, when the replies are a plain quorum of grants: every winner at the same token
    (and a permit's at the same slot), below the token limit, within the validity, and no
    node that answered "untrusted". None for anything else: the plan decides those. A caller
    that would wait sends :func:`withdrawal` too."""
    total = len(replies)
    won = [i for i, reply in enumerate(replies) if _granted(reply)]
    if len(won) < quorum(total):
        return None
    token = int(replies[won[0]][1])
    if token >= TOKEN_LIMIT or any(int(replies[i][1]) != token for i in won):
        return None  # a winner behind on tokens: the plan's write-back
    slot = permit_slot(attempt, replies[won[0]])
    if attempt.permits and (not slot or any(permit_slot(attempt, replies[i]) != slot for i in won)):
        return None  # a permit's nodes that granted other slots: the plan gives those back
    for r in replies:  # a plain loop: this runs for every attempt
        if type(r) is list and r[0] == _UNTRUSTED:
            return None  # a restarted node: the plan sees whether it may rejoin
    ttl = attempt.ttl
    deadline = started + ttl - (ttl * state.drift_factor + DRIFT_ALLOWANCE)  # state.drift
    if time.monotonic() >= deadline:
        return None
    # nodes that may hold the key: the winners, and those that got the call and did not
    # answer (granted_per_node's None)
    reached = tuple(
        reply.sent if isinstance(reply, NodeFailure) else i in won
        for i, reply in enumerate(replies)
    )
    return lease_of(attempt, owner, token, deadline, slot, reached, tuple(won))


def withdrawal(
    attempt: LaneAttempt, nodes: Sequence[Any], replies: Sequence[Any]
) -> Request | None:
    """What :func:`~.plans.acquire_plan` sends after a win for a caller that would wait
    (fire-and-forget, on the attempt's connections): its registration withdrawn from the
    nodes that answered "busy" and from those that had not answered yet (either may have
    registered it: :func:`~.plans.waiters.withdraw_registered`); None when there are none."""
    if not attempt.waiter or attempt.mark_ms <= 0:
        return None
    name, waiter = attempt.name, attempt.waiter
    plan = withdraw_registered(attempt.state, nodes, (name,), waiter, replies, statuses_of(replies))
    return next(plan, None)


Decided = Callable[[list[Slot]], bool]


def acquire_decided(total: int, permits: int = 0) -> Decided:
    """:func:`~.plans.acquire_plan`'s ``settled()``: a quorum granted (for a permit, the
    same slot: the plan's own rule, :func:`~.plans.acquire.attempt_settled`), or it no
    longer can."""
    if permits:
        return attempt_settled(total, permits)
    needed = quorum(total)

    def decided(slots: list[Slot]) -> bool:
        done = granted = 0
        for slot in slots:
            if slot.done:
                done += 1
                if _granted(slot.value):
                    granted += 1
        return granted >= needed or granted + total - done < needed

    return decided


def fan_round(
    attempt: LaneAttempt, run_ids: tuple[str | None, ...]
) -> tuple[list[tuple[str, ...]], Sent]:
    """A lane's round about to be sent to nodes of ``run_ids``: each node's call tail, and
    what the round drew (:class:`~.plans.rounds.Sent`, no replies yet)."""
    ttl_ms, owner, suffix = opening(attempt)
    started = time.monotonic()
    tails = [acquire_tail(attempt, owner, ttl_ms, run_id or "", suffix) for run_id in run_ids]
    return tails, Sent(owner, suffix, started, None, run_ids)


def fan_acquire(attempt: LaneAttempt, channel: Channel) -> Outcome:
    """Run ``attempt`` on ``channel`` (a driver for :meth:`~.pools.channels.ChannelPools.run`)."""
    links = channel.fan_links()
    if links is None:
        return drive(attempt.resume(None), channel)
    state = attempt.state
    decided = acquire_decided(len(links), attempt.permits)
    sent = None
    try:
        tails, sent = fan_round(attempt, tuple(link.run_id for link in links))
        replies = channel.fan_call(links, attempt.script, tails, state.node_timeout, decided)
        record = quorum_record(state, attempt, sent.owner, sent.started, replies)
        if record is not None:
            withdraw = withdrawal(attempt, links, replies)
            if withdraw is not None:  # an interrupt in it: the grants are given back below
                channel.execute(withdraw)
            return record
        # resumed inside the try: an interrupt before the plan runs (making it, the driver's
        # first poll) would leave what some nodes granted to nobody
        return drive(attempt.resume(sent._replace(replies=replies)), channel)
    except BaseException:  # an interrupt mid-call: the plan gives back what it may have got
        if sent is not None:
            give_up(attempt.resume(sent), channel)
        raise


def release_calls(
    state: AliasState, lease: LeaseRecord, total: int
) -> tuple[list[int], list[tuple[str, ...]]]:
    """The nodes a lease's release goes to (those it may hold) and, for each, the releasing
    script's key count, keys and arguments as :func:`~.plans.release_plan` sends them, all as
    text: only the node waiters block on wakes one."""
    reached = lease.reached
    asked = [i for i in range(total) if reached[i]]
    waking = wake_node(lease.name, total)
    if lease.kind != LOCK:  # a permit's release differs where its grant is unknown too
        voters = lease.voters
        return asked, [
            release_tail(state, lease, wakes=i == waking, unsure=i not in voters) for i in asked
        ]
    wakes = release_tail(state, lease)
    quiet = (*wakes[:8], "0", *wakes[9:])
    return asked, [wakes if i == waking else quiet for i in asked]


def released(
    lease: LeaseRecord, total: int, asked: Sequence[int], got: Sequence[Any], was_valid: bool
) -> tuple[bool, list[Any]]:
    """What :func:`~.plans.release_plan` makes of the answers ``got`` of the ``asked``
    nodes: whether the lease was still held (and a quorum confirmed it), and the replies
    per node (the others: not involved)."""
    replies: list[Any] = [_NOT_INVOLVED] * total
    for i, reply in zip(asked, got, strict=True):
        replies[i] = reply
    handed = sum(1 for reply in got if reply == scripts.HANDED_OFF)
    needs_quorum = KINDS[lease.kind].handoff_needs_quorum
    lease.handed_off = handed >= quorum(total) if needs_quorum else handed > 0
    return counted_release(lease, lease.reached, replies, was_valid), replies


def release_decided(total: int) -> Decided:
    """:func:`~.plans.release_plan`'s ``settled()``: a quorum answered, or every node asked."""
    needed = quorum(total)

    def decided(slots: list[Slot]) -> bool:
        answered = sum(1 for slot in slots if slot.done)
        return answered >= needed or answered == len(slots)

    return decided


def lane_releasable(lease: LeaseRecord, total: int) -> bool:
    """A lease whose release the lane may send: one on every node of the channel."""
    return len(lease.reached) == total


class FanRelease:
    """One lane release of a lease on ``total`` nodes, begun (the lease marked released):
    the nodes it goes to, their call tails, its kind's script and when it is decided;
    :meth:`end` counts the answers as :func:`~.plans.release_plan` does."""

    __slots__ = ("asked", "decided", "lease", "script", "tails", "total", "was_valid")

    def __init__(self, state: AliasState, lease: LeaseRecord, total: int) -> None:
        self.lease, self.total = lease, total
        self.was_valid = not lease.lost and lease.deadline > time.monotonic()  # validity() > 0
        lease.released = True
        self.asked, self.tails = release_calls(state, lease, total)
        self.decided = release_decided(total)
        self.script = KINDS[lease.kind].release

    def end(self, links: Sequence[Any], got: Sequence[Any]) -> bool:
        """True if the lease was still held and a quorum confirmed its release."""
        lease = self.lease
        held, replies = released(lease, self.total, self.asked, got, self.was_valid)
        if lease.unsure:  # not on the hot path: only when a node did not answer
            note_unsure(lease, links, replies)
        return held


def fan_release(lease: LeaseRecord, channel: Channel, state: AliasState) -> bool:
    """Release a lease on ``channel``'s nodes (those it may hold); True if it was still
    held and a quorum confirmed it, as :func:`~.plans.release_plan` says."""
    links = channel.fan_links() if lane_releasable(lease, len(channel.links)) else None
    if links is None:
        return drive(lambda nodes: release_plan(state, nodes, lease), channel)
    if lease.released:
        return False
    release = FanRelease(state, lease, len(links))
    asked = [links[i] for i in release.asked]
    tails, decided = release.tails, release.decided
    got = channel.fan_call(asked, release.script, tails, state.node_timeout, decided)
    return release.end(links, got)
