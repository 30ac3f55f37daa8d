"""The single-node lane: a lease of any kind (a lock, a semaphore's permit, a read or a write
lease) on a one-node alias acquired and released in one write and one read each, without the
plan generators, a request's slots or a poll set per call.

The plans stay the source of truth. The lane settles only what one reply makes plain: a grant
on a trusted node (:func:`granted_record`), and a release's answer (:func:`release_outcome`).
Any other acquire reply (busy, untrusted, a failure, a grant whose validity ran out) resumes
:func:`~.plans.acquire_plan` with the round already made (:class:`~.plans.rounds.Sent`), so the
plan decides as if it had sent it; a channel the lane cannot use as it is (a reply due, a
connection down or closed) runs the plan. ``tests/engine/test_lane.py`` runs the lane and the
plans on the same scripted replies and checks the calls they send are the same bytes.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Any

from . import scripts
from .drive import PlanMaker, drive, give_up
from .keyspace import TOKEN_LIMIT, LockValue, new_owner
from .kinds import HANDOFF_MS, KINDS, LOCK, PERMIT
from .plans import counted_release, note_unsure, release_plan
from .plans.acquire import granted_slot, won_record
from .plans.lease import release_of
from .plans.rounds import Sent
from .scripts.script import Script
from .state import DRIFT_ALLOWANCE, WAKE_TTL_MS, AcquireFailure, AliasState, LeaseRecord
from .transport.sync import Channel

Outcome = LeaseRecord | AcquireFailure
_WAKE_TTL_MS, _HANDOFF_MS = str(WAKE_TTL_MS), str(HANDOFF_MS)
#: ``reached`` and ``voters`` of a lease won on the only node
_REACHED, _VOTERS = (True,), (0,)


class LaneAttempt:
    """One acquire attempt of a lease on one name: what the lanes send, and the plan that
    decides whatever they do not (``resume(sent)``). ``kind``: the lease's
    (:attr:`~.state.LeaseRecord.kind`); ``permits``: a permit's semaphore's size."""

    __slots__ = (
        "kind",
        "mark_ms",
        "name",
        "permits",
        "resume",
        "script",
        "state",
        "touched",
        "tried",
        "ttl",
        "waiter",
        "woken",
    )

    def __init__(
        self,
        state: AliasState,
        name: str,
        ttl: float,
        waiter: str,
        mark_ms: int,
        woken: bool,
        resume: Callable[[Sent | None], PlanMaker[Outcome]],
        kind: str = LOCK,
        permits: int = 0,
    ) -> None:
        self.state, self.name, self.ttl = state, name, ttl
        self.waiter, self.mark_ms, self.woken = waiter, mark_ms, woken
        self.resume = resume
        self.kind, self.permits = kind, permits
        spec = KINDS[kind]
        #: the acquiring script of the lease's kind
        self.script: Script = spec.acquire
        #: the keys the attempt may take and those its script touches (a lock's are written
        #: out where they are used: the hot path)
        self.tried: tuple[str, ...] = ()
        self.touched: tuple[str, ...] = ()
        if kind != LOCK:
            self.tried, self.touched = spec.acquire_keys(state.keys, name, permits)


def acquire_tail(
    attempt: LaneAttempt, owner: str, ttl_ms: int, run_id: str, suffix: str
) -> tuple[str, ...]:
    """The acquiring script's key count, keys and arguments, as :func:`~.plans.acquire_plan`
    sends them (see ``_lock_keys`` in :mod:`.kinds` for a lock's), all as text (see
    :func:`.transport.base.texts`)."""
    keys, name = attempt.state.keys, attempt.name
    mark_ms = attempt.mark_ms if attempt.waiter else 0
    if attempt.kind != LOCK:
        return _kind_tail(attempt, owner, ttl_ms, run_id, suffix, mark_ms)
    return (
        "4",
        keys.lock_prefix + name,
        keys.fence,
        keys.waiters_prefix + name,
        keys.handoff_prefix + name,
        owner,
        str(ttl_ms),
        run_id,
        suffix,
        str(mark_ms) if mark_ms else "0",
        "1" if attempt.woken else "0",
        attempt.waiter,
    )


def _kind_tail(
    attempt: LaneAttempt, owner: str, ttl_ms: int, run_id: str, suffix: str, mark_ms: int
) -> tuple[str, ...]:
    """:func:`acquire_tail` of a permit, a read or a write lease (the keys its kind's table
    entry names; a permit's last argument is its semaphore's size)."""
    touched, extra = attempt.touched, (str(attempt.permits),) if attempt.permits else ()
    woken = "1" if attempt.woken else "0"
    head = (str(len(touched)), *touched, owner, str(ttl_ms), run_id, suffix)
    return (*head, str(mark_ms), woken, attempt.waiter, *extra)


def lease_of(
    attempt: LaneAttempt,
    owner: str,
    token: int,
    deadline: float,
    slot: int,
    reached: tuple[bool, ...],
    voters: tuple[int, ...],
) -> LeaseRecord:
    """The record of a lease ``attempt`` won at ``token`` (``slot``: a permit's), as
    :func:`~.plans.acquire_plan` builds it (:func:`~.plans.acquire.won_record`)."""
    state, name = attempt.state, attempt.name
    tried = attempt.tried or (state.keys.lock_prefix + name,)
    return won_record(
        state.keys, name, attempt.kind, tried, slot, owner, token, attempt.ttl, deadline,
        reached, voters,
    )  # fmt: skip


def permit_slot(attempt: LaneAttempt, reply: Any) -> int:
    """The slot a permit's grant names (:func:`~.plans.acquire.granted_slot`) when it is
    one of the semaphore's; 0 for any other kind, or for a grant naming none (the plan
    decides that one)."""
    if attempt.kind != PERMIT:
        return 0
    slot = granted_slot(reply)
    return slot if 0 < slot <= attempt.permits else 0


def granted_record(
    attempt: LaneAttempt, owner: str, started: float, reply: Any
) -> LeaseRecord | None:
    """The lease a one-node attempt won, exactly as :func:`~.plans.acquire_plan` builds it;
    None for any other reply (the plan decides those)."""
    if type(reply) is not list or reply[0] != scripts.GRANTED:
        return None
    token = int(reply[1])
    ttl = attempt.ttl
    deadline = started + ttl - (ttl * attempt.state.drift_factor + DRIFT_ALLOWANCE)
    slot = permit_slot(attempt, reply)
    if token >= TOKEN_LIMIT or time.monotonic() >= deadline or (attempt.permits and not slot):
        return None
    return lease_of(attempt, owner, token, deadline, slot, _REACHED, _VOTERS)


def opening(attempt: LaneAttempt) -> tuple[int, str, str]:
    """What a lane's round draws before it is sent, as ``attempt_round`` does: the TTL in
    milliseconds (noted as the restart quarantine's bound), a new owner, the value suffix."""
    state = attempt.state
    ttl_ms = math.ceil(attempt.ttl * 1000)
    if ttl_ms > state.longest_ttl_ms:
        state.longest_ttl_ms = ttl_ms
    owner = new_owner()
    return ttl_ms, owner, LockValue.suffix(int(time.time() * 1000), state.host, state.pid)


def lane_round(attempt: LaneAttempt, run_id: str | None) -> tuple[tuple[str, ...], Sent]:
    """A lane's round about to be sent on a connection to the node ``run_id``: its call's
    tail and what it drew (:class:`~.plans.rounds.Sent`, no replies yet)."""
    assert run_id is not None
    ttl_ms, owner, suffix = opening(attempt)
    started = time.monotonic()
    tail = acquire_tail(attempt, owner, ttl_ms, run_id, suffix)
    return tail, Sent(owner, suffix, started, None, (run_id,))


def lane_acquire(attempt: LaneAttempt, channel: Channel) -> Outcome:
    """Run ``attempt`` on ``channel`` (a driver for :meth:`~.pools.channels.ChannelPools.run`)."""
    link = channel.lane_link()
    if link is None:
        return drive(attempt.resume(None), channel)
    state = attempt.state
    tail, sent = lane_round(attempt, link.run_id)
    try:
        reply = channel.roundtrip(link, attempt.script, tail, state.node_timeout)
        record = granted_record(attempt, sent.owner, sent.started, reply)
        if record is not None:
            return record
        # resumed inside the try: an interrupt before the plan runs would leave a grant
        # (one whose validity ran out, say) to nobody
        return drive(attempt.resume(sent._replace(replies=[reply])), channel)
    except BaseException:  # an interrupt mid-call: the plan gives back what it may have got
        give_up(attempt.resume(sent), channel)
        raise


def release_tail(
    state: AliasState, lease: LeaseRecord, *, wakes: bool = True, unsure: bool = False
) -> tuple[str, ...]:
    """The releasing script's key count, keys and arguments for a lease, as
    :func:`~.plans.release_plan` sends them to a node (``wakes``: the node waiters block on,
    the only one of a one-node alias; ``unsure``: one whose grant is unknown), all as text."""
    if lease.kind != LOCK or not wakes:
        call = release_of(state, lease, wakes=wakes, unsure=unsure)
        return (str(len(call.keys)), *call.keys, *map(str, call.args))
    keys, name = state.keys, lease.name
    return (
        "4",
        lease.key,
        keys.waiters_prefix + name,
        keys.wake_prefix + name,
        keys.handoff_prefix + name,
        lease.owner,
        _WAKE_TTL_MS,
        _HANDOFF_MS,
        "1",
        "0",
        "",
        KINDS[LOCK].wakes,
    )


def release_outcome(lease: LeaseRecord, reply: Any, was_valid: bool) -> bool:
    """What :func:`~.plans.release_plan` makes of a one-node release's reply (one node: a
    hand-off there is a quorum's, whatever the kind)."""
    lease.handed_off = reply == scripts.HANDED_OFF
    return counted_release(lease, (True,), (reply,), was_valid)


def lane_release(lease: LeaseRecord, channel: Channel, state: AliasState) -> bool:
    """Release a lease on a one-node alias on ``channel``; True if it was still held."""
    link = channel.lane_link()
    if link is None or not lease.reached:
        return drive(lambda nodes: release_plan(state, nodes, lease), channel)
    if lease.released:
        return False
    was_valid = not lease.lost and lease.deadline > time.monotonic()  # validity() > 0
    lease.released = True
    script = KINDS[lease.kind].release
    reply = channel.roundtrip(link, script, release_tail(state, lease), state.node_timeout)
    held = release_outcome(lease, reply, was_valid)
    if lease.unsure:  # not on the hot path: only when the node did not answer
        note_unsure(lease, channel.links, (reply,))
    return held
