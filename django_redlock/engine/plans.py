"""The Redlock algorithm as I/O-free plans, run by the sync and the asyncio driver alike.

A plan is a generator: it yields a :class:`~.replies.Request` (one call per node, a deadline
and an optional "settled" test) and receives the per-node replies, so one algorithm serves
both ``lock()`` and ``alock()``. ``tests/engine/test_plans.py`` drives each plan with scripted
replies, without Redis.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Collection, Sequence
from typing import Any, NamedTuple

from . import primitive_scripts as more
from . import scripts
from .keyspace import TOKEN_LIMIT, LockValue, new_owner, quorum, wake_node
from .lease_plans import extend_plan, force_release_plan, release_plan
from .replies import (
    NOT_ASKED,
    SILENT,
    Call,
    NodeFailure,
    Request,
    Slot,
    granted_per_node,
    node_errors,
)
from .state import (
    HANDOFF_MS,
    LOST,
    PERMIT,
    READ,
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
    "withdraw_plan",
]


#: Why a node's vote did not count while it is in the restart quarantine (docs/algorithm.md).
QUARANTINED = (
    "quarantined: its fence state is missing or from an earlier run (restarted, wiped, evicted"
    " or new node); it votes again once every lease it may have lost has expired"
)


def _acquire_status(slot: Slot) -> int | None:
    if not slot.done or isinstance(slot.value, NodeFailure):
        return None
    return int(slot.value[0])


def _granted_slot(reply: Any) -> int:
    """The slot a PERMIT reply granted (1-based position in the tried order); 0 for a lock."""
    return int(reply[2]) if len(reply) > 2 and int(reply[0]) == scripts.GRANTED else 0


def _best_slot(slots_granted: Sequence[int]) -> tuple[int, int]:
    """The slot most nodes granted and how many granted it ((0, 0) when none did)."""
    counts: dict[int, int] = {}
    for slot in slots_granted:
        counts[slot] = counts.get(slot, 0) + 1
    return max(((n, slot) for slot, n in counts.items()), default=(0, 0))[::-1]


def acquire_plan(
    state: AliasState,
    nodes: Sequence[NodeView],
    name: str,
    ttl: float,
    *,
    waiter: str = "",
    mark_ms: int = WAIT_MARK_MS,
    woken: bool = False,
    permits: int = 0,
    rw: str = "",
    before: tuple[tuple[str | int, ...], ...] = (),
    wait: float = 0.0,
) -> Plan[LeaseRecord | AcquireFailure]:
    """One acquisition attempt; returns a :class:`LeaseRecord` or an :class:`AcquireFailure`.

    ``waiter``: the id of a caller that waits on failure ('' when it will not): a failed
    attempt registers it as a waiter for ``mark_ms`` (none when <= 0), a won one removes it.
    ``woken``: a release woke this caller, so it may take a name reserved for the hand-off.
    ``permits`` > 0: one permit of the semaphore ``name`` (one of its slots held on a quorum:
    the same slot, since each slot excludes like a lock) instead of the lock ``name``.
    ``rw``: ``"read"`` or ``"write"`` for a lease of the read-write lock ``name``.
    ``before``/``wait``: commands sent ahead of the first call on each node (a waiter's
    ``BLPOP``) and how much longer than ``NODE_TIMEOUT`` their replies may take."""
    total = len(nodes)
    needed = quorum(total)
    keys = state.keys
    mark_ms = max(mark_ms, 0) if waiter else 0
    tried: tuple[str, ...]
    touched: tuple[str, ...]
    kind = PERMIT if permits else rw  # the record's and its releases' kind
    if permits:
        # Every caller tries the slots in the same order, so each node grants the lowest free
        # slot: callers racing for k free slots get the slot of their arrival rank on each
        # node, and a split (no slot on a quorum) needs ranks to differ across nodes. Random
        # orders split more often under contention (measured: 3.2x vs 0.6x the contended lock
        # on 5 nodes).
        tried = tuple(keys.permit(name, k) for k in range(permits))
        script = more.PERMIT
        touched = (keys.fence, keys.waiters(name), keys.handoff(name), keys.lock(name), *tried)
    elif rw:
        readers = keys.readers(name)
        tried = (readers,) if rw == READ else (keys.lock(name),)
        script = more.READ if rw == READ else more.WRITE
        touched = (keys.fence, readers, keys.lock(name), keys.waiters(name), keys.handoff(name))
        touched += (keys.writers(name),)
    else:
        tried = (keys.lock(name),)
        script = scripts.ACQUIRE
        touched = (tried[0], keys.fence, keys.waiters(name), keys.handoff(name))
    extra: tuple[int, ...] = (permits,) if permits else ()

    def settled(slots: list[Slot]) -> bool:
        done = [s for s in slots if s.done]
        granted = [_granted_slot(s.value) for s in done if _acquire_status(s) == scripts.GRANTED]
        best = _best_slot(granted)[1] if permits else len(granted)
        return best >= needed or best + total - len(done) < needed

    def give_back(calls: list[Call | None], replies: Sequence[Any], owner: str) -> Plan[None]:
        return _release_calls(state, nodes, calls, replies, owner, name, tried, kind=kind)

    args = (mark_ms, "1" if woken else "0", waiter, *extra)
    first = quorum_first(state, nodes, name)
    try:
        owner, calls, replies, statuses, started = yield from attempt_round(
            state, nodes, script, touched, ttl, args, settled, give_back, before, wait, first
        )
    except Abandoned:
        # the caller gave up with its attempt in flight (attempt_round gave back what it may
        # have got): any node may have registered it as a waiter, for a wait that never comes
        if mark_ms:
            yield from withdraw_plan(state, nodes, (name,), waiter)
        raise
    try:
        granted = [
            _granted_slot(r) if st == scripts.GRANTED else -1
            for r, st in zip(replies, statuses, strict=True)
        ]
        chosen = _best_slot([g for g in granted if g >= 0])[0] if permits else 0
        won = [i for i, g in enumerate(granted) if g == chosen]
        if len(won) >= needed:
            key = tried[chosen - 1] if permits else tried[0]
            token = max(int(replies[i][1]) for i in won)
            behind = [i for i in won if int(replies[i][1]) < token]
            confirmed = len(won) - len(behind)
            if behind and token < TOKEN_LIMIT:
                # a read lease's node holds no value of its own to check: raise the counter only
                held = () if kind == READ else key
                confirmed += yield from write_back(
                    state, nodes, behind, token, held, owner, needed - confirmed, bool(permits)
                )
            validity_deadline = started + ttl - state.drift(ttl)
            if confirmed >= needed and token < TOKEN_LIMIT and time.monotonic() < validity_deadline:
                # nodes that may hold the key (not those that granted another slot)
                reached = tuple(
                    g is None or (g and granted[i] == chosen)
                    for i, g in enumerate(granted_per_node(replies, _acquired))
                )
                if permits and any(g not in (-1, chosen) for g in granted):
                    yield from _release_calls(
                        state, nodes, calls, replies, owner, name, tried, kind=kind, kept=won
                    )
                if mark_ms:
                    yield from _withdraw(state, nodes, statuses, name, waiter)
                marker = keys.lock(name) if kind in (PERMIT, READ) else ""
                record = LeaseRecord(name, key, owner, token, ttl, validity_deadline)
                record.reached, record.voters = reached, tuple(won)
                if permits:
                    record.slots = tried
                return record.with_kind(marker, kind)

        failure = failure_of(nodes, replies, statuses, len(won))
        # a caller that will wait registers where it gives a grant back; one that will not
        # (no wait ends a conflict of kinds) withdraws where a "busy" registered it
        waits = mark_ms if not failure.final else 0
        yield from _release_calls(
            state, nodes, calls, replies, owner, name, tried, waits, waiter, kind=kind
        )
        if mark_ms and not waits:
            yield from _withdraw(state, nodes, statuses, name, waiter)
        return failure
    except Abandoned:
        # the caller gave up while a call was in flight: any node may have granted it, and
        # it waits no more
        yield from _release_calls(
            state, nodes, calls, [None] * total, owner, name, tried, kind=kind
        )
        if mark_ms:
            yield from withdraw_plan(state, nodes, (name,), waiter)
        raise


class Attempted(NamedTuple):
    """One attempt's round: the owner value it used, its calls and what the nodes said."""

    owner: str
    calls: list[Call | None]
    replies: list[Any]
    #: per node: the reply's status code, None for a node that failed
    statuses: list[int | None]
    #: when the attempt was sent (our clock); for one carried behind a wait, when the node
    #: could first run it: the write, plus how long the node held the attempt back
    started: float


def attempt_round(
    state: AliasState,
    nodes: Sequence[NodeView],
    script: scripts.Script,
    touched: tuple[str, ...],
    ttl: float,
    args: tuple[str | int, ...],
    settled: Callable[[list[Slot]], bool],
    give_back: Callable[[list[Call | None], Sequence[Any], str], Plan[None]],
    before: tuple[tuple[str | int, ...], ...] = (),
    wait: float = 0.0,
    first: Collection[int] | None = None,
    tokens: int = 1,
) -> Plan[Attempted]:
    """Send an acquiring ``script`` to every trusted node, with the args ``(owner, ttl_ms,
    run_id, value suffix, *args)``; when untrusted nodes kept it from a quorum, rejoin them
    if that is safe (or another process just did) and try once more with a new owner, after
    ``give_back`` (fire and forget) released what the first try got. If the caller gives up
    meanwhile, ``give_back`` releases everything it may have got. ``before``: commands sent
    ahead of the first try's calls, whose replies may take ``wait`` seconds longer (and a
    node's :attr:`~.state.NodeView.tick`, the lateness of a timed-out ``BLPOP``); they are
    sent between two readings of the node's clock (see :data:`CLOCK`), so the attempt's
    validity counts from when the node could run it, not from before the wait.

    ``first``: the nodes to ask first (a quorum, see :func:`quorum_first`); the others are
    asked as a hedge (:class:`~.replies.Request` ``later``) when those have not settled the
    attempt within :meth:`AliasState.hedge_delay`, or at once when they all answered without
    settling it, and the replies of every node asked count. ``tokens``: how many tokens one
    grant draws from a node's counter (``lock_many``: one per name)."""
    total = len(nodes)
    needed = quorum(total)
    ttl_ms = math.ceil(ttl * 1000)
    state.longest_ttl_ms = max(state.longest_ttl_ms, ttl_ms)
    suffix = LockValue.suffix(int(time.time() * 1000), state.host, state.pid)
    owner, rejoined = new_owner(), False
    calls: list[Call | None] = []
    later: list[Call | None] | None = None
    before = bracketed(before)

    def call(node: NodeView, ahead: tuple[tuple[str | int, ...], ...] = ()) -> Call | None:
        if node.run_id is None:
            return None
        return Call(script, touched, (owner, ttl_ms, node.run_id, suffix, *args), ahead)

    try:
        while True:
            started = time.monotonic()
            asked = range(total) if first is None or rejoined else first
            calls = [call(node, before) if i in asked else None for i, node in enumerate(nodes)]
            later = None
            if len(asked) < total:
                later = [None if i in asked else call(node) for i, node in enumerate(nodes)]
            hedge = state.hedge_delay()
            # a node ends a timed-out BLPOP on its next cycle: wait for that too, rather than
            # give up on an attempt it is about to run
            late = max(nodes[i].tick for i in asked) if before and asked else 0.0
            timeout = state.node_timeout + wait + late
            request = Request(calls, timeout, settled, later=later, hedge=hedge)
            replies = yield request
            held_back = 0.0
            if before:
                held_back = _held_back(request, time.monotonic() - started)
            before, wait = (), 0.0
            if later is not None:
                hedged = [
                    i for i, c in enumerate(later) if c is not None and replies[i] != _NOT_ASKED
                ]
                calls = [later[i] if i in hedged else c for i, c in enumerate(calls)]
                # A hedged round counts as one that took the hedge delay: the average grows
                # when hedges are common (a delay below the real round trip), but a paused
                # node's long wait does not inflate it (measured: feeding the whole wait cut
                # the long profile's operations by a fifth).
                elapsed = time.monotonic() - started
                state.saw_round_trip(min(elapsed, hedge) if hedged else elapsed)
            statuses = [None if isinstance(r, NodeFailure) else int(r[0]) for r in replies]
            seen = [i for i, st in enumerate(statuses) if st == scripts.UNTRUSTED]
            if seen and statuses.count(scripts.GRANTED) < needed and not rejoined:
                rejoined = True
                drawn = [tokens if st == scripts.GRANTED else 0 for st in statuses]
                if (yield from rejoin_plan(state, nodes, seen, drawn)):
                    yield from give_back(calls, replies, owner)
                    owner = new_owner()
                    continue
            return Attempted(owner, calls, replies, statuses, started + held_back)
    except Abandoned:
        # the caller gave up while a call was in flight: any node may have granted it (a
        # hedge call too, if it went out)
        sent = [c if c is not None else (later[i] if later else None) for i, c in enumerate(calls)]
        yield from give_back(sent, [None] * len(nodes), owner)
        raise


_NOT_ASKED = NodeFailure(NOT_ASKED, sent=False)

#: A reading of the node's clock, sent first and last among the commands an attempt carries
#: ahead of it (a waiter's ``BLPOP``). The node runs the attempt after the second reading, so
#: the time between the two (the wait) is time the lease had not started yet.
CLOCK: tuple[str] = ("TIME",)


def bracketed(before: tuple[tuple[str | int, ...], ...]) -> tuple[tuple[str | int, ...], ...]:
    """``before`` between two :data:`CLOCK` readings (nothing when it is empty)."""
    return (CLOCK, *before, CLOCK) if before else ()


def waited_reply(ahead: Sequence[Any]) -> Any:
    """The reply of the last command an attempt carried ahead of it (a waiter's ``BLPOP``),
    from the replies of everything it carried (see :func:`bracketed`); None without any."""
    return ahead[-2] if len(ahead) >= 3 else None


def _held_back(request: Request, most: float) -> float:
    """How long the node held the attempt back behind the commands carried ahead of it,
    seconds on its clock: the least over the nodes that got them, 0.0 where a clock reading is
    missing. At most ``most``, what our clock saw from the write to the replies, so a node
    clock stepped forward meanwhile does not stretch the lease."""
    ahead = request.ahead or {}
    held: list[float] = []
    for i, call in enumerate(request.calls):
        if call is not None and call.before:
            replies = ahead.get(i, ())
            first = _clock_seconds(replies[0]) if replies else None
            last = _clock_seconds(replies[-1]) if replies else None
            held.append(0.0 if first is None or last is None else last - first)
    return min(max(min(held, default=0.0), 0.0), most)


def _clock_seconds(reply: Any) -> float | None:
    """A ``TIME`` reply in seconds; None for anything else (a failure)."""
    if isinstance(reply, list) and len(reply) == 2:
        return int(reply[0]) + int(reply[1]) / 1_000_000
    return None


def quorum_first(state: AliasState, nodes: Sequence[NodeView], name: str) -> list[int] | None:
    """The quorum of nodes a quorum-first attempt on ``name`` asks first (None: ask all):
    the node its waiters block on, then the next ones in order, skipping nodes that are down
    or behind (a call still unanswered). Every caller of a name picks the same nodes while
    they are healthy, so its waiters, releases and reservations meet on them."""
    total = len(nodes)
    needed = quorum(total)
    if not state.quorum_first or total < 3:
        return None
    start = wake_node(name, total)
    chosen = []
    for step in range(total):
        i = (start + step) % total
        if nodes[i].run_id is not None and not nodes[i].behind:
            chosen.append(i)
            if len(chosen) == needed:
                return chosen
    return None


def write_back(
    state: AliasState,
    nodes: Sequence[NodeView],
    behind: Sequence[int],
    token: int,
    key: str | tuple[str, ...],
    owner: str,
    still_needed: int,
    strict: bool = False,
) -> Plan[int]:
    """Raise the counter of the winners that are ``behind`` to ``token``; returns how many
    of them still hold the lock (a node that lost it since the acquire does not count: someone
    else may have taken it there and read the old counter). Settles once ``still_needed``
    of them confirmed. ``key``: the lock's key, or every key of a ``lock_many`` set."""
    calls: list[Call | None] = [None] * len(nodes)
    for i in behind:
        run_id = nodes[i].run_id
        if run_id is not None:
            args = (token, run_id, owner, "1" if strict else "0")
            held = (key,) if isinstance(key, str) else key
            calls[i] = Call(scripts.RAISE, (state.keys.fence, *held), args)

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
    """Fire-and-forget: the caller won (or will not wait after all), so it stops counting as
    a waiter on the nodes that answered "busy" (and registered it there). Nothing is sent
    when no node did."""
    busy = [i for i, status in enumerate(statuses) if status == scripts.BUSY]
    return withdraw_plan(state, nodes, (name,), waiter, busy)


def withdraw_plan(
    state: AliasState,
    nodes: Sequence[NodeView],
    names: Sequence[str],
    waiter: str,
    only: Collection[int] | None = None,
) -> Plan[None]:
    """Fire-and-forget: ``waiter`` stops counting as a waiter of ``names`` on every node
    (``only``: on those), so no release reserves a name for a caller that has stopped waiting.
    Sent on the connection of the call in flight, it runs after that call on each node."""
    keys = tuple(state.keys.waiters(name) for name in names)
    calls: list[Call | None] = [
        Call(scripts.WITHDRAW, keys, (waiter,)) if only is None or i in only else None
        for i in range(len(nodes))
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


def failure_of(
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
    errors = node_errors(nodes, replies)
    if scripts.OTHER_KIND in statuses:
        return AcquireFailure("other_kind", votes, trusted_answers, errors)
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
    replies: Sequence[Any],
    owner: str,
    name: str,
    tried: tuple[str, ...],
    mark_ms: int = 0,
    waiter: str = "",
    *,
    kind: str = "",
    kept: Collection[int] = (),
) -> Plan[None]:
    """Fire-and-forget release of an attempt's grants on every node that may hold one: those
    that granted it, or that got the call and did not answer (a reply of None: it may have
    executed it), not those that said no. ``tried``: the keys the attempt may have taken (a
    lock's key, or a semaphore's slots in the order tried: a node that answered releases the
    slot it granted, one that did not releases whichever slot has this owner). ``mark_ms``
    > 0: the caller will wait, so each release also registers ``waiter`` there. ``kind``: the
    attempt's (:attr:`LeaseRecord.kind`); ``kept``: nodes whose grant stays (the permit's).

    A release is sent on the same connection as the acquire, so on a paused node it runs right
    after the late SET when the node resumes; no stale key outlives the pause.
    """
    release: list[Call | None] = [None] * len(nodes)
    waking = wake_node(name, len(nodes))
    for i, (call, reply) in enumerate(zip(calls, replies, strict=True)):
        if call is None or i in kept:
            continue
        if isinstance(reply, NodeFailure) or reply is None:
            if isinstance(reply, NodeFailure) and not reply.sent:
                continue
            held = tried  # it may have granted any of them
        elif int(reply[0]) == scripts.GRANTED:
            slot = _granted_slot(reply)
            held = (tried[slot - 1],) if slot else tried
        else:
            continue  # it said no (and registered the caller, if it will wait)
        release[i] = state.release_call(
            name,
            owner,
            wakes=i == waking,
            mark_ms=mark_ms,
            waiter=waiter,
            held=held,
            kind=kind,
            slots=tried,
        )
    if any(release):
        yield Request(release, 0.0, wait=False)


def _acquired(reply: Any) -> bool:
    return int(reply[0]) == scripts.GRANTED
