"""The single-node lane (``engine/lane.py``) agrees with the plans on the same scripted replies.

For each reply a node may give a lock's first attempt, the plan is run from scratch, and the
lane's way is run beside it: the lane's own record when it settles the reply itself, else the
plan resumed from the round the lane made (``Sent``). Both must send the same calls (the lane's
bytes are the plan's call, key for key, argument for argument), ask the same follow-up
requests and end with the same outcome. Releases likewise. No Redis, no database.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

import pytest

from django_redlock.engine import lane, plans
from django_redlock.engine.keyspace import TOKEN_LIMIT
from django_redlock.engine.kinds import KINDS as KIND_TABLE
from django_redlock.engine.plans.acquire import won_record
from django_redlock.engine.plans.rounds import Sent
from django_redlock.engine.replies import NodeFailure, Request
from django_redlock.engine.state import Abandoned, AcquireFailure, AliasState, LeaseRecord
from django_redlock.engine.transport.base import pack
from tests.engine import test_plans
from tests.support.scripted import Clock, FakeNode, fake_nodes

NAME = "job"
START = test_plans.START
# the plan tests' fixtures: no redis-server, the plans' fake clock, an alias state
_session_redlock, clock, state = test_plans._session_redlock, test_plans.clock, test_plans.state


def _later(call: Any) -> Any:
    """What the node answers to the requests after the first (a rejoin's probe and rejoin,
    a second attempt, releases)."""
    name = call.script.name
    if name == "probe":
        return ["r0", 40, 0, 1, -1]
    if name == "rejoin":
        return 40
    if name in ("acquire", "read", "write"):
        return [1, 41, 0]
    if name == "permit":
        return [1, 41, 1]
    return 1


def _shape(request: Request) -> tuple[Any, ...]:
    calls = tuple(
        None if c is None else (c.script.name, c.keys, c.args, c.before) for c in request.calls
    )
    return (request.wait, calls)


def _finish(
    plan: Any, request: Request | None = None, first: Any = None
) -> tuple[Any, list[tuple[Any, ...]]]:
    """Run ``plan`` to its end (from ``request`` if it already yielded one); the first
    request it waits on gets ``first`` (unless None), later ones :func:`_later`. Returns its
    outcome and the shape of every request."""
    shapes: list[tuple[Any, ...]] = []
    try:
        if request is None:
            request = next(plan)
        while True:
            shapes.append(_shape(request))
            if not request.wait:
                replies: list[Any] = [None] * len(request.calls)
            elif first is not None:
                replies, first = [first], None
            else:
                replies = [None if c is None else _later(c) for c in request.calls]
            request = plan.send(replies)
    except StopIteration as done:
        return done.value, shapes


def _outcome(value: Any) -> Any:
    if isinstance(value, LeaseRecord):
        return (
            "lease",
            value.name,
            value.key,
            value.owner,
            value.token,
            value.ttl,
            value.deadline,
            value.reached,
            value.voters,
            value.kind,
            value.marker,
        )
    assert isinstance(value, AcquireFailure)
    return ("failure", value.reason, value.votes, value.answered, value.errors, value.retry_after)


def planned_from_scratch(
    make: Any, state: AliasState, clock: Clock, late: bool, finish: Any
) -> tuple[Request, str, str, Any, list[tuple[Any, ...]]]:
    """The plan run from scratch (``late``: its validity gone by the time the replies come):
    its first request, the owner and value suffix of its first call, and what ``finish(plan,
    request)`` returns (its outcome and the shape of every request); then the state's trust
    bookkeeping reset, as the lane's run will find it."""
    plan = make()
    request = next(plan)
    call = request.calls[0]
    assert call is not None
    if late:
        clock.advance(5.0)
    expected, shapes = finish(plan, request)
    state.untrusted_seen.clear()
    state.next_rejoin_check = 0.0
    return request, str(call.args[0]), str(call.args[3]), expected, shapes


REPLIES: dict[str, Any] = {
    "granted": [1, 7, 0],
    "granted at the token limit": [1, TOKEN_LIMIT, 0],
    "busy": [0, 6, 1200],
    "busy, no ttl left": [0, 6, -1],
    "another kind": [-2, 6, 0],
    "untrusted": [-1, 0, 0],
    "timed out": "timed out",
    "refused by the server": "ResponseError: OOM command not allowed",
    "never sent": "down: Connection refused",
}


#: every kind of lease on one name: (the record's kind, a permit's semaphore size)
KINDS = {"lock": ("", 0), "permit": ("permit", 3), "read": ("read", 0), "write": ("write", 0)}
#: a permit's grants name a slot (from 1): the third slot, and one out of range
PERMIT_REPLIES = {"granted another slot": [1, 7, 3], "granted no slot": [1, 7, 0]}


def _reply(key: str, kind: str = "") -> Any:
    from django_redlock.engine.replies import NodeFailure

    value = PERMIT_REPLIES[key] if key in PERMIT_REPLIES else REPLIES[key]
    if isinstance(value, str):
        return NodeFailure(value, sent=not value.startswith("down"))
    if kind == "permit" and key.startswith("granted") and key not in PERMIT_REPLIES:
        return [*value[:2], 1]  # the first slot
    return value


def plan_maker(
    state: AliasState, nodes: Any, kind: str, waiter: str, mark_ms: int, woken: bool
) -> Callable[..., Any]:
    """``make(sent=None)``: the acquire plan of a lease of ``kind`` on :data:`NAME` (TTL 5 s)
    on ``nodes``, as the engine makes it for an attempt (``woken``: after a wake-up)."""
    kind_args = attempt_args(kind)

    def make(sent: Sent | None = None) -> Any:
        return plans.acquire_plan(
            state,
            nodes,
            NAME,
            5.0,
            waiter=waiter,
            mark_ms=mark_ms,
            woken=woken,
            sent=sent,
            **kind_args,
        )

    return make


def attempt_args(kind: str) -> dict[str, Any]:
    """``acquire_plan``'s keyword arguments for a lease of ``kind`` (a key of :data:`KINDS`)."""
    record_kind, permits = KINDS[kind]
    return {"permits": permits} if permits else {"rw": record_kind}


@pytest.mark.parametrize("woken", [False, True], ids=["first", "woken"])
@pytest.mark.parametrize("late", [False, True], ids=["in time", "validity gone"])
@pytest.mark.parametrize("waiter", ["", "w1"], ids=["timeout=0", "waits"])
@pytest.mark.parametrize("key", [*REPLIES, *PERMIT_REPLIES])
@pytest.mark.parametrize("kind", list(KINDS))
def test_the_lane_acquires_as_the_plan_does(
    state: AliasState,
    clock: Clock,
    kind: str,
    key: str,
    waiter: str,
    late: bool,
    woken: bool,
    monkeypatch: Any,
) -> None:
    """Same first call, same follow-ups, same outcome, for every kind of lease and reply; a
    first attempt, or one of the acquire loop's after a release woke the caller."""
    if key in PERMIT_REPLIES and kind != "permit":
        pytest.skip("only a permit's grant names a slot")
    owners = iter(f"{i:032x}" for i in range(100))
    monkeypatch.setattr(
        sys.modules[plans.attempt_round.__module__], "new_owner", lambda: next(owners)
    )
    nodes: list[FakeNode] = fake_nodes(1)
    mark_ms = 1000 if waiter else 0
    reply = _reply(key, KINDS[kind][0])
    make = plan_maker(state, nodes, kind, waiter, mark_ms, woken)
    request, owner, suffix, expected, expected_shapes = planned_from_scratch(
        make, state, clock, late, lambda plan, request: _finish(plan, request, reply)
    )
    call = request.calls[0]
    assert call is not None
    owners = iter(f"{i:032x}" for i in range(1, 100))  # the lane's run draws the same ones

    # the lane: the same bytes, then its own record or the plan resumed
    attempt = lane_attempt(state, kind, waiter, mark_ms, lambda s: None, woken)
    assert attempt.script is call.script
    tail = lane.acquire_tail(attempt, owner, 5000, "r0", suffix)
    assert all(type(a) is str for a in tail)  # hiredis turns no number into text (see texts)
    assert pack(tail) == pack((len(call.keys), *call.keys, *call.args))
    started = START
    record = lane.granted_record(attempt, owner, started, reply)
    if record is not None:
        got, shapes = record, [_shape(request)]
        # the lane settles a plain grant (of a slot that exists), nothing else
        assert key in ("granted", "granted another slot") and not late
    else:
        got, shapes = _finish(make(Sent(owner, suffix, started, [reply])))
        shapes = [_shape(request), *shapes]
    assert _outcome(got) == _outcome(expected)
    assert shapes == expected_shapes


@pytest.mark.parametrize(
    "reply", [1, 2, 0, "timed out"], ids=["released", "handed off", "not held", "timed out"]
)
@pytest.mark.parametrize("valid", [4.0, -1.0], ids=["valid", "expired"])
@pytest.mark.parametrize("lost", [False, True], ids=["held", "found lost"])
@pytest.mark.parametrize("kind", list(KINDS))
def test_the_lane_releases_as_the_plan_does(
    state: AliasState, kind: str, reply: Any, valid: float, lost: bool
) -> None:
    """Same call, same outcome, same hand-off flag, for every kind of lease and reply."""
    from django_redlock.engine.replies import NodeFailure

    answer = NodeFailure(reply) if isinstance(reply, str) else reply

    def lease() -> LeaseRecord:
        record = lease_of_kind(state, kind, START + valid, (True,))
        record.voters, record.lost = (0,), lost
        return record

    planned = lease()
    plan = plans.release_plan(state, fake_nodes(1), planned)
    request = next(plan)
    call = request.calls[0]
    assert call is not None and call.script is KIND_TABLE[planned.kind].release
    try:
        plan.send([answer])
    except StopIteration as done:
        expected = done.value
    laned = lease()
    tail = lane.release_tail(state, laned)
    assert all(type(a) is str for a in tail)
    assert pack(tail) == pack((len(call.keys), *call.keys, *call.args))
    was_valid = laned.validity() > 0
    assert lane.release_outcome(laned, answer, was_valid) == expected
    assert laned.handed_off == planned.handed_off


def lane_attempt(
    state: AliasState, kind: str, waiter: str, mark_ms: int, resume: Any, woken: bool = False
) -> lane.LaneAttempt:
    """The lanes' attempt at a lease of ``kind`` (a key of :data:`KINDS`) on :data:`NAME`,
    with a TTL of 5 s, resumed with ``resume(sent)`` (``woken``: a release woke the caller)."""
    record_kind, permits = KINDS[kind]
    return lane.LaneAttempt(state, NAME, 5.0, waiter, mark_ms, woken, resume, record_kind, permits)


def lease_of_kind(
    state: AliasState, kind: str, deadline: float, reached: tuple[bool, ...]
) -> LeaseRecord:
    """A lease of ``kind`` (a key of :data:`KINDS`) on :data:`NAME` held by one owner, as the
    acquire plan records it (a permit: on its second slot)."""
    record_kind, permits = KINDS[kind]
    tried, _ = KIND_TABLE[record_kind].acquire_keys(state.keys, NAME, permits)
    slot = 2 if permits else 1
    return won_record(
        state.keys, NAME, record_kind, tried, slot, "a" * 32, 12, 5.0, deadline, reached, ()
    )


def test_an_abandoned_lane_attempt_gives_back_what_the_plan_would(state: AliasState) -> None:
    """A caller interrupted with the lane's call in flight: the resumed plan releases the
    name (fire and forget, the owner the lane sent) and withdraws the waiter, as the plan does
    when its own call is abandoned."""
    nodes = fake_nodes(1)
    plan = plans.acquire_plan(state, nodes, NAME, 5.0, waiter="w1", mark_ms=1000)
    request = next(plan)
    call = request.calls[0]
    assert call is not None
    owner, suffix = call.args[0], call.args[3]
    expected: list[Any] = []
    try:
        nxt = plan.throw(plans_abandoned())
        while True:
            expected.append(_shape(nxt))
            nxt = plan.send([None])
    except (StopIteration, type(plans_abandoned())):
        pass
    resumed = plans.acquire_plan(
        state, nodes, NAME, 5.0, waiter="w1", mark_ms=1000, sent=Sent(owner, suffix, START, None)
    )
    got: list[Any] = []
    with pytest.raises(type(plans_abandoned())):
        nxt = next(resumed)
        while True:
            got.append(_shape(nxt))
            nxt = resumed.send([None])
    assert got == expected and [s[1][0][0] for s in got] == ["release", "withdraw"]


def plans_abandoned() -> Exception:
    return Abandoned()


@pytest.mark.parametrize("replies", [None, [NodeFailure("connection closed by the server")]])
def test_a_lane_round_whose_connection_broke_gives_its_grant_back(
    state: AliasState, replies: list[Any] | None
) -> None:
    """The lane's call went out, then its connection broke (the reply lost, or the caller
    interrupted): the node now reads disconnected (no run id), yet the resumed plan still
    releases there with the owner the lane sent, since the call may have granted. It used to
    build the round's calls from the node as it reads now, and skip it: the name stayed
    locked for the TTL, held by nobody."""
    sent_with = fake_nodes(1)
    call = next(plans.acquire_plan(state, sent_with, NAME, 5.0)).calls[0]
    assert call is not None
    owner, suffix = call.args[0], call.args[3]
    broken = fake_nodes(1, down=[0])  # the link failed: its run id reads None
    resumed = plans.acquire_plan(
        state, broken, NAME, 5.0, sent=Sent(owner, suffix, START, replies, ("r0",))
    )
    give_back = next(resumed)
    assert [c.script.name for c in give_back.calls if c] == ["release"]
    assert give_back.calls[0] is not None and give_back.calls[0].args[0] == owner
