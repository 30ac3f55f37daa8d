"""The piped wait's lane (``engine/piped_lane.py``) agrees with the plan on the same scripted
replies, and real waiters woken by a release take it.

For each reply a node may give a woken attempt carried behind a waiter's registration and
``BLPOP``, the plan is run from scratch (its first call carrying those commands between two
clock readings, the node holding it back 0.2 s), and the lane's way beside it: the lane's own
record when it settles the reply itself (its validity counted from the second clock reading),
else the plan resumed from the round the lane made. Both must write the same bytes, ask the
same follow-up requests and end with the same outcome.
"""

from __future__ import annotations

import asyncio
import sys
import threading
from typing import Any

import hiredis
import pytest

from django_redlock.engine import lane, piped_lane, plans
from django_redlock.engine.plans.rounds import Sent, bracketed, held_back
from django_redlock.engine.state import AliasState
from django_redlock.engine.transport.base import pack
from django_redlock.engine.transport.blpop import blpop_command
from django_redlock.exceptions import LockNotAcquired
from django_redlock.locking.manager import LockManager
from tests.engine import test_lane_plans as laned
from tests.engine import test_plans
from tests.support.scripted import Clock, fake_nodes
from tests.support.waiting import until_blocked

NAME = laned.NAME
START = test_plans.START
_session_redlock, clock, state = test_plans._session_redlock, test_plans.clock, test_plans.state

#: how long the node held the woken attempt back behind its BLPOP, seconds on its clock
HELD = 0.2
#: what the node answers to the commands carried ahead: its clock, the wake-up, its clock
AHEAD = [[b"1700000000", b"100000"], [b"wake", b"1"], [b"1700000000", b"300000"]]


def _before(state: AliasState, register: bool) -> tuple[tuple[str | int, ...], ...]:
    blpop = blpop_command(state.keys.wake(NAME), 0.5)
    return (state.mark_command(NAME, "w1", 1000), blpop) if register else (blpop,)


@pytest.mark.parametrize("register", [False, True], ids=["registered", "registers with it"])
@pytest.mark.parametrize("late", [False, True], ids=["in time", "validity gone"])
@pytest.mark.parametrize("key", [*laned.REPLIES, *laned.PERMIT_REPLIES])
@pytest.mark.parametrize("kind", list(laned.KINDS))
def test_the_piped_lane_acquires_as_the_plan_does(
    state: AliasState,
    clock: Clock,
    kind: str,
    key: str,
    late: bool,
    register: bool,
    monkeypatch: Any,
) -> None:
    """Same bytes, same follow-ups, same outcome, for every kind of lease and reply."""
    if key in laned.PERMIT_REPLIES and kind != "permit":
        pytest.skip("only a permit's grant names a slot")
    owners = iter(f"{i:032x}" for i in range(100))
    monkeypatch.setattr(
        sys.modules[plans.attempt_round.__module__], "new_owner", lambda: next(owners)
    )
    nodes = fake_nodes(1)
    reply = laned._reply(key, laned.KINDS[kind][0])
    before = _before(state, register)
    kind_args = laned.attempt_args(kind)

    def make(sent: Sent | None = None) -> Any:
        return plans.acquire_plan(
            state, nodes, NAME, 5.0, waiter="w1", mark_ms=1000, woken=True,
            before=before, wait=0.75, sent=sent, **kind_args,
        )  # fmt: skip

    def finish(plan: Any, request: Any) -> Any:
        clock.advance(HELD + 0.05)  # the wait, then the replies
        request.ahead = {0: AHEAD}  # as the transport hands them over
        return laned._finish(plan, request, reply)

    request, owner, suffix, expected, expected_shapes = laned.planned_from_scratch(
        make, state, clock, late, finish
    )
    call = request.calls[0]
    assert call is not None and call.before == bracketed(before)
    owners = iter(f"{i:032x}" for i in range(1, 100))  # the lane's run draws the same ones

    attempt = laned.lane_attempt(state, kind, "w1", 1000, lambda s: None)
    attempt.woken = True
    tail = lane.acquire_tail(attempt, owner, 5000, "r0", suffix)
    written = b"".join(
        [
            *map(pack, bracketed(before)),
            hiredis.pack_command(("EVALSHA", attempt.script.sha, *tail)),
        ]
    )
    assert written == b"".join([*map(pack, call.before), pack(call.packed_args(by_sha=True))])
    started = START + held_back(AHEAD, clock.monotonic() - START)
    assert started == pytest.approx(START + HELD)
    record = lane.granted_record(attempt, owner, started, reply)
    if record is not None:
        got, shapes = record, [laned._shape(request)]
        assert key in ("granted", "granted another slot") and not late
    else:
        got, shapes = laned._finish(make(Sent(owner, suffix, started, [reply])))
        shapes = [laned._shape(request), *shapes]
    assert laned._outcome(got) == laned._outcome(expected)
    assert shapes == expected_shapes


# -- real nodes -------------------------------------------------------------------------

#: a kind of lease, the lease that holds the name first, and the kind that waits for it
WAITS = {
    "lock": ({}, {}),
    "permit": ({"permits": 1}, {"permits": 1}),
    "write behind a read": ({"rw": "read"}, {"rw": "write"}),
    "read behind a write": ({"rw": "write"}, {"rw": "read"}),
}


@pytest.mark.parametrize("api", ["blocking", "asyncio"])
@pytest.mark.parametrize("case", list(WAITS))
def test_a_woken_waiter_takes_the_piped_lane(
    case: str,
    api: str,
    one_node: tuple[Any, LockManager],
    plan_calls: dict[str, int],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A waiter's first attempt finds the name held (the plan decides that reply); the release
    wakes it, and its woken attempt, carried behind its ``BLPOP``, is granted by the lane: no
    plan runs for it. Blocking and on an event loop."""
    _, manager = one_node
    holding, waiting = WAITS[case]
    piped: list[str] = []
    real = piped_lane.granted_record

    def granted(*args: Any) -> Any:
        record = real(*args)
        piped.append("lane" if record is not None else "plan")
        return record

    monkeypatch.setattr(piped_lane, "granted_record", granted)
    manager.acquire("warm", timeout=0).release()  # the plan's rejoin
    holder = manager.acquire("name", timeout=0, **holding)
    plan_calls.update(acquire=0, release=0)
    got: list[Any] = []

    def wait() -> None:
        if api == "asyncio":
            got.append(asyncio.run(manager.aacquire("name", timeout=10, **waiting)))
        else:
            got.append(manager.acquire("name", timeout=10, **waiting))

    waiter = threading.Thread(target=wait)
    waiter.start()
    until_blocked(manager, "name")  # registered and in its BLPOP
    assert holder.release() is True
    waiter.join(10)
    assert got and got[0].token > holder.token
    assert piped and piped[-1] == "lane"
    assert plan_calls["acquire"] == 1  # the first attempt's busy reply only
    assert got[0].release() is True
    with pytest.raises(LockNotAcquired):
        # the kinds' rules hold after a lane's grant: a lock held again excludes
        held = manager.acquire("name", timeout=0, **holding)
        try:
            manager.acquire("name", timeout=0, **waiting)
        finally:
            held.release()
