"""The Redlock algorithm as I/O-free plans, run by the sync and the asyncio driver alike.

A plan is a generator: it yields a :class:`~.replies.Request` (one call per node, a deadline
and an optional "settled" test) and receives the per-node replies, so one algorithm serves
both ``lock()`` and ``alock()``. ``tests/test_plans.py`` drives each plan with scripted
replies, without Redis.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from typing import Any

from . import scripts
from .keyspace import TOKEN_LIMIT, LockValue, new_owner, quorum, wake_node
from .replies import NOT_AWAITED, SILENT, Call, NodeFailure, Request, Slot
from .state import (
    HANDOFF_MS,
    LOST,
    RENEWED,
    UNCONFIRMED,
    WAIT_MARK_MS,
    WAKE_TTL_MS,
    Abandoned,
    AcquireFailure,
    AliasState,
    LeaseRecord,
    NodeView,
    Plan,
    Renewal,
)
from .trust import rejoin_plan

__all__ = [
    "HANDOFF_MS",
    "LOST",
    "RENEWED",
    "TOKEN_LIMIT",
    "UNCONFIRMED",
    "WAIT_MARK_MS",
    "WAKE_TTL_MS",
    "LeaseRecord",
    "acquire_plan",
    "extend_plan",
    "force_release_plan",
    "quorum",
    "register_plan",
    "rejoin_plan",
    "release_plan",
    "wake_node",
]


#: Why a node's vote did not count while it is in the restart quarantine (SPEC 4).
QUARANTINED = (
    "quarantined: its fence state is missing or from an earlier run (restarted, wiped, evicted"
    " or new node); it votes again once every lease it may have lost has expired"
)


def _errors(nodes: Sequence[NodeView], replies: Sequence[Any]) -> dict[str, str]:
    return {
        node.label: str(reply)
        for node, reply in zip(nodes, replies, strict=True)
        if isinstance(reply, NodeFailure) and reply.reason != NOT_AWAITED
    }


def _acquire_status(slot: Slot) -> int | None:
    if not slot.done or isinstance(slot.value, NodeFailure):
        return None
    return int(slot.value[0])


def acquire_plan(
    state: AliasState,
    nodes: Sequence[NodeView],
    name: str,
    ttl: float,
    *,
    waiter: str = "",
    mark_ms: int = WAIT_MARK_MS,
    woken: bool = False,
) -> Plan[LeaseRecord | AcquireFailure]:
    """One acquisition attempt; returns a :class:`LeaseRecord` or an :class:`AcquireFailure`.

    ``waiter``: the id of a caller that waits on failure ('' when it will not): a failed
    attempt registers it as a waiter for ``mark_ms`` (none when <= 0), a won one removes it.
    ``woken``: a release woke this caller, so it may take a name reserved for the hand-off."""
    total = len(nodes)
    needed = quorum(total)
    ttl_ms = math.ceil(ttl * 1000)
    state.longest_ttl_ms = max(state.longest_ttl_ms, ttl_ms)
    keys = state.keys
    key = keys.lock(name)
    owner = new_owner()
    suffix = LockValue.suffix(int(time.time() * 1000), state.host, state.pid)
    mark_ms = max(mark_ms, 0) if waiter else 0

    def settled(slots: list[Slot]) -> bool:
        statuses = [_acquire_status(s) for s in slots]
        won = statuses.count(scripts.GRANTED)
        lost = sum(
            1 for s, st in zip(slots, statuses, strict=True) if s.done and st != scripts.GRANTED
        )
        return won >= needed or total - lost < needed

    calls: list[Call | None] = []
    try:
        rejoined = False
        while True:
            started = time.monotonic()
            calls = [
                None
                if node.run_id is None
                else Call(
                    scripts.ACQUIRE,
                    (key, keys.fence, keys.waiters(name), keys.handoff(name)),
                    (owner, ttl_ms, node.run_id, suffix, mark_ms, "1" if woken else "0", waiter),
                )
                for node in nodes
            ]
            replies = yield Request(calls, state.node_timeout, settled)
            statuses = [
                None if isinstance(reply, NodeFailure) else int(reply[0]) for reply in replies
            ]
            untrusted = statuses.count(scripts.UNTRUSTED)
            if untrusted and statuses.count(scripts.GRANTED) < needed and not rejoined:
                rejoined = True
                seen = [i for i, st in enumerate(statuses) if st == scripts.UNTRUSTED]
                if (yield from rejoin_plan(state, nodes, seen)):
                    yield from _release_calls(
                        state, nodes, calls, _granted(replies, _acquired), owner, name
                    )
                    owner = new_owner()
                    continue
            break

        won = [i for i, st in enumerate(statuses) if st == scripts.GRANTED]
        if len(won) >= needed:
            token = max(int(replies[i][1]) for i in won)
            behind = [i for i in won if int(replies[i][1]) < token]
            confirmed = len(won) - len(behind)
            if behind and token < TOKEN_LIMIT:
                confirmed += yield from _write_back(
                    state, nodes, behind, token, key, owner, needed - confirmed
                )
            validity_deadline = started + ttl - state.drift(ttl)
            if confirmed >= needed and token < TOKEN_LIMIT and time.monotonic() < validity_deadline:
                reached = tuple(g is not False for g in _granted(replies, _acquired))
                if mark_ms:
                    yield from _withdraw(state, nodes, statuses, name, waiter)
                return LeaseRecord(name, key, owner, token, ttl, validity_deadline, reached=reached)

        granted = _granted(replies, _acquired)
        yield from _release_calls(state, nodes, calls, granted, owner, name, mark_ms, waiter)
        return _failure(nodes, replies, statuses, len(won))
    except Abandoned:
        # the caller gave up while a call was in flight: any node may have granted it
        yield from _release_calls(state, nodes, calls, [None] * total, owner, name)
        raise


def _write_back(
    state: AliasState,
    nodes: Sequence[NodeView],
    behind: Sequence[int],
    token: int,
    key: str,
    owner: str,
    still_needed: int,
) -> Plan[int]:
    """Raise the counter of the winners that are ``behind`` to ``token``; returns how many
    of them still hold the lock (a node that lost it since the acquire does not count: someone
    else may have taken it there and read the old counter). Settles once ``still_needed``
    of them confirmed."""
    calls: list[Call | None] = [None] * len(nodes)
    for i in behind:
        run_id = nodes[i].run_id
        if run_id is not None:
            calls[i] = Call(scripts.RAISE, (state.keys.fence, key), (token, run_id, owner))

    def settled(slots: list[Slot]) -> bool:
        return sum(1 for s in slots if s.done and s.value == scripts.STILL_HELD) >= still_needed

    replies = yield Request(calls, state.node_timeout, settled)
    return sum(1 for i in behind if replies[i] == scripts.STILL_HELD)


def _withdraw(
    state: AliasState,
    nodes: Sequence[NodeView],
    statuses: Sequence[int | None],
    name: str,
    waiter: str,
) -> Plan[None]:
    """Fire-and-forget: the caller won, so it stops counting as a waiter on the nodes that
    answered "busy" (and registered it there). Nothing is sent when every node granted."""
    key = state.keys.waiters(name)
    calls: list[Call | None] = [
        Call(scripts.WITHDRAW, (key,), (waiter,)) if status == scripts.BUSY else None
        for status in statuses
    ]
    if any(calls):
        yield Request(calls, 0.0, wait=False)


def register_plan(
    state: AliasState, nodes: Sequence[NodeView], name: str, waiter: str, mark_ms: int
) -> Plan[None]:
    """Fire-and-forget: register ``waiter`` for ``mark_ms`` on every node but the one waiters
    block on, for a caller that queues without a failed attempt (that node gets the same
    registration in the write of the caller's ``BLPOP``, so it is registered before it
    blocks). So every node reserves the name for the hand-off, as after a failed attempt."""
    waking = wake_node(name, len(nodes))
    key = state.keys.waiters(name)
    calls: list[Call | None] = [
        Call(scripts.REGISTER, (key,), (waiter, mark_ms)) if i != waking else None
        for i in range(len(nodes))
    ]
    if any(calls):
        yield Request(calls, 0.0, wait=False)


def _failure(
    nodes: Sequence[NodeView], replies: Sequence[Any], statuses: Sequence[int | None], votes: int
) -> AcquireFailure:
    """Why an attempt failed: busy (someone holds it and a quorum could answer) or unavailable."""
    total = len(nodes)
    trusted_answers = sum(1 for st in statuses if st in (scripts.GRANTED, scripts.BUSY))
    busy = statuses.count(scripts.BUSY)
    failing = statuses.count(scripts.UNTRUSTED) + sum(
        1 for r in replies if isinstance(r, NodeFailure) and r.reason not in SILENT
    )
    pttls = [int(r[2]) for r, st in zip(replies, statuses, strict=True) if st == scripts.BUSY]
    retry_after = max(pttls) / 1000 if pttls and max(pttls) > 0 else None
    errors = _errors(nodes, replies)
    if busy and total - failing >= quorum(total):
        return AcquireFailure("busy", votes, trusted_answers, errors, retry_after)
    if votes >= quorum(total):  # quorum reached but validity ran out or the token overflowed
        return AcquireFailure("busy", votes, trusted_answers, errors)
    for i, st in enumerate(statuses):
        if st == scripts.UNTRUSTED:
            errors[nodes[i].label] = QUARANTINED
    return AcquireFailure("unavailable", votes, trusted_answers, errors, retry_after)


def _release_calls(
    state: AliasState,
    nodes: Sequence[NodeView],
    calls: Sequence[Call | None],
    granted: Sequence[bool | None],
    owner: str,
    name: str,
    mark_ms: int = 0,
    waiter: str = "",
) -> Plan[None]:
    """Fire-and-forget release on every node that may hold the key: those that granted it
    (``True``) or did not answer (``None``), not those that said no (``False``). ``mark_ms``
    > 0: the caller will wait, so each release also registers ``waiter`` there.

    A release is sent on the same connection as the acquire, so on a paused node it runs right
    after the late SET when the node resumes; no stale key outlives the pause.
    """
    release: list[Call | None] = [None] * len(nodes)
    waking = wake_node(name, len(nodes))
    for i, call in enumerate(calls):
        if call is not None and granted[i] is not False:
            release[i] = state.release_call(
                name, owner, wakes=i == waking, mark_ms=mark_ms, waiter=waiter
            )
    if any(release):
        yield Request(release, 0.0, wait=False)


def _granted(replies: Sequence[Any], yes: Callable[[Any], bool]) -> list[bool | None]:
    """Per node: True if it said yes, False if it said no or never got the call, None if it
    got the call but did not answer (it may have executed it)."""
    return [
        (None if reply.sent else False) if isinstance(reply, NodeFailure) else yes(reply)
        for reply in replies
    ]


def _acquired(reply: Any) -> bool:
    return int(reply[0]) == scripts.GRANTED


def _renewed(reply: Any) -> bool:
    return bool(reply == scripts.RENEWED)


def release_plan(state: AliasState, nodes: Sequence[NodeView], lease: LeaseRecord) -> Plan[bool]:
    """Compare-and-delete on every node; returns True if the lease was still held."""
    if lease.released:
        return False
    was_valid = lease.validity() > 0
    lease.released = True
    total = len(nodes)
    needed = quorum(total)
    waking = wake_node(lease.name, total)
    reached = lease.reached or (True,) * total
    calls: list[Call | None] = [
        state.release_call(lease.name, lease.owner, wakes=i == waking)
        if node.run_id is not None and reached[i]
        else None
        for i, node in enumerate(nodes)
    ]

    def settled(slots: list[Slot]) -> bool:
        # a quorum of answers decides; a paused node's reply is read later, in order
        answered = sum(1 for s, c in zip(slots, calls, strict=True) if c is not None and s.done)
        return answered >= needed or all(s.done for s, c in zip(slots, calls, strict=True) if c)

    replies = yield Request(calls, state.node_timeout, settled)
    lease.handed_off = any(r == scripts.HANDED_OFF for r in replies)
    # Held unless nodes said "not yours": a release that merely timed out is not a loss (its
    # compare-and-delete still runs when the node answers, in order, on this connection).
    refused = sum(1 for r in replies if r == scripts.NOT_HELD)
    return was_valid and not lease.lost and refused <= total - needed


def extend_plan(
    state: AliasState, nodes: Sequence[NodeView], lease: LeaseRecord, ttl: float
) -> Plan[Renewal]:
    """Compare-and-pexpire on every node.

    Renewed when a quorum extended it in time. Lost when its validity is gone or so many nodes
    said "not yours" that no quorum can hold it (the nodes that did extend it are released).
    Otherwise (nodes slow, down or restarted) unconfirmed: the lease keeps the validity it had
    and nothing is deleted, so a node's hiccup never forfeits a valid lease."""
    if lease.lost or lease.released or lease.validity() <= 0:
        lease.lost = True
        return Renewal(LOST)
    total = len(nodes)
    needed = quorum(total)
    ttl_ms = math.ceil(ttl * 1000)
    state.longest_ttl_ms = max(state.longest_ttl_ms, ttl_ms)
    calls: list[Call | None] = [
        None
        if node.run_id is None
        else Call(scripts.EXTEND, (lease.key, state.keys.fence), (lease.owner, ttl_ms, node.run_id))
        for node in nodes
    ]

    def settled(slots: list[Slot]) -> bool:
        won = sum(1 for s in slots if s.done and s.value == scripts.RENEWED)
        lost = sum(1 for s in slots if s.done and s.value != scripts.RENEWED)
        return won >= needed or total - lost < needed

    started = time.monotonic()
    replies = yield Request(calls, state.node_timeout, settled)
    deadline = started + ttl - state.drift(ttl)
    answered = sum(1 for r in replies if not isinstance(r, NodeFailure))
    if sum(1 for r in replies if r == scripts.RENEWED) >= needed and time.monotonic() < deadline:
        lease.deadline = deadline
        lease.ttl = ttl
        return Renewal(RENEWED, answered)
    refused = sum(1 for r in replies if r == scripts.NOT_HELD)
    if refused <= total - needed and lease.validity() > 0:
        return Renewal(UNCONFIRMED, answered, _errors(nodes, replies))
    lease.lost = True
    granted = _granted(replies, _renewed)
    yield from _release_calls(state, nodes, calls, granted, lease.owner, lease.name)
    return Renewal(LOST, answered, _errors(nodes, replies))


def force_release_plan(
    state: AliasState, nodes: Sequence[NodeView], name: str, expected: str = ""
) -> Plan[int]:
    """Delete ``name`` on every node whoever holds it; returns how many nodes deleted it."""
    keys = state.keys
    calls: list[Call | None] = [
        None
        if node.run_id is None
        else Call(
            scripts.FORCE_RELEASE,
            (keys.lock(name), keys.fence, keys.wake(name)),
            (expected, WAKE_TTL_MS),
        )
        for node in nodes
    ]
    replies = yield Request(calls, state.node_timeout * 4, None)
    return sum(1 for r in replies if r == scripts.DELETED)
