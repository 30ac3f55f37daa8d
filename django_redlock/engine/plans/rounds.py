"""The round every acquiring plan shares: send an attempt to the nodes (a quorum first, the rest
as a hedge), rejoin restarted nodes once, read the node clocks around a carried wait (the
write-back of tokens to winners that are behind: :mod:`.tokens`)."""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Collection, Sequence
from typing import Any, NamedTuple

from .. import scripts
from ..keyspace import LockValue, new_owner, quorum, wake_node
from ..replies import NOT_ASKED, Call, NodeFailure, Request, Slot, statuses_of
from ..state import Abandoned, AliasState, NodeView, Plan
from .trust import rejoin_plan


class Sent(NamedTuple):
    """An attempt's first round made outside the plan (the single-node lane,
    :mod:`..lane`): the owner and value suffix it sent, when, and what the nodes answered
    (None: the caller gave up before the replies came). The plan resumes from it as if it
    had sent the round itself."""

    owner: str
    suffix: str
    started: float
    replies: list[Any] | None
    #: per node, the run id the round was sent with: a connection may have broken since (its
    #: run id then reads None), and the round's give-back must still go to that node
    run_ids: tuple[str | None, ...] = ()


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
    sent: Sent | None = None,
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
    grant draws from a node's counter (``lock_many``: one per name). ``sent``: the first
    round, already made (by the single-node lane): it is not sent again."""
    total = len(nodes)
    needed = quorum(total)
    ttl_ms = math.ceil(ttl * 1000)
    state.longest_ttl_ms = max(state.longest_ttl_ms, ttl_ms)
    if sent is None:
        suffix = LockValue.suffix(int(time.time() * 1000), state.host, state.pid)
        owner = new_owner()
    else:
        suffix, owner = sent.suffix, sent.owner
    rejoined = False
    calls: list[Call | None] = []
    later: list[Call | None] | None = None
    before = bracketed(before)

    def call(i: int, node: NodeView, ahead: tuple[tuple[str | int, ...], ...] = ()) -> Call | None:
        # the round the lane sent, as it was sent (its node may read disconnected by now)
        run_id = node.run_id
        if run_id is None and sent is not None and sent.run_ids:
            run_id = sent.run_ids[i]
        if run_id is None:
            return None
        return Call(script, touched, (owner, ttl_ms, run_id, suffix, *args), ahead)

    try:
        while True:
            started = time.monotonic() if sent is None else sent.started
            asked = range(total) if first is None or rejoined else first
            calls = [call(i, node, before) if i in asked else None for i, node in enumerate(nodes)]
            later = None
            if len(asked) < total:
                later = [None if i in asked else call(i, node) for i, node in enumerate(nodes)]
            hedge = state.hedge_delay()
            # a node ends a timed-out BLPOP on its next cycle: wait for that too, rather than
            # give up on an attempt it is about to run
            late = max(nodes[i].tick for i in asked) if before and asked else 0.0
            timeout = state.node_timeout + wait + late
            request = Request(calls, timeout, settled, later=later, hedge=hedge)
            if sent is None:
                replies = yield request
            elif sent.replies is None:
                raise Abandoned
            else:
                replies, sent = sent.replies, None
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
            statuses = statuses_of(replies)
            seen = [i for i, st in enumerate(statuses) if st == scripts.UNTRUSTED]
            if seen and not rejoined:
                rejoined = True
                if statuses.count(scripts.GRANTED) >= needed:
                    # won all the same: let the restarted nodes rejoin as soon as they may,
                    # while a quorum of trusted nodes answers, not first when an attempt
                    # lacks one (rejoin_plan looks at most every REJOIN_INTERVAL meanwhile)
                    yield from rejoin_plan(state, nodes, seen)
                    return Attempted(owner, calls, replies, statuses, started + held_back)
                drawn = [tokens if st == scripts.GRANTED else 0 for st in statuses]
                if (yield from rejoin_plan(state, nodes, seen, drawn)):
                    yield from give_back(calls, replies, owner)
                    owner = new_owner()
                    continue
            return Attempted(owner, calls, replies, statuses, started + held_back)
    except BaseException as given_up:  # Abandoned, or an interrupt in this code
        if isinstance(given_up, GeneratorExit):  # closed: nothing may be yielded
            raise
        # the caller gave up while a call was in flight: any node may have granted it (a
        # hedge call too, if it went out)
        out = [c if c is not None else (later[i] if later else None) for i, c in enumerate(calls)]
        if len(out) == len(nodes):  # else interrupted before its first calls were made
            yield from give_back(out, [None] * len(nodes), owner)
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
            held.append(held_back(ahead.get(i, ()), most))
    return min(held, default=0.0)


def held_back(ahead: Sequence[Any], most: float) -> float:
    """One node's :func:`_held_back`: the time between the first and the last of the
    ``ahead`` replies (two ``TIME`` readings around a wait, see :func:`bracketed`), 0.0 where
    a reading is missing, between 0.0 and ``most``."""
    first = _clock_seconds(ahead[0]) if ahead else None
    last = _clock_seconds(ahead[-1]) if ahead else None
    return 0.0 if first is None or last is None else min(max(last - first, 0.0), most)


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
