"""One ``limits()`` attempt: a permit of each of several semaphores, all or nothing (I/O-free).

A node grants a permit of every semaphore or of none (``ACQUIRE_LIMITS``), so no caller holds
a permit while it waits for another: callers asking for overlapping sets in any order cannot
deadlock. Each permit is one slot of its semaphore held on a quorum, as for ``semaphore()``:
per semaphore, the slot most granting nodes gave counts, and the nodes that gave another slot
give it back. The attempt wins when every semaphore's slot is held on a quorum; the tokens
follow the highest first token of those nodes (first, first + 1, ... in the set's order).
"""

from __future__ import annotations

import dataclasses
import functools
import time
from collections.abc import Collection, Sequence
from typing import Any

from .. import scripts
from ..keyspace import TOKEN_LIMIT, quorum, wake_node
from ..kinds import PERMIT, PERMIT_HANDOFF_MS
from ..replies import Call, NodeFailure, Request, Slot
from ..scripts import limits as scripts_limits
from ..state import (
    WAIT_MARK_MS,
    WAKE_TTL_MS,
    AcquireFailure,
    AliasState,
    LeaseRecord,
    NodeView,
    Plan,
)
from .acquire import failure_of, owe_give_back
from .lease import counted_release, note_unsure, release_many_plan
from .rounds import attempt_round
from .tokens import own_tokens
from .waiters import withdraw_plan, withdraw_registered, withdrawing

_NAMING = (scripts.BUSY, scripts.OTHER_KIND)


def _slots_granted(reply: Any) -> list[int] | None:
    """The slot (from 1) of each semaphore a granting node gave; None for any other reply."""
    if isinstance(reply, NodeFailure) or reply is None or int(reply[0]) != scripts.GRANTED:
        return None
    return [int(k) for k in reply[2:]]


def _best(granted: Sequence[list[int] | None], j: int) -> tuple[int, int]:
    """Semaphore ``j``'s slot most nodes granted, and how many did ((0, 0): none)."""
    counts: dict[int, int] = {}
    for slots in granted:
        if slots is not None:
            counts[slots[j]] = counts.get(slots[j], 0) + 1
    return max(((n, k) for k, n in counts.items()), default=(0, 0))[::-1]


def acquire_limits_plan(
    state: AliasState,
    nodes: Sequence[NodeView],
    names: Sequence[str],
    permits: Sequence[int],
    ttl: float,
    *,
    waiter: str = "",
    mark_ms: int = WAIT_MARK_MS,
    woken: int = 0,
) -> Plan[list[LeaseRecord] | AcquireFailure]:
    """One attempt at a permit of each semaphore ``names[i]`` of ``permits[i]`` permits;
    returns one permit :class:`LeaseRecord` per name (in order, one owner) or an
    :class:`AcquireFailure` whose ``busy_name`` is the semaphore to wait for (or the one taken
    as another kind). ``woken``: the position (from 1) of the semaphore a release woke this
    caller for (0: none). ``waiter``/``mark_ms`` as :func:`~.plans.acquire_plan`."""
    total = len(nodes)
    needed = quorum(total)
    keys = state.keys
    mark_ms = max(mark_ms, 0) if waiter else 0
    slots_of = [
        tuple(keys.permit(name, k) for k in range(n))
        for name, n in zip(names, permits, strict=True)
    ]
    touched: tuple[str, ...] = (keys.fence,)
    for name, slots in zip(names, slots_of, strict=True):
        touched += (keys.waiters(name), keys.handoff(name), keys.lock(name), *slots)
    count = len(names)

    def settled(done: list[Slot]) -> bool:
        granted = [_slots_granted(s.value) if s.done else None for s in done]
        pending = sum(1 for s in done if not s.done)
        best = [_best(granted, j)[1] for j in range(count)]
        return all(b >= needed for b in best) or any(b + pending < needed for b in best)

    def give_back(calls: list[Call | None], replies: Sequence[Any], owner: str) -> Plan[None]:
        return _give_back(state, nodes, calls, replies, owner, names, slots_of)

    args: tuple[str | int, ...] = (mark_ms, str(woken), waiter, *permits)
    attempt = attempt_round(
        state,
        nodes,
        scripts_limits.ACQUIRE_LIMITS,
        touched,
        ttl,
        args,
        settled,
        give_back,
        tokens=count,
    )
    owner, calls, replies, statuses, started = yield from withdrawing(
        attempt, state, nodes, names, waiter, mark_ms
    )
    raced = False
    try:
        granted = [_slots_granted(r) for r in replies]
        chosen = [_best(granted, j)[0] for j in range(count)]
        voters = [
            [i for i, g in enumerate(granted) if g is not None and g[j] == chosen[j]]
            for j in range(count)
        ]

        def enough(confirmed: Collection[int]) -> bool:
            """Every semaphore's slot confirmed on a quorum of its voters."""
            return all(len(set(confirmed).intersection(v)) >= needed for v in voters)

        if all(len(v) >= needed for v in voters):
            union = sorted({i for v in voters for i in v})
            # "still held" only where every chosen slot the node granted still is
            owned = yield from own_tokens(
                state,
                nodes,
                {i: int(replies[i][1]) for i in union},
                count,
                lambda i: tuple(
                    (slots_of[j][chosen[j] - 1], j) for j, v in enumerate(voters) if i in v
                ),
                enough,
                owner,
            )
            first, raced = owned.first, owned.raced
            last, confirmed = first + count - 1, owned.confirmed
            validity_deadline = started + ttl - state.drift(ttl)
            if enough(confirmed) and last < TOKEN_LIMIT and time.monotonic() < validity_deadline:
                stray = [
                    None if g is None else [k if k != chosen[j] else 0 for j, k in enumerate(g)]
                    for g in granted
                ]
                if any(any(s) for s in stray if s is not None):  # slots the others gave
                    yield from _give_back(
                        state, nodes, calls, replies, owner, names, slots_of, stray
                    )
                if mark_ms:
                    yield from withdraw_registered(state, nodes, names, waiter, replies, statuses)
                return [
                    _record(state, replies, granted, name, slots_of[j], chosen[j], voters[j])._won(
                        owner, first + j, ttl, validity_deadline
                    )
                    for j, name in enumerate(names)
                ]
        yield from _give_back(state, nodes, calls, replies, owner, names, slots_of)
        # a quorum that granted the set, on slots too split to hold a permit: contention. The
        # votes are those of the semaphore with the fewest for its chosen slot (counting each
        # node that granted anything told "it could not be kept: pass a longer ttl=")
        votes = min(len(v) for v in voters)
        failure = failure_of(nodes, replies, statuses, votes)
        # permits a quorum granted whose tokens a lagging node's counter passed: not busy
        failure.raced = raced and failure.reason == "busy"
        if mark_ms and failure.final:  # it will not wait: withdraw where "busy" registered it
            yield from withdraw_registered(state, nodes, names, waiter, replies, statuses)
        named = [int(r[3]) for r, st in zip(replies, statuses, strict=True) if st in _NAMING]
        if failure.reason == "other_kind":
            named = [
                int(r[3])
                for r, st in zip(replies, statuses, strict=True)
                if st == scripts.OTHER_KIND
            ]
        return dataclasses.replace(failure, busy_name=names[named[0] - 1] if named else None)
    except BaseException as given_up:  # Abandoned, or an interrupt in this code
        if isinstance(given_up, GeneratorExit):  # closed: nothing may be yielded
            raise
        yield from _give_back(state, nodes, calls, [None] * total, owner, names, slots_of)
        if mark_ms:
            yield from withdraw_plan(state, nodes, names, waiter)
        raise


class _Permit:
    """A permit's record being built (the parts known before the token)."""

    __slots__ = ("key", "marker", "name", "reached", "slots", "voters")

    def __init__(
        self,
        name: str,
        key: str,
        marker: str,
        slots: tuple[str, ...],
        reached: tuple[bool, ...],
        voters: tuple[int, ...],
    ) -> None:
        self.name, self.key, self.marker, self.slots = name, key, marker, slots
        self.reached, self.voters = reached, voters

    def _won(self, owner: str, token: int, ttl: float, deadline: float) -> LeaseRecord:
        # complete when made (see acquire_plan): noted on the caller's handoff as it is made
        return LeaseRecord(
            self.name,
            self.key,
            owner,
            token,
            ttl,
            deadline,
            reached=self.reached,
            marker=self.marker,
            kind=PERMIT,
            voters=self.voters,
            slots=self.slots,
        )


def _record(
    state: AliasState,
    replies: Sequence[Any],
    granted: Sequence[list[int] | None],
    name: str,
    slots: tuple[str, ...],
    chosen: int,
    voters: list[int],
) -> _Permit:
    # nodes that may hold the chosen slot: those that gave it, and those that did not answer
    reached = tuple(
        (isinstance(r, NodeFailure) and r.sent) or r is None or i in voters
        for i, r in enumerate(replies)
    )
    return _Permit(name, slots[chosen - 1], state.keys.lock(name), slots, reached, tuple(voters))


def _give_back(
    state: AliasState,
    nodes: Sequence[NodeView],
    calls: Sequence[Call | None],
    replies: Sequence[Any],
    owner: str,
    names: Sequence[str],
    slots_of: Sequence[tuple[str, ...]],
    only: Sequence[list[int] | None] | None = None,
) -> Plan[None]:
    """Fire-and-forget: give back each semaphore's permit on every node that granted the set
    or did not answer (one request per semaphore, all sent at once). ``only``: per node, the
    slot of each semaphore to give back (0: keep it), for a won set's stray grants."""
    for j, name in enumerate(names):
        waking = wake_node(name, len(nodes))
        release: list[Call | None] = [None] * len(nodes)
        for i, (call, reply) in enumerate(zip(calls, replies, strict=True)):
            if call is None:
                continue
            if only is not None:
                picked = only[i]
                if picked is None or not picked[j]:
                    continue
                held: tuple[str, ...] = (slots_of[j][picked[j] - 1],)
            elif isinstance(reply, NodeFailure) or reply is None:
                if isinstance(reply, NodeFailure) and not reply.sent:
                    continue
                held = slots_of[j]  # it may have granted any slot
            else:
                slots = _slots_granted(reply)
                if slots is None:
                    continue  # it said no (and registered the caller, if it will wait)
                held = (slots_of[j][slots[j] - 1],)
            release[i] = state.release_call(
                name, owner, wakes=i == waking, held=held, kind=PERMIT, slots=slots_of[j]
            )
        if any(release):
            # a give-back that did not reach its node is sent again from the background
            owe = functools.partial(
                owe_give_back, state, name, owner, slots_of[j], PERMIT, len(nodes)
            )
            yield Request(release, 0.0, wait=False, unanswered=owe)


def release_permits_plan(
    state: AliasState, nodes: Sequence[NodeView], leases: Sequence[LeaseRecord]
) -> Plan[list[bool]]:
    """Release the permits of one ``limits()`` set (one owner) in one call per node (each
    node gets the permits it may hold); returns, per lease, True if it was still held."""
    live = [lease for lease in leases if not lease.released]
    was_valid = [lease.validity() > 0 for lease in live]
    for lease in live:
        lease.released = True
    if not live:
        return [False] * len(leases)
    total = len(nodes)
    needed = quorum(total)
    keys = state.keys
    per_node: list[list[int]] = [
        [j for j, lease in enumerate(live) if not lease.reached or lease.reached[i]]
        if node.run_id is not None
        else []
        for i, node in enumerate(nodes)
    ]

    def call(i: int) -> Call | None:
        mine = per_node[i]
        if not mine:
            return None
        touched: tuple[str, ...] = ()
        wakes, counts = "", list[int]()
        for j in mine:
            lease = live[j]
            name = lease.name
            slots = (lease.key, *(s for s in lease.slots if s != lease.key))
            touched += (keys.waiters(name), keys.wake(name), keys.handoff(name), *slots)
            wakes += "1" if wake_node(name, total) == i else "0"
            counts.append(len(slots))
        args: tuple[str | int, ...] = (
            live[0].owner,
            WAKE_TTL_MS,
            PERMIT_HANDOFF_MS,
            wakes,
            0,
            "",
            "1",
            *counts,
        )
        return Call(scripts_limits.RELEASE_PERMITS, touched, args)

    calls = [call(i) for i in range(total)]

    def settled(slots: list[Slot]) -> bool:
        answered = sum(1 for s, c in zip(slots, calls, strict=True) if c is not None and s.done)
        return answered >= needed or all(s.done for s, c in zip(slots, calls, strict=True) if c)

    replies = yield Request(calls, state.node_timeout, settled)
    # per node: each permit's answer (a node that failed: its failure, for each permit)
    answers = [
        dict(zip(per_node[i], map(int, reply), strict=True)) if isinstance(reply, list) else reply
        for i, reply in enumerate(replies)
    ]
    held = []
    for j, lease in enumerate(live):
        mine = [a.get(j, scripts.NOT_HELD) if isinstance(a, dict) else a for a in answers]
        reached = lease.reached or (True,) * total  # a node it never reached: "not yours"
        # a permit's releaser queues only when a quorum handed it off
        lease.handed_off = mine.count(scripts.HANDED_OFF) >= needed
        held.append(counted_release(lease, reached, mine, was_valid[j]))
        note_unsure(lease, nodes, mine)
    by_record = {id(lease): ok for lease, ok in zip(live, held, strict=True)}
    return [by_record.get(id(lease), False) for lease in leases]


def release_set_plan(
    state: AliasState, nodes: Sequence[NodeView], leases: Sequence[LeaseRecord]
) -> Plan[list[bool]]:
    """The release of a set in one call per node: a ``lock_many`` set's locks, or a
    ``limits()`` set's permits with their semaphores' slots."""
    if leases and leases[0].kind == PERMIT:
        return release_permits_plan(state, nodes, leases)
    return release_many_plan(state, nodes, leases)
