"""The single-node lane: a lock on a one-node alias acquired and released in one write and one
read each, without the plan generators, a request's slots or a poll set per call.

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
from .kinds import HANDOFF_MS, KINDS, LOCK
from .plans import counted_release, note_unsure, release_plan
from .plans.rounds import Sent
from .state import DRIFT_ALLOWANCE, WAKE_TTL_MS, AcquireFailure, AliasState, LeaseRecord
from .transport.sync import Channel

Outcome = LeaseRecord | AcquireFailure
_WAKE_TTL_MS, _HANDOFF_MS = str(WAKE_TTL_MS), str(HANDOFF_MS)
#: ``reached`` and ``voters`` of a lease won on the only node
_REACHED, _VOTERS = (True,), (0,)


class LaneAttempt:
    """One acquire attempt of a lock on a one-node alias: what :func:`lane_acquire` sends,
    and the plan that decides whatever the lane does not (``resume(sent)``)."""

    __slots__ = ("mark_ms", "name", "resume", "state", "ttl", "waiter", "woken")

    def __init__(
        self,
        state: AliasState,
        name: str,
        ttl: float,
        waiter: str,
        mark_ms: int,
        woken: bool,
        resume: Callable[[Sent | None], PlanMaker[Outcome]],
    ) -> None:
        self.state, self.name, self.ttl = state, name, ttl
        self.waiter, self.mark_ms, self.woken = waiter, mark_ms, woken
        self.resume = resume


def acquire_tail(
    attempt: LaneAttempt, owner: str, ttl_ms: int, run_id: str, suffix: str
) -> tuple[str, ...]:
    """``ACQUIRE``'s key count, keys and arguments, as :func:`~.plans.acquire_plan` sends them
    for a lock (see ``_lock_keys`` in :mod:`.kinds`), all as text (see
    :func:`.transport.base.texts`)."""
    keys, name = attempt.state.keys, attempt.name
    mark_ms = attempt.mark_ms if attempt.waiter else 0
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


def granted_record(
    state: AliasState, name: str, ttl: float, owner: str, started: float, reply: Any
) -> LeaseRecord | None:
    """The lease a one-node lock attempt won, exactly as :func:`~.plans.acquire_plan` builds
    it; None for any other reply (the plan decides those)."""
    if type(reply) is not list or reply[0] != scripts.GRANTED:
        return None
    token = int(reply[1])
    deadline = started + ttl - (ttl * state.drift_factor + DRIFT_ALLOWANCE)  # state.drift
    if token >= TOKEN_LIMIT or time.monotonic() >= deadline:
        return None
    record = LeaseRecord(name, state.keys.lock_prefix + name, owner, token, ttl, deadline)
    record.reached, record.voters = _REACHED, _VOTERS
    return record


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
        reply = channel.roundtrip(link, scripts.ACQUIRE, tail, state.node_timeout)
        record = granted_record(state, attempt.name, attempt.ttl, sent.owner, sent.started, reply)
        if record is not None:
            return record
        # resumed inside the try: an interrupt before the plan runs would leave a grant
        # (one whose validity ran out, say) to nobody
        return drive(attempt.resume(sent._replace(replies=[reply])), channel)
    except BaseException:  # an interrupt mid-call: the plan gives back what it may have got
        give_up(attempt.resume(sent), channel)
        raise


def release_tail(state: AliasState, lease: LeaseRecord) -> tuple[str, ...]:
    """``RELEASE``'s key count, keys and arguments for a lock on the only node (the node
    waiters block on), as :func:`~.plans.release_plan` sends them, all as text."""
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
    """What :func:`~.plans.release_plan` makes of a one-node lock release's reply."""
    lease.handed_off = reply == scripts.HANDED_OFF
    return counted_release(lease, (True,), (reply,), was_valid)


def lane_release(lease: LeaseRecord, channel: Channel, state: AliasState) -> bool:
    """Release a lock on a one-node alias on ``channel``; True if it was still held."""
    link = channel.lane_link()
    if link is None or not lease.reached or lease.kind != LOCK:
        return drive(lambda nodes: release_plan(state, nodes, lease), channel)
    if lease.released:
        return False
    was_valid = not lease.lost and lease.deadline > time.monotonic()  # validity() > 0
    lease.released = True
    reply = channel.roundtrip(link, scripts.RELEASE, release_tail(state, lease), state.node_timeout)
    held = release_outcome(lease, reply, was_valid)
    if lease.unsure:  # not on the hot path: only when the node did not answer
        note_unsure(lease, channel.links, (reply,))
    return held
