"""The lane for a set of nodes (``engine/fan_lane.py``) agrees with the plans on the same
scripted replies.

For each set of replies three or five nodes may give a lock's first attempt, the plan is run
from scratch, and the lane's way is run beside it: its own record when it settles the replies
itself, else the plan resumed from the round the lane made (``Sent``). Both must send the
same calls (the lane's bytes are the plan's calls, node for node), ask the same follow-up
requests and end with the same outcome. Releases likewise. No Redis, no database.
"""

from __future__ import annotations

import itertools
import random
import sys
from typing import Any

import pytest

from django_redlock.engine import fan_lane, lane, plans
from django_redlock.engine.keyspace import TOKEN_LIMIT
from django_redlock.engine.plans.rounds import Sent
from django_redlock.engine.replies import NodeFailure, Slot
from django_redlock.engine.state import AliasState, LeaseRecord
from django_redlock.engine.transport.base import pack, script_calls
from tests.engine import test_plans
from tests.engine.test_lane_plans import (
    KIND_TABLE,
    KINDS,
    START,
    _finish,
    _outcome,
    _shape,
    lane_attempt,
    lease_of_kind,
    plan_maker,
    planned_from_scratch,
)
from tests.support.scripted import Clock, fake_nodes

# the plan tests' fixtures: no redis-server, the plans' fake clock, an alias state
_session_redlock, clock, state = test_plans._session_redlock, test_plans.clock, test_plans.state

#: what one node may answer a lock's first attempt
ANSWERS: dict[str, Any] = {
    "granted": [1, 7, 0],
    "granted behind": [1, 6, 0],
    "granted at the limit": [1, TOKEN_LIMIT, 0],
    "busy": [0, 6, 1200],
    "untrusted": [-1, 0, 0],
    "timed out": NodeFailure("timed out"),
    "not awaited": NodeFailure("not awaited (the attempt was decided without its reply)"),
    # decided without its reply, which may still come (and register a waiter there)
    "not answered yet": NodeFailure("not awaited", late=Slot(None)),
    "refused": NodeFailure("ResponseError: OOM command not allowed"),
    "never sent": NodeFailure("down: Connection refused", sent=False),
}


def _answers(kind: str) -> dict[str, Any]:
    """:data:`ANSWERS` for a lease of ``kind`` (a key of ``KINDS``): a permit's grants name
    its first slot, and some name the second."""
    if kind != "permit":
        return ANSWERS
    answers = {
        key: [*value[:2], 1] if key.startswith("granted") else value
        for key, value in ANSWERS.items()
    }
    return {**answers, "granted the second slot": [1, 7, 2]}


def _patterns(nodes: int, answers: dict[str, Any] = ANSWERS) -> list[tuple[str, ...]]:
    """Every combination on three nodes; on five, a fixed sample (every all-same one too)."""
    every = list(itertools.product(answers, repeat=nodes))
    if nodes == 3:
        return every
    sample = random.Random(41).sample(every, 400)
    return sample + [(key,) * nodes for key in answers]


@pytest.mark.parametrize("woken", [False, True], ids=["first", "woken"])
@pytest.mark.parametrize("late", [False, True], ids=["in time", "validity gone"])
@pytest.mark.parametrize("waiter", ["", "w1"], ids=["timeout=0", "waits"])
@pytest.mark.parametrize("count", [3, 5])
@pytest.mark.parametrize("kind", list(KINDS))
def test_the_lane_acquires_as_the_plan_does(
    state: AliasState,
    clock: Clock,
    kind: str,
    count: int,
    waiter: str,
    late: bool,
    woken: bool,
    monkeypatch: Any,
) -> None:
    """Same calls, same follow-ups, same outcome, for every kind of lease and set of
    replies; a first attempt, or one of the acquire loop's after a release woke the
    caller."""
    module = sys.modules[plans.attempt_round.__module__]
    mark_ms = 1000 if waiter else 0
    settled_by_lane = withdrawn_by_lane = 0
    answers = _answers(kind)
    for pattern in _patterns(count, answers):
        replies = [answers[key] for key in pattern]
        owners = iter(f"{i:032x}" for i in range(100))
        monkeypatch.setattr(module, "new_owner", lambda owners=owners: next(owners))
        nodes = fake_nodes(count)
        started = clock.now

        make = plan_maker(state, nodes, kind, waiter, mark_ms, woken)
        request, owner, suffix, expected, expected_shapes = planned_from_scratch(
            make,
            state,
            clock,
            late,
            lambda plan, request, replies=replies: _finish_all(plan, request, replies),
        )
        owners = iter(f"{i:032x}" for i in range(1, 100))  # the lane draws the same ones
        monkeypatch.setattr(module, "new_owner", lambda owners=owners: next(owners))

        # the lane: the same bytes on every node, then its own record or the plan resumed
        attempt = lane_attempt(state, kind, waiter, mark_ms, make, woken)
        tails = []
        for i, call in enumerate(request.calls):
            assert call is not None and call.script is attempt.script
            tails.append(lane.acquire_tail(attempt, owner, 5000, f"r{i}", suffix))
            assert pack(tails[-1]) == pack((len(call.keys), *call.keys, *call.args)), pattern
        sha = attempt.script.sha
        assert script_calls(sha, tails) == [pack(("EVALSHA", sha, *t)) for t in tails]
        record = fan_lane.quorum_record(state, attempt, owner, started, replies)
        if record is not None:
            got, shapes = record, [_shape(request)]
            withdraw = fan_lane.withdrawal(attempt, nodes, replies)
            if withdraw is not None:  # a waiter's registrations, where it may have made some
                shapes.append(_shape(withdraw))
                withdrawn_by_lane += 1
            settled_by_lane += 1
        else:
            run_ids = tuple(f"r{i}" for i in range(count))
            got, shapes = _finish_all(make(Sent(owner, suffix, started, replies, run_ids)))
            shapes = [_shape(request), *shapes]
        assert _outcome(got) == _outcome(expected), pattern
        assert shapes == expected_shapes, pattern
        clock.now = started
    # the test would prove nothing if the lane never settled (or always did), or never
    # withdrew a waiter's registrations (every combination of three nodes has such a win)
    assert (settled_by_lane > 0) == (not late)
    if count == 3:
        assert (withdrawn_by_lane > 0) == (not late and bool(waiter))


def _finish_all(plan: Any, request: Any = None, first: list[Any] | None = None) -> Any:
    """:func:`test_lane_plans._finish` with a whole first round of replies."""
    if first is None:
        return _finish(plan, request)
    shapes = [_shape(request)]
    try:
        request = plan.send(first)
    except StopIteration as done:
        return done.value, shapes
    value, rest = _finish(plan, request)
    return value, shapes + rest


RELEASE_ANSWERS: dict[str, Any] = {
    "released": 1,
    "handed off": 2,
    "not held": 0,
    "timed out": NodeFailure("timed out"),
    "not awaited": NodeFailure("not awaited (the attempt was decided without its reply)"),
    # decided without its reply, which may still come (and register a waiter there)
    "not answered yet": NodeFailure("not awaited", late=Slot(None)),
}


@pytest.mark.parametrize("valid", [4.0, -1.0], ids=["valid", "expired"])
@pytest.mark.parametrize("lost", [False, True], ids=["held", "found lost"])
@pytest.mark.parametrize("count", [3, 5])
@pytest.mark.parametrize("kind", list(KINDS))
def test_the_lane_releases_as_the_plan_does(
    state: AliasState, kind: str, count: int, valid: float, lost: bool
) -> None:
    """Same calls to the same nodes, same outcome, hand-off flag and nodes left to send it
    to again, for every kind of lease, set of answers and of nodes the lease may hold (and,
    of those, the ones whose grant is unknown: a permit's release there names every slot)."""
    rng = random.Random(count)
    cases = list(itertools.product(RELEASE_ANSWERS, repeat=count))
    if count == 5:
        cases = rng.sample(cases, 400)
    for pattern in cases:
        reached = tuple(rng.random() > 0.2 for _ in range(count))
        voters = tuple(i for i, r in enumerate(reached) if r and rng.random() > 0.2)

        def lease(reached: tuple[bool, ...] = reached, voters: Any = voters) -> LeaseRecord:
            record = lease_of_kind(state, kind, START + valid, reached)
            record.voters, record.lost = voters, lost
            return record

        answers = [RELEASE_ANSWERS[key] for key in pattern]
        planned = lease()
        plan = plans.release_plan(state, fake_nodes(count), planned)
        request = next(plan)
        try:
            calls = request.calls
            plan.send([a if c is not None else None for a, c in zip(answers, calls, strict=True)])
        except StopIteration as done:
            expected = done.value
        laned = lease()
        asked, tails = fan_lane.release_calls(state, laned, count)
        assert asked == [i for i, c in enumerate(request.calls) if c is not None]
        for i, tail in zip(asked, tails, strict=True):
            call = request.calls[i]
            assert call is not None and call.script is KIND_TABLE[laned.kind].release
            assert pack(tail) == pack((len(call.keys), *call.keys, *call.args)), (pattern, i)
        sha = KIND_TABLE[laned.kind].release.sha  # packed once per run of one tail object
        assert script_calls(sha, tails) == [pack(("EVALSHA", sha, *t)) for t in tails]
        was_valid = laned.validity() > 0
        got = [answers[i] for i in asked]
        held, _ = fan_lane.released(laned, count, asked, got, was_valid)
        assert held == expected, (pattern, reached)
        assert (laned.handed_off, laned.unsure, laned.confirmed, laned.settled) == (
            planned.handed_off,
            planned.unsure,
            planned.confirmed,
            planned.settled,
        ), (pattern, reached)
