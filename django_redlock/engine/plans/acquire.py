"""One acquisition attempt of a lock, a semaphore's permit or a read-write lease (I/O-free)."""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Collection, Sequence
from typing import Any

from .. import scripts
from ..keyspace import TOKEN_LIMIT, Keyspace, quorum, wake_node
from ..kinds import KINDS, PERMIT
from ..replies import SILENT, Call, NodeFailure, Request, Slot, granted_per_node, node_errors
from ..state import (
    WAIT_MARK_MS,
    AcquireFailure,
    AliasState,
    LeaseRecord,
    NodeView,
    Plan,
)
from .rounds import Sent, attempt_round, quorum_first
from .tokens import own_tokens
from .waiters import withdraw_plan, withdraw_registered, withdrawing

#: Why a node's vote did not count while it is in the restart quarantine (docs/algorithm.md).
QUARANTINED = (
    "quarantined: its fence state is missing or from an earlier run (restarted, wiped, evicted"
    " or new node); it votes again once every lease it may have lost has expired"
)


def _acquire_status(slot: Slot) -> int | None:
    if not slot.done or isinstance(slot.value, NodeFailure):
        return None
    return int(slot.value[0])


def granted_slot(reply: Any) -> int:
    """The slot a PERMIT reply granted (1-based position in the tried order); 0 for a lock."""
    return int(reply[2]) if len(reply) > 2 and int(reply[0]) == scripts.GRANTED else 0


def _best_slot(slots_granted: Sequence[int]) -> tuple[int, int]:
    """The slot most nodes granted and how many granted it ((0, 0) when none did)."""
    counts: dict[int, int] = {}
    for slot in slots_granted:
        counts[slot] = counts.get(slot, 0) + 1
    return max(((n, slot) for slot, n in counts.items()), default=(0, 0))[::-1]


def attempt_settled(total: int, permits: int) -> Callable[[list[Slot]], bool]:
    """An attempt's ``settled()`` on ``total`` nodes: a quorum granted (for a permit, the same
    slot), or it no longer can."""
    needed = quorum(total)

    def settled(slots: list[Slot]) -> bool:
        done = [s for s in slots if s.done]
        granted = [granted_slot(s.value) for s in done if _acquire_status(s) == scripts.GRANTED]
        best = _best_slot(granted)[1] if permits else len(granted)
        return best >= needed or best + total - len(done) < needed

    return settled


def won_record(
    keys: Keyspace,
    name: str,
    kind: str,
    tried: tuple[str, ...],
    slot: int,
    owner: str,
    token: int,
    ttl: float,
    deadline: float,
    reached: tuple[bool, ...],
    voters: tuple[int, ...],
) -> LeaseRecord:
    """The record of a lease of ``kind`` won at ``token`` on the key of ``tried`` the grants
    named (``slot``: a permit's, from 1), complete when made: it is noted on the caller's
    handoff as it is made, and an interrupt right after gives back what it says (a kind set
    later was missing: a read lease given back as a lock failed ``WRONGTYPE``)."""
    permit = kind == PERMIT
    return LeaseRecord(
        name,
        tried[slot - 1] if permit else tried[0],
        owner,
        token,
        ttl,
        deadline,
        reached=reached,
        marker=keys.lock(name) if KINDS[kind].marked else "",
        kind=kind,
        voters=voters,
        slots=tried if permit else (),
    )


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
    sent: Sent | None = None,
) -> Plan[LeaseRecord | AcquireFailure]:
    """One acquisition attempt; returns a :class:`LeaseRecord` or an :class:`AcquireFailure`.

    ``waiter``: the id of a caller that waits on failure ('' when it will not): a failed
    attempt registers it as a waiter for ``mark_ms`` (none when <= 0), a won one removes it.
    ``woken``: a release woke this caller, so it may take a name reserved for the hand-off.
    ``permits`` > 0: one permit of the semaphore ``name`` (one of its slots held on a quorum:
    the same slot, since each slot excludes like a lock) instead of the lock ``name``.
    ``rw``: ``"read"`` or ``"write"`` for a lease of the read-write lock ``name``.
    ``before``/``wait``: commands sent ahead of the first call on each node (a waiter's
    ``BLPOP``) and how much longer than ``NODE_TIMEOUT`` their replies may take. ``sent``: the
    first round, already made by the single-node lane (see :class:`.rounds.Sent`)."""
    total = len(nodes)
    needed = quorum(total)
    keys = state.keys
    mark_ms = max(mark_ms, 0) if waiter else 0
    kind = PERMIT if permits else rw  # the record's and its releases' kind
    spec = KINDS[kind]
    tried, touched = spec.acquire_keys(keys, name, permits)
    script = spec.acquire
    extra: tuple[int, ...] = (permits,) if permits else ()

    settled = attempt_settled(total, permits)

    def give_back(calls: list[Call | None], replies: Sequence[Any], owner: str) -> Plan[None]:
        return _release_calls(state, nodes, calls, replies, owner, name, tried, kind=kind)

    args = (mark_ms, "1" if woken else "0", waiter, *extra)
    first = quorum_first(state, nodes, name)
    attempt = attempt_round(
        state,
        nodes,
        script,
        touched,
        ttl,
        args,
        settled,
        give_back,
        before,
        wait,
        first,
        sent=sent,
    )
    owner, calls, replies, statuses, started = yield from withdrawing(
        attempt, state, nodes, (name,), waiter, mark_ms
    )
    try:
        granted = [
            granted_slot(r) if st == scripts.GRANTED else -1
            for r, st in zip(replies, statuses, strict=True)
        ]
        chosen = _best_slot([g for g in granted if g >= 0])[0] if permits else 0
        won = [i for i, g in enumerate(granted) if g == chosen]
        raced = False
        if len(won) >= needed:
            key = tried[chosen - 1] if permits else tried[0]
            # a read lease's node holds no value of its own to check: raise the counter only
            held = ((key, 0),) if spec.own_value else ()
            owned = yield from own_tokens(
                state,
                nodes,
                {i: int(replies[i][1]) for i in won},
                1,
                lambda _i: held,
                lambda ok: len(ok) >= needed,
                owner,
            )
            token, confirmed, raced = owned.first, len(owned.confirmed), owned.raced
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
                    yield from withdraw_registered(state, nodes, (name,), waiter, replies, statuses)
                return won_record(
                    keys,
                    name,
                    kind,
                    tried,
                    chosen,
                    owner,
                    token,
                    ttl,
                    validity_deadline,
                    reached,
                    tuple(won),
                )

        failure = failure_of(nodes, replies, statuses, len(won))
        # a quorum granted it, but racers kept passing its token on a winner: not busy
        failure.raced = raced and failure.reason == "busy"
        # a caller that will wait registers where it gives a grant back. One that will not
        # (no wait ends a conflict of kinds) withdraws where a "busy" registered it. A raced
        # caller tries again at once: its give-back registers nobody (it would leave the
        # caller a wake-up it never pops) and is awaited (that attempt may go out on other
        # connections, find the grants still there and be refused a name nobody holds).
        waits = 0 if failure.final or failure.raced else mark_ms
        # a woken caller that retries quickly does not block either: no wake-up of its own
        quick = failure.retried_quickly(woken)
        yield from _release_calls(
            state,
            nodes,
            calls,
            replies,
            owner,
            name,
            tried,
            waits,
            waiter,
            kind=kind,
            self_wake=not quick,
            waited=failure.raced,
        )
        if mark_ms and failure.final:
            yield from withdraw_registered(state, nodes, (name,), waiter, replies, statuses)
        return failure
    except BaseException as given_up:  # Abandoned, or an interrupt in this code
        if isinstance(given_up, GeneratorExit):  # closed: nothing may be yielded
            raise
        # the caller gave up while a call was in flight: any node may have granted it, and
        # it waits no more
        yield from _release_calls(
            state, nodes, calls, [None] * total, owner, name, tried, kind=kind
        )
        if mark_ms:
            yield from withdraw_plan(state, nodes, (name,), waiter)
        raise


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
    if trusted_answers >= quorum(total):  # a quorum voted and split (a permit's slots)
        return AcquireFailure("busy", votes, trusted_answers, errors, retry_after)
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
    self_wake: bool = True,
    waited: bool = False,
) -> Plan[None]:
    """Release of an attempt's grants (fire-and-forget unless ``waited``) on every node that
    may hold one: those
    that granted it, or that got the call and did not answer (a reply of None: it may have
    executed it), not those that said no. ``tried``: the keys the attempt may have taken (a
    lock's key, or a semaphore's slots in the order tried: a node that answered releases the
    slot it granted, one that did not releases whichever slot has this owner). ``mark_ms``
    > 0: the caller will wait, so each release also registers ``waiter`` there and, on the
    node waiters block on, leaves the caller a wake-up of its own where it is new (unless
    ``self_wake`` is False: a caller that will not block next). ``kind``: the attempt's
    (:attr:`LeaseRecord.kind`); ``kept``: nodes whose grant stays (the permit's).
    ``waited``: the replies are awaited (up to ``NODE_TIMEOUT``), so that a call the caller
    makes next, maybe on other connections, reaches each node that answered after it.

    A release is sent on the same connection as the acquire, so on a paused node it runs right
    after the late SET when the node resumes; no stale key outlives the pause.
    """
    release: list[Call | None] = [None] * len(nodes)
    # a registering give-back's wake-up is only ever the caller's own
    waking = wake_node(name, len(nodes)) if self_wake or not mark_ms else -1
    for i, (call, reply) in enumerate(zip(calls, replies, strict=True)):
        if call is None or i in kept:
            continue
        if isinstance(reply, NodeFailure) or reply is None:
            if isinstance(reply, NodeFailure) and not reply.sent:
                continue
            held = tried  # it may have granted any of them
        elif int(reply[0]) == scripts.GRANTED:
            slot = granted_slot(reply)
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
        owe = functools.partial(owe_give_back, state, name, owner, tried, kind, len(nodes))
        timeout = state.node_timeout if waited else 0.0
        yield Request(release, timeout, wait=waited, unanswered=owe)


def owe_give_back(
    state: AliasState,
    name: str,
    owner: str,
    tried: tuple[str, ...],
    kind: str,
    total: int,
    node: int,
) -> None:
    """A give-back that did not reach ``node`` (its connection broke before the reply was
    read, or it could not be sent): ``state.owed`` gets a record of the grant to release there,
    which the engine sends again on a new connection until the key's TTL could have run out."""
    ttl = state.longest_ttl_ms / 1000
    record = LeaseRecord(
        name,
        tried[0],
        owner,
        ttl=ttl,
        deadline=time.monotonic() + ttl,
        reached=tuple(i == node for i in range(total)),
        kind=kind,
        slots=tried if len(tried) > 1 else (),
    )
    record.released, record.unsure = True, (node,)
    state.owed.append(record)


def _acquired(reply: Any) -> bool:
    return int(reply[0]) == scripts.GRANTED
