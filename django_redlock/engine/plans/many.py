"""One ``lock_many`` attempt: several names, all or nothing, in one script per node (I/O-free).

A node grants every name or none (``ACQUIRE_MANY``), so no caller ever holds part of a set
and waits for the rest: callers asking for overlapping sets in any order cannot deadlock.
The attempt wins when a quorum of nodes granted the whole set; each name gets a token of its
own (the node hands out consecutive tokens in the set's order, and the names take the
highest first token of the winners plus their position).
"""

from __future__ import annotations

import dataclasses
import functools
import time
from collections.abc import Sequence

from .. import scripts
from ..keyspace import TOKEN_LIMIT, quorum, wake_node
from ..kinds import LOCK
from ..replies import Call, NodeFailure, Request, Slot, granted_per_node
from ..scripts import primitives as more
from ..state import WAIT_MARK_MS, AcquireFailure, AliasState, LeaseRecord, NodeView, Plan
from .acquire import failure_of, owe_give_back
from .rounds import attempt_round
from .tokens import own_tokens
from .waiters import withdraw_plan, withdraw_registered, withdrawing


def acquire_many_plan(
    state: AliasState,
    nodes: Sequence[NodeView],
    names: Sequence[str],
    ttl: float,
    *,
    waiter: str = "",
    mark_ms: int = WAIT_MARK_MS,
    woken: bool = False,
) -> Plan[list[LeaseRecord] | AcquireFailure]:
    """One attempt at every name of ``names``; returns one :class:`LeaseRecord` per name (in
    the order of ``names``, all with one owner) or an :class:`AcquireFailure` whose
    ``busy_name`` is the name to wait for. ``waiter``/``mark_ms``/``woken`` as
    :func:`~.plans.acquire_plan` (the caller registers as a waiter of the busy name)."""
    total = len(nodes)
    needed = quorum(total)
    keys = state.keys
    mark_ms = max(mark_ms, 0) if waiter else 0
    # the per-name keys from their prefixes (this runs for every attempt, with many names)
    lock_of, waiters_of, handoff_of = keys.lock(""), keys.waiters(""), keys.handoff("")
    locks = tuple(lock_of + name for name in names)
    touched = (
        keys.fence,
        *[key for name in names for key in (lock_of + name, waiters_of + name, handoff_of + name)],
    )

    def settled(slots: list[Slot]) -> bool:
        won = failed = 0
        for slot in slots:
            if slot.done:
                value = slot.value
                if not isinstance(value, NodeFailure) and value[0] == scripts.GRANTED:
                    won += 1
                else:
                    failed += 1
        return won >= needed or total - failed < needed

    def give_back(calls: list[Call | None], replies: Sequence[object], owner: str) -> Plan[None]:
        return _release_all(state, nodes, calls, replies, owner, names)

    args = (mark_ms, "1" if woken else "0", waiter)
    attempt = attempt_round(
        state,
        nodes,
        more.ACQUIRE_MANY,
        touched,
        ttl,
        args,
        settled,
        give_back,
        tokens=len(names),
    )
    owner, calls, replies, statuses, started = yield from withdrawing(
        attempt, state, nodes, names, waiter, mark_ms
    )
    try:
        won = [i for i, st in enumerate(statuses) if st == scripts.GRANTED]
        raced = False
        if len(won) >= needed:
            # "still held" only where every name of the set still is
            owned = yield from own_tokens(
                state,
                nodes,
                {i: int(replies[i][1]) for i in won},
                len(names),
                lambda _i: tuple((lock, j) for j, lock in enumerate(locks)),
                lambda ok: len(ok) >= needed,
                owner,
            )
            first, raced = owned.first, owned.raced
            last, confirmed = first + len(names) - 1, len(owned.confirmed)
            validity_deadline = started + ttl - state.drift(ttl)
            if confirmed >= needed and last < TOKEN_LIMIT and time.monotonic() < validity_deadline:
                reached = tuple(g is not False for g in granted_per_node(replies, _granted))
                if mark_ms:
                    yield from withdraw_registered(state, nodes, names, waiter, replies, statuses)
                return [
                    LeaseRecord(
                        name,
                        lock,
                        owner,
                        first + j,
                        ttl,
                        validity_deadline,
                        reached=reached,
                        voters=tuple(won),
                    )
                    for j, (name, lock) in enumerate(zip(names, locks, strict=True))
                ]
        yield from _release_all(state, nodes, calls, replies, owner, names)
        failure = failure_of(nodes, replies, statuses, len(won))
        failure.raced = raced and failure.reason == "busy"  # racers kept passing its tokens
        if mark_ms and failure.final:  # it will not wait: withdraw where "busy" registered it
            yield from withdraw_registered(state, nodes, names, waiter, replies, statuses)
        busy = [int(r[3]) for r, st in zip(replies, statuses, strict=True) if st in _NAMING]
        return dataclasses.replace(failure, busy_name=names[busy[0] - 1] if busy else None)
    except BaseException as given_up:  # Abandoned, or an interrupt in this code
        if isinstance(given_up, GeneratorExit):  # closed: nothing may be yielded
            raise
        yield from _release_all(state, nodes, calls, [None] * total, owner, names)
        if mark_ms:
            yield from withdraw_plan(state, nodes, names, waiter)
        raise


_NAMING = (scripts.BUSY, scripts.OTHER_KIND)


def _granted(reply: list[int]) -> bool:
    return int(reply[0]) == scripts.GRANTED


def _release_all(
    state: AliasState,
    nodes: Sequence[NodeView],
    calls: Sequence[Call | None],
    replies: Sequence[object],
    owner: str,
    names: Sequence[str],
) -> Plan[None]:
    """Fire-and-forget: give back every name on each node that granted the set or did not
    answer (one request per name, all sent at once)."""
    may_hold = [
        call is not None
        and (
            (reply is None or (isinstance(reply, NodeFailure) and reply.sent))
            or (not isinstance(reply, NodeFailure) and _granted(reply))  # type: ignore[arg-type]
        )
        for call, reply in zip(calls, replies, strict=True)
    ]
    total = len(nodes)
    for name in names:
        waking = wake_node(name, total)
        release: list[Call | None] = [
            state.release_call(name, owner, wakes=i == waking) if hold else None
            for i, hold in enumerate(may_hold)
        ]
        if any(release):
            # a give-back that did not reach its node is sent again from the background
            key = state.keys.lock(name)
            owe = functools.partial(owe_give_back, state, name, owner, (key,), LOCK, total)
            yield Request(release, 0.0, wait=False, unanswered=owe)
