"""Fire-and-forget plans of the waiter sets: withdraw a caller that stops waiting, register one
that queues without a failed attempt."""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import Any, TypeVar

from .. import scripts
from ..keyspace import wake_node
from ..replies import Call, Request, unanswered
from ..state import AliasState, NodeView, Plan

T = TypeVar("T")


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
    keyspace = state.keys
    keys = tuple(k for n in names for k in (keyspace.waiters(n), keyspace.handoff(n)))
    calls: list[Call | None] = [
        Call(scripts.WITHDRAW, keys, (waiter,)) if only is None or i in only else None
        for i in range(len(nodes))
    ]
    if any(calls):
        yield Request(calls, 0.0, wait=False)


def withdraw_registered(
    state: AliasState,
    nodes: Sequence[NodeView],
    names: Sequence[str],
    waiter: str,
    replies: Sequence[Any],
    statuses: Sequence[int | None],
) -> Plan[None]:
    """Fire-and-forget: the caller of an attempt that registers it (it won, or will not wait
    after all) stops counting as a waiter of ``names`` where that attempt may have registered
    it: the nodes that answered "busy", and those whose reply had not come when the attempt
    was decided (a quorum answered first: such a node may still run it, find the name held
    there by a release that has not reached it yet, and register the caller). Sent on the
    attempt's connections, the withdrawal runs after it on each node."""
    registered = [
        i
        for i, (reply, status) in enumerate(zip(replies, statuses, strict=True))
        if status == scripts.BUSY or unanswered(reply)
    ]
    return withdraw_plan(state, nodes, names, waiter, registered)


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


def withdrawing(
    attempt: Plan[T],
    state: AliasState,
    nodes: Sequence[NodeView],
    names: Sequence[str],
    waiter: str,
    mark_ms: int,
) -> Plan[T]:
    """``attempt`` (an attempt round registering ``waiter`` for ``mark_ms`` on a busy name);
    given up mid-attempt (``Abandoned``, an interrupt), the caller waits for none of the
    ``names`` any more, and any node may have registered it: its registrations are withdrawn
    on the way out (the attempt round gave back what it may have got)."""
    try:
        return (yield from attempt)
    except BaseException as given_up:
        if isinstance(given_up, GeneratorExit):  # closed: nothing may be yielded
            raise
        if mark_ms:
            yield from withdraw_plan(state, nodes, names, waiter)
        raise
