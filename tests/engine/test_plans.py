"""The Redlock plans driven with scripted replies: no Redis, no database, milliseconds.

Each test runs a plan generator through ``tests/support/scripted.py``: every request the plan
yields is checked (which script each node's call uses, and which nodes get one) and answered
with scripted per-node replies; the plans' clock is a fake that moves only when told to.
"""

from __future__ import annotations

import sys
from typing import Any

import pytest

from django_redlock.engine import plans, scripts
from django_redlock.engine.keyspace import TOKEN_LIMIT, wake_node
from django_redlock.engine.kinds import HANDOFF_MS, PERMIT_HANDOFF_MS
from django_redlock.engine.kinds import PERMIT as PERMIT_KIND
from django_redlock.engine.plans import tokens
from django_redlock.engine.plans.trust import rejoin_plan
from django_redlock.engine.replies import NOT_AWAITED, NodeFailure
from django_redlock.engine.scripts import primitives as primitive_scripts
from django_redlock.engine.state import (
    HEDGE_MIN,
    LOST,
    RENEWED,
    UNCONFIRMED,
    WAIT_MARK_MS,
    WAKE_TTL_MS,
    Abandoned,
    AcquireFailure,
    AliasState,
    LeaseRecord,
)
from tests.support.scripted import (
    NOT_CONNECTED,
    PENDING,
    Clock,
    Run,
    Step,
    answer,
    drive,
    fake_nodes,
    fire,
    give_backs_unsent,
    slots,
)

ACQUIRE, RELEASE, EXTEND, RAISE = scripts.ACQUIRE, scripts.RELEASE, scripts.EXTEND, scripts.RAISE
PROBE, REJOIN, FORCE_RELEASE = scripts.PROBE, scripts.REJOIN, scripts.FORCE_RELEASE
# the rejoin constants live next to rejoin_plan (plans.py re-exports the plan itself)
_trust = sys.modules[rejoin_plan.__module__]
CLOCK_FLOOR, REJOIN_INTERVAL = _trust.CLOCK_FLOOR, _trust.REJOIN_INTERVAL

START = 1000.0  # the fake monotonic clock at the start of every test
WALL = 1_700_000_000.0  # the fake wall clock (time.time) at the start of every test
FLOOR = int(WALL * 1000) * CLOCK_FLOOR  # the clock floor rejoin computes at WALL
NAME = "job"
TIMED_OUT = NodeFailure("timed out")  # sent, no answer: it may have run on the node
REFUSED = NodeFailure("down: Connection refused", sent=False)  # never left this process
UNTRUSTED = [-1, 0, 0]


def granted(token: int) -> list[int]:
    return [1, token, 0]


def busy(counter: int, pttl: int) -> list[int]:
    return [0, counter, pttl]


def clock_reading(seconds: float) -> list[bytes]:
    """A ``TIME`` reply (the node's wall clock: seconds, microseconds)."""
    micros = round(seconds * 1_000_000)
    return [str(micros // 1_000_000).encode(), str(micros % 1_000_000).encode()]


def probe(
    run_id: str, counter: int, max_ttl: int = 5000, exists: int = 1, joined: int = -1
) -> list[Any]:
    return [run_id, counter, max_ttl, exists, joined]


@pytest.fixture(scope="session")
def _session_redlock() -> None:
    """Replaces the suite's autouse fixture that starts redis-server: nothing here needs it."""


@pytest.fixture(autouse=True)
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    clock = Clock(START, WALL)
    for module in clock.modules():
        monkeypatch.setattr(module, "time", clock)
    return clock


@pytest.fixture
def state() -> AliasState:
    return AliasState(prefix="t:", node_timeout=0.05, drift_factor=0.01, ttl=5.0, host="h", pid=7)


def lease_for(
    reached: tuple[bool, ...] = (True, True, True), valid: float = 4.0, ttl: float = 5.0
) -> LeaseRecord:
    """A lease on NAME valid for ``valid`` more seconds of the fake clock."""
    return LeaseRecord(
        NAME, "t:job", "a" * 32, token=12, ttl=ttl, deadline=START + valid, reached=reached
    )


def release_args(call: Any) -> tuple[Any, ...]:
    """(owner, wakes, mark_ms) of a RELEASE call; a release that registers no waiter
    (mark_ms 0) names none."""
    owner, wake_ttl, handoff_ms, wakes, mark_ms, waiter, permit = call.args
    assert (wake_ttl, handoff_ms, permit) == (WAKE_TTL_MS, HANDOFF_MS, "0")
    assert call.keys == ("t:job", "t:__waiters__:job", "t:__wake__:job", "t:__handoff__:job")
    assert (waiter != "") == (mark_ms > 0)
    return owner, wakes, mark_ms


# -- acquire_plan ------------------------------------------------------------------------


def test_acquire_quorum_of_grants_returns_lease(state: AliasState) -> None:
    """A quorum of grants gives a lease (token, reached, start+ttl-drift) from well-formed calls."""
    run = drive(
        plans.acquire_plan(state, fake_nodes(3), NAME, 5.0),
        [answer(ACQUIRE, granted(12), granted(12), busy(11, 700))],
    )
    lease = run.result
    assert isinstance(lease, LeaseRecord)
    assert (lease.name, lease.key, lease.token, lease.ttl) == (NAME, "t:job", 12, 5.0)
    assert lease.reached == (True, True, False)
    assert lease.deadline == pytest.approx(START + 5.0 - (5.0 * 0.01 + 0.002))
    assert 0 < lease.validity() <= 5.0 - state.drift(5.0)
    assert run.requests[0].timeout == state.node_timeout
    for i, call in enumerate(run.calls(0)):
        assert call is not None
        assert call.keys == ("t:job", "t:__fence__", "t:__waiters__:job", "t:__handoff__:job")
        owner, ttl_ms, run_id, suffix, mark_ms, woken, waiter = call.args
        assert owner == lease.owner and len(owner) == 32
        assert (ttl_ms, run_id, mark_ms, woken, waiter) == (5000, f"r{i}", 0, "0", "")
        assert suffix == f"|{int(WALL * 1000)}|h|7"


def test_acquire_deadline_counts_time_from_before_the_request(
    state: AliasState, clock: Clock
) -> None:
    """The lease deadline is start + ttl - drift even when the replies took 0.3 s."""
    run = drive(
        plans.acquire_plan(state, fake_nodes(3), NAME, 5.0),
        [answer(ACQUIRE, granted(12), granted(12), granted(12), elapsed=0.3)],
        clock,
    )
    assert run.result.deadline == pytest.approx(START + 5.0 - state.drift(5.0))
    assert run.result.validity() == pytest.approx(5.0 - state.drift(5.0) - 0.3)


def test_acquire_single_node(state: AliasState) -> None:
    """With one node, its grant alone is the quorum."""
    run = drive(plans.acquire_plan(state, fake_nodes(1), NAME, 2.0), [answer(ACQUIRE, granted(5))])
    assert run.result.token == 5
    assert run.result.reached == (True,)
    assert state.longest_ttl_ms == 5000  # the alias TTL stays the longest seen


def test_acquire_busy_reports_retry_after(state: AliasState) -> None:
    """All nodes busy: "busy" with retry_after = longest PTTL, and no release sent."""
    run = drive(
        plans.acquire_plan(state, fake_nodes(3), NAME, 5.0),
        [answer(ACQUIRE, busy(12, 1500), busy(12, 800), busy(12, 1200))],
    )
    assert run.result == AcquireFailure("busy", 0, 3, {}, 1.5)


def test_acquire_busy_without_pttl_has_no_retry_after(state: AliasState) -> None:
    """Busy replies with PTTL -1 (a key without expiry) give retry_after None, not a negative."""
    run = drive(
        plans.acquire_plan(state, fake_nodes(3), NAME, 5.0),
        [answer(ACQUIRE, busy(12, -1), busy(12, -1), TIMED_OUT), fire(RELEASE, to=[2])],
    )
    assert run.result.reason == "busy"
    assert run.result.retry_after is None


def test_acquire_without_quorum_is_unavailable(state: AliasState) -> None:
    """One grant and two failures: "unavailable", errors per node, and the grant released."""
    run = drive(
        plans.acquire_plan(state, fake_nodes(3), NAME, 5.0),
        [answer(ACQUIRE, granted(12), REFUSED, TIMED_OUT), fire(RELEASE, to=[0, 2])],
    )
    assert run.result == AcquireFailure(
        "unavailable", 1, 1, {"n1": "down: Connection refused", "n2": "timed out"}, None
    )


def test_acquire_release_goes_to_granted_and_silent_nodes_only(state: AliasState) -> None:
    """A failed attempt releases where granted or sent unanswered, not where refused/unsent."""
    nodes = fake_nodes(5, down=[4])
    run = drive(
        plans.acquire_plan(state, nodes, NAME, 5.0),
        [
            answer(ACQUIRE, granted(12), busy(12, 300), REFUSED, TIMED_OUT, None),
            fire(RELEASE, to=[0, 3]),
        ],
    )
    # busy: only the refused and the disconnected node count as failing (a silent one may be
    # slow), so 3 of 5 could still answer
    assert (run.result.reason, run.result.retry_after) == ("busy", 0.3)
    assert run.result.errors == {
        "n2": "down: Connection refused",
        "n3": "timed out",
        "n4": NOT_CONNECTED.reason,
    }
    owner = run.calls(0)[0].args[0]
    waking = wake_node(NAME, 5)
    for i in (0, 3):
        assert release_args(run.calls(1)[i]) == (owner, "1" if i == waking else "0", 0)
    assert run.requests[1].wait is False


def test_acquire_busy_when_a_quorum_answers(state: AliasState) -> None:
    """Grant + busy + node down: "busy" (2 of 3 could answer) and the lone grant released."""
    run = drive(
        plans.acquire_plan(state, fake_nodes(3, down=[2]), NAME, 5.0),
        [answer(ACQUIRE, granted(12), busy(12, 300), None), fire(RELEASE, to=[0])],
    )
    assert run.result == AcquireFailure("busy", 1, 2, {"n2": NOT_CONNECTED.reason}, 0.3)


def test_acquire_token_is_max_of_winners_and_laggard_is_raised(state: AliasState) -> None:
    """A lagging winner is RAISEd to the max token; its "still held" (1) completes the quorum."""
    run = drive(
        plans.acquire_plan(state, fake_nodes(3), NAME, 5.0),
        [
            answer(ACQUIRE, granted(10), granted(12), busy(12, 400)),
            answer(RAISE, 1, None, None),
        ],
    )
    lease = run.result
    assert isinstance(lease, LeaseRecord)
    assert lease.token == 12
    raise_call = run.calls(1)[0]
    assert raise_call.keys == ("t:__fence__", "t:job")
    assert raise_call.args == (12, 12, "r0", lease.owner, 0)  # first, last, the key's offset
    assert run.requests[1].timeout == state.node_timeout


def test_acquire_token_is_the_highest_a_quorum_gave(state: AliasState) -> None:
    """Grants interleaved with another caller's: the highest token a quorum of winners gave
    (11 on nodes 2-4) is the caller's own, with nothing to write back. The higher one of
    nodes 0 and 1 came after another caller's grant there, which may hold it."""
    run = drive(
        plans.acquire_plan(state, fake_nodes(5), NAME, 5.0),
        [answer(ACQUIRE, granted(12), granted(12), granted(11), granted(11), granted(11))],
    )
    assert run.result.token == 11
    assert run.result.voters == (0, 1, 2, 3, 4)  # every winner holds the key: released there


def test_acquire_raise_not_needed_for_quorum_is_still_sent(state: AliasState) -> None:
    """A laggard is RAISEd even with the quorum complete; that request settles at once."""
    run = drive(
        plans.acquire_plan(state, fake_nodes(3), NAME, 5.0),
        [
            answer(ACQUIRE, granted(10), granted(12), granted(12)),
            answer(RAISE, 1, None, None),
        ],
    )
    assert run.result.token == 12
    assert run.requests[1].settled(slots(PENDING, NOT_CONNECTED, NOT_CONNECTED))


@pytest.mark.parametrize("raise_reply", [0, -1, TIMED_OUT], ids=["not-held", "untrusted", "silent"])
def test_acquire_failed_write_back_does_not_count(state: AliasState, raise_reply: Any) -> None:
    """A RAISE answered 0 (force-released meanwhile), -1 or not at all fails the attempt."""
    run = drive(
        plans.acquire_plan(state, fake_nodes(3), NAME, 5.0),
        [
            answer(ACQUIRE, granted(10), granted(12), busy(12, 400)),
            answer(RAISE, raise_reply, None, None),
            fire(RELEASE, to=[0, 1]),
        ],
    )
    assert isinstance(run.result, AcquireFailure)
    assert (run.result.reason, run.result.votes) == ("busy", 2)
    owner = run.calls(0)[0].args[0]
    assert {release_args(c)[0] for c in run.calls(2) if c} == {owner}


def test_acquire_raise_settles_on_needed_confirmations(state: AliasState) -> None:
    """The RAISE request settles once enough laggards confirmed to complete the quorum."""
    plan = plans.acquire_plan(state, fake_nodes(5), NAME, 5.0)
    next(plan)
    raise_request = plan.send([granted(9), granted(10), granted(12), busy(12, 1), busy(12, 1)])
    assert raise_request.calls[0] is not None and raise_request.calls[1] is not None
    settled = raise_request.settled
    assert not settled(slots(1, PENDING, None, None, None))  # needs 2 more for quorum 3
    assert not settled(slots(1, 0, None, None, None))
    assert settled(slots(1, 1, None, None, None))
    plan.close()


@pytest.mark.parametrize(("elapsed", "won"), [(0.0965, True), (0.0975, False)])
def test_acquire_validity_must_outlast_the_round_trip(
    state: AliasState, clock: Clock, elapsed: float, won: bool
) -> None:
    """Grants that took longer than ttl - drift are no lease: they are released ("busy")."""
    steps = [answer(ACQUIRE, granted(5), granted(5), granted(5), elapsed=elapsed)]
    if not won:
        steps.append(fire(RELEASE, to=[0, 1, 2]))
    run = drive(plans.acquire_plan(state, fake_nodes(3), NAME, 0.1), steps, clock)
    if won:
        assert run.result.token == 5
    else:
        assert run.result == AcquireFailure("busy", 3, 3, {})


def test_acquire_validity_counts_the_write_back(state: AliasState, clock: Clock) -> None:
    """Time spent in the RAISE write-back counts against validity too."""
    run = drive(
        plans.acquire_plan(state, fake_nodes(3), NAME, 1.0),
        [
            answer(ACQUIRE, granted(10), granted(12), busy(12, 400), elapsed=0.5),
            answer(RAISE, 1, None, None, elapsed=0.5),
            fire(RELEASE, to=[0, 1]),
        ],
        clock,
    )
    assert isinstance(run.result, AcquireFailure)


@pytest.mark.parametrize(("token", "won"), [(TOKEN_LIMIT - 1, True), (TOKEN_LIMIT, False)])
def test_acquire_refuses_token_at_limit(state: AliasState, token: int, won: bool) -> None:
    """A token of 2**53 or more is never handed out: the grants are released."""
    steps = [answer(ACQUIRE, granted(token), granted(token), granted(token))]
    if not won:
        steps.append(fire(RELEASE, to=[0, 1, 2]))
    run = drive(plans.acquire_plan(state, fake_nodes(3), NAME, 5.0), steps)
    assert isinstance(run.result, LeaseRecord) is won
    if won:
        assert run.result.token == token


def test_acquire_does_not_write_back_a_token_over_limit(state: AliasState) -> None:
    """A laggard is not raised to a token at the limit (no RAISE request at all)."""
    limit = TOKEN_LIMIT
    run = drive(
        plans.acquire_plan(state, fake_nodes(3), NAME, 5.0),
        [answer(ACQUIRE, granted(10), granted(limit), granted(limit)), fire(RELEASE, to=[0, 1, 2])],
    )
    assert run.result.reason == "busy"


def test_acquire_of_a_waiter_registers_it_on_failure(state: AliasState) -> None:
    """A caller that will wait: every ACQUIRE and the release of the failed attempt (where a
    node granted it) carry its waiter id and how long it stays registered."""
    run = drive(
        plans.acquire_plan(state, fake_nodes(3), NAME, 5.0, waiter="w1", mark_ms=700),
        [answer(ACQUIRE, granted(12), busy(12, 900), busy(12, 900)), fire(RELEASE, to=[0])],
    )
    assert run.result.retry_after == 0.9
    assert {(c.args[4], c.args[6]) for c in run.calls(0) if c} == {(700, "w1")}
    release = run.calls(1)[0]
    assert release_args(release)[2] == 700 and release.args[5] == "w1"


def test_acquire_registers_for_wait_mark_ms_by_default(state: AliasState) -> None:
    """Without mark_ms a waiter is registered for WAIT_MARK_MS (1 s: a dead waiter stops
    counting within 1 s), longer than any single wait."""
    from django_redlock.engine import policy

    assert WAIT_MARK_MS <= 1000
    assert policy.MAX_BACKOFF * 1000 < WAIT_MARK_MS
    run = drive(
        plans.acquire_plan(state, fake_nodes(1), NAME, 5.0, waiter="w1"),
        [answer(ACQUIRE, busy(12, 900))],
    )
    assert run.calls(0)[0].args[4] == WAIT_MARK_MS


@pytest.mark.parametrize("woken", [False, True])
def test_a_woken_caller_some_node_granted_leaves_itself_no_wake_up(
    state: AliasState, woken: bool
) -> None:
    """The node waiters block on (node 0) granted the attempt, the others still said busy (the
    holder's release has not reached them): its give-back registers the caller there. A caller
    no release woke blocks next, so there the give-back may leave it a wake-up of its own
    (wakes "1"); a woken one retries quickly without blocking, so it leaves none: a wake-up it
    never pops would wake the next waiter for nothing, or stay behind (seen in the five-node
    contended runs: one more attempt on every node per such hand-off)."""
    assert wake_node(NAME, 3) == 0
    run = drive(
        plans.acquire_plan(state, fake_nodes(3), NAME, 5.0, waiter="w1", mark_ms=700, woken=woken),
        [answer(ACQUIRE, granted(12), busy(12, 900), busy(12, 900)), fire(RELEASE, to=[0])],
    )
    assert isinstance(run.result, AcquireFailure) and run.result.votes == 1
    assert release_args(run.calls(1)[0])[1:] == ("0" if woken else "1", 700)


@pytest.mark.parametrize(("waiter", "mark_ms"), [("", 1000), ("w1", 0), ("w1", -5)])
def test_acquire_that_will_not_wait_registers_nothing(
    state: AliasState, waiter: str, mark_ms: int
) -> None:
    """No waiter id (timeout=0), or no time left before the caller's deadline: mark_ms 0, so
    the nodes register nothing and the failed attempt's release neither."""
    run = drive(
        plans.acquire_plan(state, fake_nodes(3), NAME, 5.0, waiter=waiter, mark_ms=mark_ms),
        [answer(ACQUIRE, granted(12), busy(12, 900), busy(12, 900)), fire(RELEASE, to=[0])],
    )
    assert {c.args[4] for c in run.calls(0) if c} == {0}
    assert release_args(run.calls(1)[0])[2] == 0


def test_acquire_won_by_a_waiter_withdraws_it_where_busy(state: AliasState) -> None:
    """A waiter that wins on a quorum stops counting everywhere: the granting nodes removed it
    in ACQUIRE, the node that said busy (and registered it again) gets a WITHDRAW."""
    run = drive(
        plans.acquire_plan(state, fake_nodes(3), NAME, 5.0, waiter="w1"),
        [answer(ACQUIRE, granted(12), busy(12, 900), granted(12)), fire(scripts.WITHDRAW, to=[1])],
    )
    assert isinstance(run.result, LeaseRecord)
    withdraw = run.calls(1)[1]
    assert (withdraw.keys, withdraw.args) == (("t:__waiters__:job", "t:__handoff__:job"), ("w1",))


def test_acquire_won_everywhere_sends_no_withdraw(state: AliasState) -> None:
    """Every node granted: nothing more is sent (the hot path stays one round trip)."""
    run = drive(
        plans.acquire_plan(state, fake_nodes(3), NAME, 5.0, waiter="w1"),
        [answer(ACQUIRE, granted(12), granted(12), granted(12))],
    )
    assert isinstance(run.result, LeaseRecord) and len(run.requests) == 1


def _withdraws(request: Any, keys: tuple[str, ...], waiter: str) -> list[int]:
    """The nodes a fire-and-forget WITHDRAW of ``waiter`` from ``keys`` (per name, its waiter
    set and its hand-off reservation) goes to."""
    assert not request.wait
    sent = [(i, c) for i, c in enumerate(request.calls) if c is not None]
    assert all(c.script is scripts.WITHDRAW for _, c in sent)
    assert all((c.keys, c.args) == (keys, (waiter,)) for _, c in sent)
    return [i for i, _ in sent]


@pytest.mark.parametrize("waiter", ["w1", ""])
def test_acquire_given_up_mid_attempt_withdraws_a_waiter_everywhere(
    state: AliasState, waiter: str
) -> None:
    """Cancelled (or interrupted) with its attempt in flight, a caller that would have
    waited gives back what any node may have granted, then stops counting as a waiter on
    every node (behind the attempt, on its connection); one that never waits sends none."""
    plan = plans.acquire_plan(state, fake_nodes(3), NAME, 5.0, waiter=waiter)
    next(plan)
    give_back = plan.throw(Abandoned())
    assert not give_back.wait and all(c.script is RELEASE for c in give_back.calls if c)
    if waiter:
        withdraw = plan.send([None] * 3)
        assert _withdraws(withdraw, ("t:__waiters__:job", "t:__handoff__:job"), "w1") == [0, 1, 2]
    with pytest.raises(Abandoned):
        plan.send([None] * 3)


class _Interrupting:
    """A reply field whose reading raises ``KeyboardInterrupt``: a signal handler that raised
    while the plan's own code ran on the replies (not at one of its yields)."""

    def __int__(self) -> int:
        raise KeyboardInterrupt


@pytest.mark.parametrize("waiter", ["w1", ""])
def test_acquire_interrupted_in_its_own_code_gives_back_the_grants(
    state: AliasState, waiter: str
) -> None:
    """An interrupt raised inside the plan as it reads the grants (the driver is not at a
    yield, so no ``Abandoned`` is thrown in): the plan still yields the give-back of every
    call, then the waiter's withdrawal, and only then lets the interrupt go on."""
    plan = plans.acquire_plan(state, fake_nodes(3), NAME, 5.0, waiter=waiter)
    next(plan)
    give_back = plan.send([[scripts.GRANTED, _Interrupting()], granted(10), granted(10)])
    assert not give_back.wait and [c.script for c in give_back.calls if c] == [RELEASE] * 3
    if waiter:
        withdraw = plan.send([None] * 3)
        assert _withdraws(withdraw, ("t:__waiters__:job", "t:__handoff__:job"), "w1") == [0, 1, 2]
    with pytest.raises(KeyboardInterrupt):
        plan.send([None] * 3)


def test_acquire_given_up_during_its_write_back_withdraws_the_waiter(
    state: AliasState,
) -> None:
    """Given up after the attempt (a lagging winner's counter being raised): its grants go
    back and the waiter is withdrawn on every node."""
    plan = plans.acquire_plan(state, fake_nodes(3), NAME, 5.0, waiter="w1")
    next(plan)
    raising = plan.send([granted(12), granted(10), busy(12, 900)])
    assert [c.script for c in raising.calls if c] == [RAISE]
    give_back = plan.throw(Abandoned())
    assert not give_back.wait and all(c.script is RELEASE for c in give_back.calls if c)
    assert _withdraws(plan.send([None] * 3), ("t:__waiters__:job", "t:__handoff__:job"), "w1") == [
        0,
        1,
        2,
    ]
    with pytest.raises(Abandoned):
        plan.send([None] * 3)


def test_acquire_finding_another_kind_leaves_no_waiter_registered(
    state: AliasState,
) -> None:
    """A node says the name is another kind's: the caller will not wait (no wait ends that),
    so the grant it gives back registers nobody and the "busy" node that registered it gets
    a WITHDRAW."""
    run = drive(
        plans.acquire_plan(state, fake_nodes(3), NAME, 5.0, waiter="w1", mark_ms=700),
        [
            answer(ACQUIRE, [-2, 5, 0], busy(5, 100), granted(6)),
            fire(RELEASE, to=[2]),
            fire(scripts.WITHDRAW, to=[1]),
        ],
    )
    assert run.result.reason == "other_kind" and run.result.final
    assert release_args(run.calls(1)[2])[2] == 0
    assert _withdraws(run.requests[2], ("t:__waiters__:job", "t:__handoff__:job"), "w1") == [1]


def test_acquire_woken_flag_is_passed(state: AliasState) -> None:
    """woken=True tells every node this caller may take a name reserved for a hand-off."""
    run = drive(
        plans.acquire_plan(state, fake_nodes(3), NAME, 5.0, woken=True),
        [answer(ACQUIRE, granted(3), granted(3), granted(3))],
    )
    assert [c.args[5] for c in run.calls(0) if c] == ["1", "1", "1"]
    assert run.result.token == 3


def test_acquire_not_connected_node_gets_no_call(state: AliasState) -> None:
    """A node without a connection gets no ACQUIRE, and its reached flag is False."""
    run = drive(
        plans.acquire_plan(state, fake_nodes(3, down=[1]), NAME, 5.0),
        [answer(ACQUIRE, granted(4), None, granted(4))],
    )
    assert run.result.reached == (True, False, True)


def test_acquire_early_settle_leaves_silent_node_reached(state: AliasState) -> None:
    """Settled on two grants, the still-silent third node counts as reached (may hold the key)."""
    run = drive(
        plans.acquire_plan(state, fake_nodes(3), NAME, 5.0),
        [answer(ACQUIRE, granted(4), granted(4), granted(4), order=[0, 1, 2])],
    )
    assert run.settled_after == [2]
    assert run.replies[0][2] == NodeFailure(NOT_AWAITED)
    assert run.result.reached == (True, True, True)


def test_acquire_decided_early_does_not_blame_the_node_not_awaited(
    state: AliasState,
) -> None:
    """Two busy answers settle a 3-node attempt; the healthy third node was only not waited
    for: it is neither reported as timed out nor counted as failing."""
    run = drive(
        plans.acquire_plan(state, fake_nodes(3), NAME, 5.0),
        [
            answer(ACQUIRE, busy(4, 700), busy(4, 700), busy(4, 700), order=[0, 1, 2]),
            fire(RELEASE, to=[2]),  # it may yet grant: released in case
        ],
    )
    assert run.settled_after == [2, None]
    assert run.replies[0][2] == NodeFailure(NOT_AWAITED)
    assert run.result == AcquireFailure("busy", 0, 2, {}, 0.7)


def test_acquire_sent_false_failure_is_not_reached(state: AliasState) -> None:
    """reached is False for a call that never left (sent=False), True for one sent unanswered."""
    run = drive(
        plans.acquire_plan(state, fake_nodes(4), NAME, 5.0),
        [answer(ACQUIRE, granted(4), granted(4), granted(4), REFUSED)],
    )
    assert run.result.reached == (True, True, True, False)
    run = drive(
        plans.acquire_plan(state, fake_nodes(4), NAME, 5.0),
        [answer(ACQUIRE, granted(4), granted(4), granted(4), TIMED_OUT)],
    )
    assert run.result.reached == (True, True, True, True)


@pytest.mark.parametrize(
    ("replies", "settled"),
    [
        ((granted(1), granted(1), PENDING), True),
        ((granted(1), PENDING, PENDING), False),
        ((busy(1, 5), busy(1, 5), PENDING), True),
        ((granted(1), busy(1, 5), PENDING), False),
        ((UNTRUSTED, granted(1), PENDING), False),
        ((UNTRUSTED, TIMED_OUT, PENDING), True),
        ((granted(1), TIMED_OUT, busy(1, 5)), True),
    ],
    ids=["two-wins", "one-win", "two-busy", "win-busy", "untrusted-win", "two-failures", "all"],
)
def test_acquire_settled(state: AliasState, replies: tuple[Any, ...], settled: bool) -> None:
    """ACQUIRE settles on a quorum of grants or once a quorum can no longer be reached."""
    request = next(plans.acquire_plan(state, fake_nodes(3), NAME, 5.0))
    assert request.settled(slots(*replies)) is settled


# -- quarantine and rejoin ----------------------------------------------------------------


def test_acquire_on_brand_new_cluster_initialises_it(state: AliasState) -> None:
    """A brand-new cluster is rejoined at once at the clock floor; the retry uses a new owner."""
    nodes = fake_nodes(3)
    fresh = [probe("", 0, 0, 0)] * 3
    run = drive(
        plans.acquire_plan(state, nodes, NAME, 5.0),
        [
            answer(ACQUIRE, UNTRUSTED, UNTRUSTED, UNTRUSTED),
            answer(PROBE, *fresh),
            answer(REJOIN, FLOOR, FLOOR, FLOOR),
            answer(ACQUIRE, granted(FLOOR + 1), granted(FLOOR + 1), granted(FLOOR + 1)),
        ],
    )
    assert run.result.token == FLOOR + 1
    assert [c.keys for c in run.calls(1) if c] == [("t:__fence__",)] * 3
    assert [c.args for c in run.calls(2) if c] == [(f"r{i}", FLOOR) for i in range(3)]
    assert run.requests[1].timeout == run.requests[2].timeout == 2 * state.node_timeout
    first, second = run.calls(0)[0].args[0], run.calls(3)[0].args[0]
    assert first != second == run.result.owner


def test_acquire_piped_behind_a_wait_sends_it_once_and_waits_longer(
    state: AliasState,
) -> None:
    """An attempt piped behind a BLPOP: the first try's call carries the BLPOP ahead of it
    (between two readings of the node's clock) and its request waits ``wait`` seconds and one
    node cycle longer; the retry after a rejoin carries nothing."""
    blpop = ("BLPOP", "t:__wake__:job", "0.500")
    fresh = [probe("", 0, 0, 0)]
    waited = {0: [clock_reading(WALL), None, clock_reading(WALL + 0.5)]}
    run = drive(
        plans.acquire_plan(
            state, fake_nodes(1), NAME, 5.0, waiter="w", woken=True, before=(blpop,), wait=0.55
        ),
        [
            answer(ACQUIRE, UNTRUSTED, ahead=waited),
            answer(PROBE, *fresh),
            answer(REJOIN, FLOOR),
            answer(ACQUIRE, granted(FLOOR + 1)),
        ],
    )
    assert run.result.token == FLOOR + 1
    assert run.calls(0)[0].before == (("TIME",), blpop, ("TIME",))
    assert run.calls(0)[0].args[5] == "1"
    # and one cycle of the node (tick: 1/hz), which ends a timed-out BLPOP that much late
    assert run.requests[0].timeout == pytest.approx(state.node_timeout + 0.55 + 0.1)
    assert run.calls(3)[0].before == ()
    assert run.requests[3].timeout == state.node_timeout


PIPED = (("BLPOP", "t:__wake__:job", "0.400"),)


def piped_acquire(state: AliasState, ttl: float) -> Any:
    """A woken waiter's attempt on one node, piped behind a 0.4 s BLPOP."""
    return plans.acquire_plan(
        state, fake_nodes(1), NAME, ttl, waiter="w", woken=True, before=PIPED, wait=0.4
    )


def test_a_piped_attempt_counts_its_validity_from_when_the_node_ran_it(
    state: AliasState, clock: Clock
) -> None:
    """The node held the attempt 0.25 s behind the BLPOP (its clock read before and after),
    the replies came 0.3 s after the write: a 0.2 s lease is granted with 0.2 - drift - 0.05 s
    left, not thrown away as expired (counted from the write, it had -0.1 s)."""
    woken = [b"t:__wake__:job", b"1"]
    run = drive(
        piped_acquire(state, 0.2),
        [
            answer(
                ACQUIRE,
                granted(7),
                elapsed=0.3,
                ahead={0: [clock_reading(WALL), woken, clock_reading(WALL + 0.25)]},
            ),
        ],
        clock,
    )
    assert isinstance(run.result, LeaseRecord) and run.result.token == 7
    assert run.result.deadline == pytest.approx(START + 0.25 + 0.2 - state.drift(0.2))
    assert run.result.validity() == pytest.approx(0.2 - state.drift(0.2) - 0.05)


def test_a_piped_attempt_waits_for_the_cycle_of_a_slow_ticking_node(
    state: AliasState,
) -> None:
    """A node at hz 2 ends a timed-out BLPOP up to 0.5 s late: the attempt behind it is waited
    for that much longer, not given up on (its grant would be thrown away); an attempt that
    carries nothing waits the usual ``NODE_TIMEOUT``."""
    nodes = fake_nodes(1)
    nodes[0].tick = 0.5
    piped = plans.acquire_plan(state, nodes, NAME, 5.0, waiter="w", before=PIPED, wait=0.45)
    ahead = {0: [clock_reading(WALL), None, clock_reading(WALL + 0.4)]}
    run = drive(piped, [answer(ACQUIRE, granted(6), ahead=ahead)])
    assert run.requests[0].timeout == pytest.approx(state.node_timeout + 0.45 + 0.5)
    plain = drive(plans.acquire_plan(state, nodes, NAME, 5.0), [answer(ACQUIRE, granted(7))])
    assert plain.requests[0].timeout == state.node_timeout


def test_a_piped_attempt_that_timed_out_its_wait_keeps_the_grant(
    state: AliasState, clock: Clock
) -> None:
    """The BLPOP timed out (nil) after 0.4 s on the node, longer than the 0.2 s TTL, and the
    attempt then took the name (the holder's key had expired): the lease keeps the grant with
    its validity counted from the second clock reading."""
    run = drive(
        piped_acquire(state, 0.2),
        [
            answer(
                ACQUIRE,
                granted(8),
                elapsed=0.41,
                ahead={0: [clock_reading(WALL), None, clock_reading(WALL + 0.4)]},
            ),
        ],
        clock,
    )
    assert isinstance(run.result, LeaseRecord)
    assert run.result.validity() == pytest.approx(0.2 - state.drift(0.2) - 0.01)


@pytest.mark.parametrize(
    "first, last",
    [
        (NodeFailure("ResponseError: NOPERM"), clock_reading(WALL + 0.25)),
        (clock_reading(WALL), TIMED_OUT),
        (clock_reading(WALL + 0.25), clock_reading(WALL)),  # the node's clock stepped back
    ],
)
def test_a_piped_attempt_without_both_clock_readings_counts_from_the_write(
    state: AliasState, clock: Clock, first: Any, last: Any
) -> None:
    """A clock reading missing (refused, unanswered) or going backwards: nothing says how long
    the node held the attempt back, so its validity counts from the write, as a plain attempt's
    does (0.3 s later: 5 - drift - 0.3 s left)."""
    run = drive(
        piped_acquire(state, 5.0),
        [answer(ACQUIRE, granted(9), elapsed=0.3, ahead={0: [first, None, last]})],
        clock,
    )
    assert run.result.deadline == pytest.approx(START + 5.0 - state.drift(5.0))


def test_a_piped_attempt_is_held_back_no_longer_than_our_clock_saw(
    state: AliasState, clock: Clock
) -> None:
    """The node's clock says 10 s passed between its readings (stepped forward) while our
    clock saw 0.3 s from the write to the replies: the lease starts at most 0.3 s after the
    write, so a jumping node clock never stretches it."""
    run = drive(
        piped_acquire(state, 5.0),
        [
            answer(
                ACQUIRE,
                granted(10),
                elapsed=0.3,
                ahead={0: [clock_reading(WALL), None, clock_reading(WALL + 10)]},
            ),
        ],
        clock,
    )
    assert run.result.deadline == pytest.approx(START + 0.3 + 5.0 - state.drift(5.0))


def test_acquire_retries_when_another_process_initialised_the_new_cluster(
    state: AliasState,
) -> None:
    """Two processes' first acquires on a new cluster: both find every node untrusted, the
    other one initialises the fence state before this one's probe. The nodes are trusted now,
    so the acquire is retried (it used to fail, "quarantined")."""
    nodes = fake_nodes(3)
    initialised = [probe(f"r{i}", FLOOR) for i in range(3)]
    run = drive(
        plans.acquire_plan(state, nodes, NAME, 5.0),
        [
            answer(ACQUIRE, UNTRUSTED, UNTRUSTED, UNTRUSTED),
            answer(PROBE, *initialised),
            answer(ACQUIRE, granted(FLOOR + 2), granted(FLOOR + 2), granted(FLOOR + 2)),
        ],
    )
    assert run.result.token == FLOOR + 2
    assert run.scripts() == ["acquire", "probe", "acquire"]


def test_a_cluster_half_initialised_by_another_process_is_finished_at_once(
    state: AliasState,
) -> None:
    """Another process's REJOIN reached node 0 only (it was preempted): node 0 is trusted but
    has granted nothing (no longest TTL), nodes 1 and 2 have no fence hash. No lease can exist,
    so this process initialises nodes 1 and 2 at once instead of quarantining them."""
    nodes = fake_nodes(3)
    nodes[1].up = nodes[2].up = 0.5  # started just now: a quarantine would apply
    run = drive(
        plans.acquire_plan(state, nodes, NAME, 5.0),
        [
            answer(ACQUIRE, UNTRUSTED, UNTRUSTED, UNTRUSTED),
            answer(PROBE, probe("r0", FLOOR, 0), probe("", 0, 0, 0), probe("", 0, 0, 0)),
            answer(REJOIN, None, FLOOR, FLOOR),
            answer(ACQUIRE, granted(FLOOR + 1), granted(FLOOR + 1), granted(FLOOR + 1)),
        ],
    )
    assert run.result.token == FLOOR + 1
    assert [c.args for c in run.calls(2) if c] == [("r1", FLOOR), ("r2", FLOOR)]


def test_acquire_does_not_retry_when_its_untrusted_nodes_stay_untrusted(
    state: AliasState,
) -> None:
    """Trusted nodes in the probe do not cause a retry; only an untrusted node of the
    attempt that is trusted now does."""
    nodes = fake_nodes(3)
    nodes[2].up = 1.0  # restarted 1 s ago: still in quarantine
    run = drive(
        plans.acquire_plan(state, nodes, NAME, 5.0),
        [
            answer(ACQUIRE, busy(12, 5), busy(12, 5), UNTRUSTED),
            answer(PROBE, probe("r0", 12), probe("r1", 12), probe("", 0, 0, 1)),
        ],
    )
    assert run.result.reason == "busy"
    assert run.scripts() == ["acquire", "probe"]


def test_acquire_rejoin_releases_first_attempt_and_retries(state: AliasState) -> None:
    """After a rejoin, the first attempt's grants are released with its owner, then it retries."""
    nodes = fake_nodes(3)
    for i in (1, 2):
        state.untrusted_seen[(f"n{i}", f"r{i}")] = START - 60  # quarantine long over
    run = drive(
        plans.acquire_plan(state, nodes, NAME, 5.0),
        [
            answer(ACQUIRE, granted(12), UNTRUSTED, UNTRUSTED),
            answer(PROBE, probe("r0", 12), probe("old", 9), probe("old", 9)),
            answer(REJOIN, None, FLOOR, FLOOR),
            fire(RELEASE, to=[0]),
            answer(ACQUIRE, granted(13), granted(FLOOR + 1), granted(FLOOR + 1)),
            answer(RAISE, 1, None, None),
        ],
    )
    first_owner = run.calls(0)[0].args[0]
    assert release_args(run.calls(3)[0])[0] == first_owner
    assert run.result.owner != first_owner
    assert run.result.token == FLOOR + 1
    assert [c.args for c in run.calls(2) if c] == [("r1", FLOOR), ("r2", FLOOR)]


def test_a_won_attempt_lets_an_eligible_restarted_node_rejoin(state: AliasState) -> None:
    """Nodes 0 and 1 granted, node 2 is untrusted and its quarantine is over: the attempt
    wins, and rejoins node 2 on its way (with the trusted nodes' counter) instead of leaving
    that to an attempt that lacks a quorum, which would need two trusted nodes to answer."""
    state.untrusted_seen[("n2", "r2")] = START - 60  # quarantine long over
    run = drive(
        plans.acquire_plan(state, fake_nodes(3), NAME, 5.0),
        [
            answer(ACQUIRE, granted(12), granted(12), UNTRUSTED),
            answer(PROBE, probe("r0", 12), probe("r1", 12), probe("old", 9)),
            answer(REJOIN, None, None, 12),
        ],
    )
    assert run.result.token == 12
    assert run.result.reached == (True, True, False)
    assert [c.args for c in run.calls(2) if c] == [("r2", 12)]


def test_a_won_attempt_looks_at_a_restarted_node_at_most_every_rejoin_interval(
    state: AliasState,
) -> None:
    """Within REJOIN_INTERVAL of a check that left node 2 in its quarantine, a won attempt
    that finds it untrusted does not probe again: the grant costs nothing more."""
    state.next_rejoin_check = START + 0.1
    state.held_back = frozenset({"n2"})
    run = drive(
        plans.acquire_plan(state, fake_nodes(3), NAME, 5.0),
        [answer(ACQUIRE, granted(12), granted(12), UNTRUSTED)],
    )
    assert run.result.token == 12


def test_acquire_keeps_quarantined_node_out(state: AliasState) -> None:
    """A node restarted 1 s ago (longest TTL 5 s) is not rejoined: "unavailable", quarantined.
    The trusted nodes joined long ago (no cluster being initialised): one look is enough."""
    nodes = fake_nodes(3)
    nodes[2].up = 1.0
    run = drive(
        plans.acquire_plan(state, nodes, NAME, 5.0),
        [
            answer(ACQUIRE, granted(12), TIMED_OUT, UNTRUSTED),
            answer(PROBE, probe("r0", 12), probe("r1", 12), probe("", 0, 0, 0)),
            fire(RELEASE, to=[0, 1]),
        ],
    )
    assert run.result == AcquireFailure(
        "unavailable",
        1,
        1,
        {"n1": "timed out", "n2": plans.QUARANTINED},
        None,
    )
    assert state.untrusted_seen == {("n2", "r2"): START}


def test_acquire_looks_again_when_probes_straddle_another_first_acquire(
    state: AliasState,
) -> None:
    """First acquires racing on a new cluster: nodes 0 and 1 were probed before another
    process's initialisation reached them (no fence state) and node 2 after its first grant.
    Node 2 joined at the clock floor just now, so that process is still initialising: the
    caller looks again, finds nodes 0 and 1 initialised by it, retries and wins (it used to
    fail "unavailable": the first look alone says "quarantined")."""
    floor = FLOOR + 5
    run = drive(
        plans.acquire_plan(state, fake_nodes(3), NAME, 5.0),
        [
            answer(ACQUIRE, UNTRUSTED, UNTRUSTED, granted(floor + 1)),
            answer(
                PROBE,
                probe("", 0, 0, 0),
                probe("", 0, 0, 0),
                probe("r2", floor + 2, joined=floor),
            ),
            answer(
                PROBE,
                probe("r0", floor, 0, joined=floor),
                probe("r1", floor, 0, joined=floor),
                probe("r2", floor + 2, joined=floor),
            ),
            fire(RELEASE, to=[2]),
            answer(ACQUIRE, granted(floor + 3), granted(floor + 3), granted(floor + 3)),
        ],
    )
    assert run.result.token == floor + 3


def test_acquire_does_not_retry_while_only_one_node_of_three_is_trusted(
    state: AliasState,
) -> None:
    """As above, but three looks find only node 0 initialised (the initialising caller
    reached it, not yet the others): one trusted node of three cannot make a quorum, so the
    caller looks again rather than retry (a retry then failed "quarantined" with nodes 1
    and 2 a moment from joining); the fourth look finds them joined."""
    floor = FLOOR + 5
    fresh = probe("", 0, 0, 0)
    run = drive(
        plans.acquire_plan(state, fake_nodes(3), NAME, 5.0),
        [
            answer(ACQUIRE, UNTRUSTED, UNTRUSTED, UNTRUSTED),
            answer(PROBE, probe("r0", floor + 1, joined=floor), fresh, fresh),
            answer(PROBE, probe("r0", floor + 1, joined=floor), fresh, fresh),
            answer(PROBE, probe("r0", floor + 1, joined=floor), fresh, fresh),
            answer(
                PROBE,
                probe("r0", floor + 1, joined=floor),
                probe("r1", floor, 0, joined=floor),
                probe("r2", floor, 0, joined=floor),
            ),
            answer(ACQUIRE, granted(floor + 2), granted(floor + 1), granted(floor + 1)),
        ],
    )
    assert run.result.token == floor + 1  # what a quorum handed out: nothing to write back


def test_acquire_stops_looking_when_the_race_outlasts_its_wait(
    state: AliasState, clock: Clock
) -> None:
    """The initialising caller never reaches nodes 1 and 2 (it died mid-way): the caller
    looks for RACE_WAIT at most, then leaves them to their quarantine ("unavailable")."""
    floor = FLOOR + 5
    fresh = probe("", 0, 0, 0)
    used = probe("r0", floor + 1, joined=floor)
    run = drive(
        plans.acquire_plan(state, fake_nodes(3), NAME, 5.0),
        [
            answer(ACQUIRE, UNTRUSTED, UNTRUSTED, UNTRUSTED),
            answer(PROBE, used, fresh, fresh),
            answer(PROBE, used, fresh, fresh, elapsed=_trust.RACE_WAIT),
        ],
        clock,
    )
    assert run.result.reason == "unavailable"
    assert run.scripts() == ["acquire", "probe", "probe"]


def test_acquire_does_not_look_again_beside_nodes_that_joined_long_ago(
    state: AliasState,
) -> None:
    """A node without fence state beside a trusted node that joined long before RACE_RECENT
    (a restart beside an older cluster, not an initialisation): one look."""
    old = int((WALL - 2 * _trust.RACE_RECENT) * 1000) * CLOCK_FLOOR
    fresh = probe("", 0, 0, 0)
    run = drive(
        plans.acquire_plan(state, fake_nodes(3), NAME, 5.0),
        [
            answer(ACQUIRE, UNTRUSTED, UNTRUSTED, UNTRUSTED),
            answer(PROBE, probe("r0", old + 9, joined=old), fresh, fresh),
        ],
    )
    assert run.result.reason == "unavailable"
    assert run.scripts() == ["acquire", "probe"]


def test_acquire_does_not_count_its_own_grant_as_a_used_cluster(
    state: AliasState,
) -> None:
    """First acquires racing on a new cluster: another process's initialisation reached node
    2 only, and this attempt got a grant there; nodes 0 and 1 have no fence state yet. The
    only grant node 2 shows is this caller's own (one token drawn since it joined), so the
    cluster is still new: nodes 0 and 1 are initialised at once and the attempt wins (its
    own grant used to put nodes 0 and 1 in quarantine: "unavailable")."""
    floor = FLOOR + 5
    run = drive(
        plans.acquire_plan(state, fake_nodes(3), NAME, 5.0),
        [
            answer(ACQUIRE, UNTRUSTED, UNTRUSTED, granted(floor + 1)),
            answer(
                PROBE, probe("", 0, 0, 0), probe("", 0, 0, 0), probe("r2", floor + 1, joined=floor)
            ),
            answer(REJOIN, floor + 1, floor + 1, None),
            fire(RELEASE, to=[2]),
            answer(ACQUIRE, granted(floor + 2), granted(floor + 2), granted(floor + 2)),
        ],
    )
    assert run.result.token == floor + 2


def test_acquire_counts_a_grant_beside_its_own_as_a_used_cluster(
    state: AliasState, clock: Clock
) -> None:
    """As above, but two tokens were drawn on node 2 since it joined: one is someone else's,
    who may hold a lease that nodes 0 and 1 lost, so they stay in quarantine (after looking
    for the initialisation to reach them for RACE_WAIT)."""
    floor = FLOOR + 5
    used = probe("r2", floor + 2, joined=floor)
    run = drive(
        plans.acquire_plan(state, fake_nodes(3), NAME, 5.0),
        [
            answer(ACQUIRE, UNTRUSTED, UNTRUSTED, granted(floor + 2)),
            answer(PROBE, probe("", 0, 0, 0), probe("", 0, 0, 0), used),
            answer(PROBE, probe("", 0, 0, 0), probe("", 0, 0, 0), used, elapsed=_trust.RACE_WAIT),
            fire(RELEASE, to=[2]),
        ],
        clock,
    )
    assert run.result.reason == "unavailable"


def test_acquire_rejoins_at_most_once(state: AliasState, clock: Clock) -> None:
    """If nodes are still untrusted after a rejoin, the attempt fails instead of looping."""
    fresh = [probe("", 0, 0, 0)] * 3
    run = drive(
        plans.acquire_plan(state, fake_nodes(3), NAME, 5.0),
        [
            answer(ACQUIRE, UNTRUSTED, UNTRUSTED, UNTRUSTED),
            answer(PROBE, *fresh),
            answer(REJOIN, FLOOR, FLOOR, FLOOR, elapsed=1.0),
            answer(ACQUIRE, UNTRUSTED, UNTRUSTED, UNTRUSTED),
        ],
        clock,
    )
    assert run.result.reason == "unavailable"
    assert run.scripts() == ["acquire", "probe", "rejoin", "acquire"]


def test_acquire_rejoin_is_rate_limited(state: AliasState) -> None:
    """Within REJOIN_INTERVAL of the last probe, an untrusted reply from nodes that check left
    untrusted does not probe again."""
    state.next_rejoin_check = START + 0.1
    state.held_back = frozenset({"n0", "n1", "n2"})
    run = drive(
        plans.acquire_plan(state, fake_nodes(3), NAME, 5.0),
        [answer(ACQUIRE, UNTRUSTED, UNTRUSTED, UNTRUSTED)],
    )
    assert run.result.reason == "unavailable"


def test_acquire_probes_within_the_rate_limit_for_nodes_the_last_check_trusted(
    state: AliasState,
) -> None:
    """The last check (a busy caller's, in this process) left only node 2 untrusted; a caller
    whose attempt found nodes 0 and 1 untrusted too (it ran before the cluster was
    initialised) probes anyway, finds them trusted and retries (it was refused "quarantined"
    on a new cluster)."""
    state.next_rejoin_check = START + 0.1
    state.held_back = frozenset({"n2"})
    floor = FLOOR + 5
    run = drive(
        plans.acquire_plan(state, fake_nodes(3), NAME, 5.0),
        [
            answer(ACQUIRE, UNTRUSTED, UNTRUSTED, UNTRUSTED),
            answer(
                PROBE,
                probe("r0", floor + 1, joined=floor),
                probe("r1", floor + 1, joined=floor),
                probe("", 0, 0, 0),
            ),
            answer(ACQUIRE, granted(floor + 2), granted(floor + 2), UNTRUSTED),
        ],
    )
    assert run.result.token == floor + 2


def test_a_check_that_trusts_nothing_new_holds_back_only_the_nodes_it_left_untrusted(
    state: AliasState,
) -> None:
    """A busy caller's check (nodes 0 and 1 trusted and busy, node 2 in its quarantine) holds
    back the callers that find node 2 untrusted, and only those."""
    nodes = fake_nodes(3)
    nodes[2].up = 1.0
    old = probe("r0", 12)
    run = drive(
        plans.acquire_plan(state, nodes, NAME, 5.0),
        [
            answer(ACQUIRE, busy(12, 4000), busy(12, 4000), UNTRUSTED),
            answer(PROBE, old, probe("r1", 12), probe("", 0, 0, 0)),
        ],
    )
    assert run.result.reason == "busy"
    assert state.next_rejoin_check == START + REJOIN_INTERVAL
    assert state.held_back == frozenset({"n2"})


def test_rejoin_rate_limit(state: AliasState, clock: Clock) -> None:
    """rejoin_plan probes at most once per REJOIN_INTERVAL; in between it returns False."""
    nodes = fake_nodes(3)
    trusted = [probe(f"r{i}", 5) for i in range(3)]
    first = drive(rejoin_plan(state, nodes), [answer(PROBE, *trusted)])
    assert first.result is False  # nothing to rejoin
    assert state.next_rejoin_check == START + REJOIN_INTERVAL
    clock.advance(REJOIN_INTERVAL - 0.01)
    assert drive(rejoin_plan(state, nodes), []).result is False
    clock.advance(0.01)
    drive(rejoin_plan(state, nodes), [answer(PROBE, *trusted)])


def test_rejoin_uses_max_counter_of_trusted_majority(state: AliasState, clock: Clock) -> None:
    """A wiped node waits the longest TTL from first sight, then gets the trusted max counter."""
    nodes = fake_nodes(3)
    probes = [probe("r0", 12), probe("r1", 15, 7000), probe("", 40, 0, 0)]
    assert drive(rejoin_plan(state, nodes), [answer(PROBE, *probes)]).result is False
    assert state.longest_ttl_ms == 7000  # learned from the probes
    clock.advance(6.9)
    assert drive(rejoin_plan(state, nodes), [answer(PROBE, *probes)]).result is False
    clock.advance(REJOIN_INTERVAL)  # 7.4 s since first seen, also past the rate limit
    run = drive(rejoin_plan(state, nodes), [answer(PROBE, *probes), answer(REJOIN, None, None, 15)])
    assert run.result is True
    assert run.calls(1)[2].args == ("r2", 15)


def test_rejoin_takes_reachable_counter_above_floor(state: AliasState) -> None:
    """Without a trusted quorum, a reachable counter above the clock floor is the rejoin value."""
    nodes = fake_nodes(3)
    for i in (1, 2):
        state.untrusted_seen[(f"n{i}", f"r{i}")] = START - 60
    probes = [probe("r0", 12), probe("old", FLOOR + 50), probe("old", 20)]
    run = drive(
        rejoin_plan(state, nodes),
        [answer(PROBE, *probes), answer(REJOIN, None, FLOOR + 50, NodeFailure("timed out"))],
    )
    assert run.result is True
    assert [c.args for c in run.calls(1) if c] == [("r1", FLOOR + 50), ("r2", FLOOR + 50)]


def test_rejoin_clock_floor(state: AliasState) -> None:
    """Without a trusted quorum and with counters below it, the clock floor is the value."""
    nodes = fake_nodes(3)
    for i in (1, 2):
        state.untrusted_seen[(f"n{i}", f"r{i}")] = START - 60
    run = drive(
        rejoin_plan(state, nodes),
        [
            answer(PROBE, probe("r0", 12), probe("old", 99), probe("old", 20)),
            answer(REJOIN, None, FLOOR, FLOOR),
        ],
    )
    assert [c.args for c in run.calls(1) if c] == [("r1", FLOOR), ("r2", FLOOR)]


def test_rejoin_needs_a_reachable_quorum(state: AliasState) -> None:
    """Fewer than a quorum of probes answered: nothing is rejoined."""
    run = drive(
        rejoin_plan(state, fake_nodes(3)),
        [answer(PROBE, probe("", 0, 0, 0), TIMED_OUT, REFUSED)],
    )
    assert run.result is False


def test_rejoin_refuses_value_at_token_limit(state: AliasState) -> None:
    """A rejoin value at 2**53 would overflow the tokens: nothing is rejoined."""
    state.untrusted_seen[("n2", "r2")] = START - 60
    probes = [probe("r0", TOKEN_LIMIT), probe("r1", 3), probe("", 0, 0, 0)]
    assert drive(rejoin_plan(state, fake_nodes(3)), [answer(PROBE, *probes)]).result is False


def test_rejoin_fails_when_no_target_answers(state: AliasState) -> None:
    """A REJOIN that no target answered reports False."""
    state.untrusted_seen[("n2", "r2")] = START - 60
    probes = [probe("r0", 5), probe("r1", 5), probe("", 0, 0, 0)]
    run = drive(
        rejoin_plan(state, fake_nodes(3)),
        [answer(PROBE, *probes), answer(REJOIN, None, None, TIMED_OUT)],
    )
    assert run.result is False


# -- release_plan --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("replies", "held", "handed_off", "unsure"),
    [
        ((1, 1, 1), True, False, ()),
        ((1, 1, 0), True, False, ()),
        ((2, 1, TIMED_OUT), True, True, (2,)),
        ((1, TIMED_OUT, TIMED_OUT), False, False, (1, 2)),
        ((1, 0, 0), False, False, ()),
        ((0, 0, 0), False, False, ()),
        ((TIMED_OUT, TIMED_OUT, TIMED_OUT), False, False, (0, 1, 2)),
        ((1, 0, TIMED_OUT), False, False, (2,)),
    ],
    ids=[
        "all",
        "quorum",
        "handed-off",
        "one-of-three",
        "majority-refused",
        "none",
        "silent",
        "one-refused-one-silent",
    ],
)
def test_release_result(
    state: AliasState,
    replies: tuple[Any, ...],
    held: bool,
    handed_off: bool,
    unsure: tuple[int, ...],
) -> None:
    """release is True only when a quorum confirmed its compare-and-delete; a quorum of "not
    yours" is a loss; too few answers leave the nodes that did not answer ``unsure`` (the
    release is sent there again: it used to count a timed-out release as done, though a
    connection that broke meanwhile never ran it), and so does a node that did not answer a
    release a quorum confirmed (``settled``: it is sent there again in the background);
    2 marks handed_off."""
    lease = lease_for()
    run = drive(plans.release_plan(state, fake_nodes(3), lease), [answer(RELEASE, *replies)])
    assert run.result is held
    assert lease.released and lease.handed_off is handed_off
    assert lease.unsure == unsure
    assert lease.settled is held
    waking = wake_node(NAME, 3)
    for i, call in enumerate(run.calls(0)):
        assert release_args(call) == ("a" * 32, "1" if i == waking else "0", 0)


@pytest.mark.parametrize(
    ("again", "confirmed", "unsure"),
    [
        ((1, 1), True, ()),
        ((0, 0), True, ()),  # "not yours" while still valid: the earlier send had run
        ((1, TIMED_OUT), True, (2,)),
        ((TIMED_OUT, TIMED_OUT), False, (1, 2)),
    ],
    ids=["deleted", "ran-before", "one-still-silent", "still-silent"],
)
def test_release_again_counts_the_nodes_that_answer(
    state: AliasState, again: tuple[Any, ...], confirmed: bool, unsure: tuple[int, ...]
) -> None:
    """A release confirmed by one node of three is sent again to the two others only."""
    lease = lease_for()
    drive(
        plans.release_plan(state, fake_nodes(3), lease), [answer(RELEASE, 1, TIMED_OUT, TIMED_OUT)]
    )
    run = drive(
        plans.release_again_plan(state, fake_nodes(3), lease),
        [answer(RELEASE, None, *again)],
    )
    assert [call is not None for call in run.calls(0)] == [False, True, True]
    assert run.result is confirmed
    assert lease.unsure == unsure


def test_release_twice_sends_nothing(state: AliasState) -> None:
    """A second release returns False without a request."""
    lease = lease_for()
    drive(plans.release_plan(state, fake_nodes(3), lease), [answer(RELEASE, 1, 1, 1)])
    assert drive(plans.release_plan(state, fake_nodes(3), lease), []).result is False


def test_release_of_expired_or_lost_lease_cleans_up_but_is_false(state: AliasState) -> None:
    """An expired or lost lease is still deleted everywhere, but release reports False."""
    expired = lease_for(valid=-0.1)
    run = drive(plans.release_plan(state, fake_nodes(3), expired), [answer(RELEASE, 1, 1, 1)])
    assert run.result is False
    lost = lease_for()
    lost.lost = True
    run = drive(plans.release_plan(state, fake_nodes(3), lost), [answer(RELEASE, 1, 1, 1)])
    assert run.result is False


def test_release_skips_unreached_and_disconnected_nodes(state: AliasState) -> None:
    """No RELEASE to a node the acquire never reached, nor to one not connected. Released on
    one of the two nodes that hold it: unconfirmed (False), to be sent again to the one that
    was down (it used to count as done)."""
    lease = lease_for(reached=(True, False, True))
    nodes = fake_nodes(3, down=[2])
    run = drive(plans.release_plan(state, nodes, lease), [answer(RELEASE, 1, None, None)])
    assert [call is not None for call in run.calls(0)] == [True, False, False]
    assert run.result is False
    assert lease.unsure == (2,)


def test_release_without_reached_goes_everywhere(state: AliasState) -> None:
    """A lease without reached flags (made elsewhere) is released on every node."""
    lease = lease_for(reached=())
    run = drive(plans.release_plan(state, fake_nodes(3), lease), [answer(RELEASE, 1, 1, 1)])
    assert run.sent_to(0) == [0, 1, 2]


@pytest.mark.parametrize(
    ("reached", "replies", "settled"),
    [
        ((True, True, True), (0, PENDING, PENDING), False),
        ((True, True, True), (0, 1, PENDING), True),
        ((True, False, True), (1, NOT_CONNECTED, PENDING), False),
        ((True, False, True), (1, NOT_CONNECTED, 1), True),
        ((True, False, False), (PENDING, NOT_CONNECTED, NOT_CONNECTED), False),
        ((True, False, False), (1, NOT_CONNECTED, NOT_CONNECTED), True),
    ],
    ids=["one-answer", "quorum-answered", "one-of-two", "both", "lone-pending", "lone-answered"],
)
def test_release_settled(
    state: AliasState,
    reached: tuple[bool, ...],
    replies: tuple[Any, ...],
    settled: bool,
) -> None:
    """RELEASE settles on a quorum of answers, or when every node called has answered."""
    request = next(plans.release_plan(state, fake_nodes(3), lease_for(reached=reached)))
    assert request.settled(slots(*replies)) is settled


# -- extend_plan ---------------------------------------------------------------------------


def test_extend_renews_deadline_and_ttl(state: AliasState, clock: Clock) -> None:
    """A quorum of 1s renews: deadline = start + ttl - drift, ttl and longest TTL updated."""
    lease = lease_for(valid=1.0)
    nodes = fake_nodes(3, down=[2])
    run = drive(
        plans.extend_plan(state, nodes, lease, 8.0),
        [answer(EXTEND, 1, 1, None, elapsed=0.2)],
        clock,
    )
    assert run.result.status == RENEWED
    assert lease.deadline == pytest.approx(START + 8.0 - state.drift(8.0))
    assert (lease.ttl, lease.lost, state.longest_ttl_ms) == (8.0, False, 8000)
    assert run.calls(0)[0].keys == ("t:job", "t:__fence__")
    assert [c.args for c in run.calls(0) if c] == [("a" * 32, 8000, "r0"), ("a" * 32, 8000, "r1")]


@pytest.mark.parametrize(
    ("replies", "released"),
    [((0, 0, TIMED_OUT), [2]), ((0, 0, 0), []), ((0, 0, 1), [2])],
    ids=["majority-not-held", "none", "one-renewed"],
)
def test_extend_lost(state: AliasState, replies: tuple[Any, ...], released: list[int]) -> None:
    """When so many nodes say "not held" that no quorum can hold it, the lease is lost and
    released where it was just renewed (or may have been: no answer)."""
    lease = lease_for()
    deadline = lease.deadline
    steps = [answer(EXTEND, *replies)]
    if released:
        steps.append(fire(RELEASE, to=released))
    run = drive(plans.extend_plan(state, fake_nodes(3), lease, 5.0), steps)
    assert run.result.status == LOST
    assert lease.lost and lease.deadline == deadline
    for call in run.calls(1) if released else []:
        if call is not None:
            assert release_args(call)[0] == "a" * 32


@pytest.mark.parametrize(
    "replies",
    [(0, TIMED_OUT, 1), (-1, 1, REFUSED), (TIMED_OUT, TIMED_OUT, TIMED_OUT), (1, TIMED_OUT, 0)],
    ids=["one-not-held", "untrusted", "silent", "split"],
)
def test_extend_unconfirmed_keeps_the_lease(state: AliasState, replies: tuple[Any, ...]) -> None:
    """Too few answers in time (slow, down or restarted nodes) but no quorum of "not held":
    the lease stays valid for the validity it had, and nothing is deleted."""
    lease = lease_for()
    deadline = lease.deadline
    run = drive(plans.extend_plan(state, fake_nodes(3), lease, 5.0), [answer(EXTEND, *replies)])
    assert run.result.status == UNCONFIRMED
    assert not lease.lost and lease.deadline == deadline
    assert len(run.requests) == 1  # no release


def test_extend_too_slow_is_unconfirmed(state: AliasState, clock: Clock) -> None:
    """Renewals that arrive after ttl - drift do not renew, but the lease keeps its validity."""
    lease = lease_for()
    run = drive(
        plans.extend_plan(state, fake_nodes(3), lease, 1.0),
        [answer(EXTEND, 1, 1, 1, elapsed=1.0)],
        clock,
    )
    assert run.result.status == UNCONFIRMED and not lease.lost


def test_extend_too_slow_after_the_lease_ran_out_is_lost(state: AliasState, clock: Clock) -> None:
    """A renewal whose answers came after the lease's own validity ran out: lost, released."""
    lease = lease_for(valid=0.5)
    run = drive(
        plans.extend_plan(state, fake_nodes(3), lease, 1.0),
        [answer(EXTEND, 1, 1, 1, elapsed=1.0), fire(RELEASE, to=[0, 1, 2])],
        clock,
    )
    assert run.result.status == LOST and lease.lost


def test_extend_expired_lease_sends_nothing(state: AliasState) -> None:
    """An already expired (or released) lease is lost at once, without a request."""
    expired = lease_for(valid=-0.001)
    assert drive(plans.extend_plan(state, fake_nodes(3), expired, 5.0), []).result.status == "lost"
    assert expired.lost
    released = lease_for()
    released.released = True
    run = drive(plans.extend_plan(state, fake_nodes(3), released, 5.0), [])
    assert run.result.status == LOST


@pytest.mark.parametrize(
    ("replies", "settled"),
    [
        ((1, 1, PENDING), True),
        ((0, 0, PENDING), True),
        ((1, 0, PENDING), False),
        ((-1, 1, PENDING), False),
        ((TIMED_OUT, -1, PENDING), True),
    ],
    ids=["two-renewed", "two-not-held", "split", "untrusted-renewed", "two-failures"],
)
def test_extend_settled(state: AliasState, replies: tuple[Any, ...], settled: bool) -> None:
    """EXTEND settles on a quorum of renewals or once a quorum can no longer be reached."""
    request = next(plans.extend_plan(state, fake_nodes(3), lease_for(), 5.0))
    assert request.settled(slots(*replies)) is settled


# -- force_release_plan and wake_node -------------------------------------------------------


def test_force_release_counts_deletions(state: AliasState) -> None:
    """force_release_plan returns how many nodes deleted the key; failures do not count."""
    run = drive(
        plans.force_release_plan(state, fake_nodes(4, down=[3]), NAME, "v"),
        [answer(FORCE_RELEASE, 1, 0, TIMED_OUT, None)],
    )
    assert run.result == 1
    call = run.calls(0)[0]
    assert call.keys == ("t:job", "t:__fence__", "t:__wake__:job", "t:__readers__:job")
    assert call.args == ("v", WAKE_TTL_MS)
    assert run.requests[0].timeout == 4 * state.node_timeout
    run = drive(
        plans.force_release_plan(state, fake_nodes(3), NAME), [answer(FORCE_RELEASE, 1, 1, 1)]
    )
    assert run.result == 3 and run.calls(0)[0].args[0] == ""


def test_wake_node_is_stable_and_in_range() -> None:
    """wake_node is a fixed function of (name, count) every process agrees on, in range."""
    # pinned: waiters and releasers in processes of different versions must agree
    assert [wake_node("orders:42", n) for n in (1, 2, 3, 5, 7)] == [0, 1, 1, 2, 4]
    assert [wake_node("invoice-7", n) for n in (1, 2, 3, 5, 7)] == [0, 0, 2, 4, 2]
    names = [f"name-{i}" for i in range(200)] + ["", "é", "名前", "\udc80"]
    for count in range(1, 8):
        picks = [wake_node(name, count) for name in names]
        assert all(0 <= p < count for p in picks)
        assert picks == [wake_node(name, count) for name in names]
        assert set(picks) == set(range(count))  # every node serves some names


def test_register_goes_to_every_node_but_the_wake_node(state: AliasState) -> None:
    """A caller that queues without a failed attempt registers on the other nodes from a lock
    connection, fire-and-forget (the wake-up node gets it with the caller's BLPOP), so each
    node's release reserves the name for the hand-off."""
    waking = wake_node(NAME, 5)
    others = [i for i in range(5) if i != waking]
    run = drive(
        plans.register_plan(state, fake_nodes(5), NAME, "w1", 900),
        [fire(scripts.REGISTER, to=others)],
    )
    for i in others:
        call = run.calls(0)[i]
        assert (call.keys, call.args) == (("t:__waiters__:job",), ("w1", 900))
    # the wake node's registration also reads the name, to leave a wake-up where it is free
    assert state.mark_command(NAME, "w1", 900) == (
        "EVAL",
        scripts.REGISTER.source,
        4,
        "t:__waiters__:job",
        "t:job",
        "t:__wake__:job",
        "t:__handoff__:job",
        "w1",
        900,
    )


def test_register_on_one_node_sends_nothing(state: AliasState) -> None:
    """With one node, the BLPOP's own registration is all there is."""
    run = drive(plans.register_plan(state, fake_nodes(1), NAME, "w1", 900), [])
    assert run.requests == []


# -- semaphore permits --------------------------------------------------------------------
PERMIT, RELEASE_PERMIT = primitive_scripts.PERMIT, primitive_scripts.RELEASE_PERMIT


def permit(token: int, slot: int) -> list[int]:
    return [1, token, slot]


def test_permit_takes_the_slot_a_quorum_granted_and_gives_back_the_other(
    state: AliasState,
) -> None:
    """Two nodes granted the second slot tried, one the first: the permit is the second slot;
    the odd grant is released on its node, with that slot's key."""
    run = drive(
        plans.acquire_plan(state, fake_nodes(3), NAME, 5.0, permits=3),
        [
            answer(PERMIT, permit(7, 2), permit(7, 1), permit(7, 2)),
            fire(RELEASE_PERMIT, to=[1]),
        ],
    )
    lease = run.result
    tried = run.calls(0)[0].keys[4:]
    assert tried == tuple(f"t:__permit__:{k}:job" for k in range(3))  # lowest first
    assert lease.key == tried[1]
    assert run.calls(1)[1].args[-1] == "1"  # a permit's release may wake one more waiter
    assert lease.marker == "t:job"
    assert lease.reached == (True, False, True)
    # the slot it granted first, then the others (the release counts the free ones)
    assert run.calls(1)[1].keys[3:] == (tried[0], tried[1], tried[2])
    assert run.calls(0)[0].args[-1] == 3


def test_permit_without_a_quorum_on_one_slot_fails_and_releases_every_grant(
    state: AliasState,
) -> None:
    """Two nodes granted different slots (callers raced), the third is full: no permit; each
    grant is released on its node, with its slot's key."""
    run = drive(
        plans.acquire_plan(state, fake_nodes(3), NAME, 5.0, permits=3),
        [
            answer(PERMIT, permit(7, 1), permit(7, 2), busy(7, 300)),
            fire(RELEASE_PERMIT, to=[0, 1]),
        ],
    )
    assert run.result.reason == "busy"
    tried = run.calls(0)[0].keys[4:]
    assert [run.calls(1)[i].keys[3] for i in (0, 1)] == [tried[0], tried[1]]
    assert all(sorted(run.calls(1)[i].keys[3:]) == sorted(tried) for i in (0, 1))


def _lagging_winner(state: AliasState, permits: int, *steps: Step, lost: bool = False) -> Run:
    """A quorum of grants with node 0 behind (10 against 12), then ``steps``; ``lost``: the
    grants are given back at the end."""
    script = PERMIT if permits else ACQUIRE
    reply = permit if permits else (lambda token, slot: granted(token))
    releases = [fire(RELEASE_PERMIT if permits else RELEASE, to=[0, 1])] if lost else []
    return drive(
        plans.acquire_plan(state, fake_nodes(3), NAME, 5.0, permits=permits),
        [answer(script, reply(10, 1), reply(12, 1), busy(12, 400)), *steps, *releases],
    )


@pytest.mark.parametrize("permits", [3, 0], ids=["permit", "lock"])
@pytest.mark.parametrize("raise_reply", [0, TIMED_OUT], ids=["lost", "silent"])
def test_a_write_back_that_lost_its_key_or_went_unanswered_is_no_race(
    state: AliasState, permits: int, raise_reply: Any
) -> None:
    """A quorum granted, one winner lagging; its write-back finds the key gone (force-released
    or expired) or is not answered: the attempt fails "busy", not marked raced (retried at
    once, a silent node would make a timeout=0 call wait for it up to ten times)."""
    run = _lagging_winner(state, permits, answer(RAISE, raise_reply, None, None), lost=True)
    assert isinstance(run.result, AcquireFailure)
    assert (run.result.reason, run.result.votes, run.result.raced) == ("busy", 2, False)


@pytest.mark.parametrize("permits", [3, 0], ids=["permit", "lock"])
def test_a_lease_whose_token_a_racer_passed_draws_a_fresh_one(
    state: AliasState, permits: int
) -> None:
    """The lagging winner's counter already passed the token (another caller drew it there
    first: it answers its counter, 13). The attempt draws a fresh token above it, with a
    margin of what the racer passed it by (13 - 12 + 1): 14 + 2, and raises every winner to
    it, strictly; both confirm, so it holds that token."""
    run = _lagging_winner(
        state, permits, answer(RAISE, [13], None, None), answer(RAISE, 1, 1, None)
    )
    assert isinstance(run.result, LeaseRecord)
    assert run.result.token == 16
    assert [c.args[:2] for c in run.calls(2) if c] == [(16, 16), (16, 16)]


@pytest.mark.parametrize("permits", [3, 0], ids=["permit", "lock"])
def test_a_lease_whose_tokens_racers_keep_passing_is_marked_raced(
    state: AliasState, permits: int
) -> None:
    """Racers pass the fresh tokens too, round after round: after RAISE_ROUNDS the attempt
    fails "busy" marked raced (nobody else holds the name: the policy tries again at once)
    and gives its grants back."""
    run = _lagging_winner(
        state,
        permits,
        answer(RAISE, [13], None, None),
        answer(RAISE, [17], [17], None),  # passed 16 by 2: 18 + 2 x 2 next
        answer(RAISE, [23], 1, None),
        answer(RELEASE_PERMIT if permits else RELEASE, 1, 1, None),  # awaited: see below
    )
    assert len(run.requests) - 2 == tokens.RAISE_ROUNDS
    assert isinstance(run.result, AcquireFailure)
    assert (run.result.reason, run.result.votes, run.result.raced) == ("busy", 2, True)
    assert [c.args[0] for c in run.calls(3) if c] == [22, 22]  # the margin doubled


def test_a_raced_waiter_gives_its_grants_back_without_registering(state: AliasState) -> None:
    """A raced attempt of a caller that will wait: the policy tries again at once, without
    blocking on the wake-up list. So the grants it gives back register nobody (the node that
    said busy keeps its registration: the next attempt wins it back or withdraws it). Before,
    the give-back registered the caller, and on the node waiters block on it left the caller
    a wake-up that nobody popped; the next attempt then won and left that list behind for its
    2 s TTL (seen on a stalled event loop: tests/engine/test_stalled_loop.py). And the
    give-back is awaited: the next attempt may go out on other connections, and one that
    reached a node before the give-back found the caller's own grant there and was refused a
    name nobody held (timeout=0 callers, found by an attack on three nodes with asyncio)."""
    run = drive(
        plans.acquire_plan(state, fake_nodes(3), NAME, 5.0, waiter="w1", mark_ms=700),
        [
            answer(ACQUIRE, granted(10), granted(12), busy(12, 400)),
            answer(RAISE, [13], None, None),
            answer(RAISE, [17], [17], None),
            answer(RAISE, [23], 1, None),
            answer(RELEASE, 1, 1, None),
        ],
    )
    assert isinstance(run.result, AcquireFailure) and run.result.raced
    given_back = run.requests[4]
    assert given_back.wait and given_back.timeout == state.node_timeout
    assert given_back.unanswered is not None  # a node that fails it is still owed
    assert [release_args(run.calls(4)[i])[2] for i in (0, 1)] == [0, 0]


@pytest.mark.parametrize("third", ["timed out", "untrusted"])
def test_permit_split_among_answering_nodes_is_busy_not_unavailable(
    state: AliasState, third: str
) -> None:
    """Two nodes granted different slots (callers raced) and the third did not vote: a quorum
    of nodes answered, so the name is contended ("busy", retried within a timeout), not
    "unavailable". It said "only 2 of 3 Redis nodes could vote, 2 needed" (found by an
    attack, with the third node quarantined)."""
    replies = [permit(7, 1), permit(7, 2), TIMED_OUT if third == "timed out" else UNTRUSTED]
    steps = [answer(PERMIT, *replies)]
    if third == "untrusted":  # a quorum granted: it looks whether the node may rejoin (not yet)
        steps.append(answer(PROBE, probe("r0", 7), probe("r1", 7), probe("old", 5)))
    steps.append(fire(RELEASE_PERMIT, to=[0, 1] if third == "untrusted" else [0, 1, 2]))
    run = drive(plans.acquire_plan(state, fake_nodes(3), NAME, 5.0, permits=3), steps)
    assert run.result.reason == "busy"
    assert run.result.answered == 2


def test_permit_on_silent_nodes_releases_whichever_slot_has_its_owner(
    state: AliasState,
) -> None:
    """No answer in time: each node may have granted any slot, so each gets RELEASE_PERMIT
    with every slot's key (it deletes only the one holding this attempt's owner)."""
    run = drive(
        plans.acquire_plan(state, fake_nodes(3), NAME, 5.0, permits=2),
        [
            answer(PERMIT, TIMED_OUT, TIMED_OUT, TIMED_OUT),
            fire(RELEASE_PERMIT, to=[0, 1, 2]),
        ],
    )
    assert run.result.reason == "unavailable"
    assert [len(c.keys) for c in run.calls(1)] == [3 + 2] * 3


@pytest.mark.parametrize(
    ("replies", "queues"),
    [((2, 2, 1), True), ((2, 1, 1), False), ((2, 1, TIMED_OUT), False)],
    ids=["quorum-full", "one-full", "one-full-one-silent"],
)
def test_a_permit_releaser_queues_only_when_a_quorum_has_no_slot_for_it(
    state: AliasState, replies: tuple[Any, ...], queues: bool
) -> None:
    """A permit's release answers 2 on a node whose free slots all go to woken waiters:
    its releaser queues at once only when a quorum said so, else it tries for a free slot
    (how a semaphore below its permits fills up again). Every slot goes with the release,
    the permit's own first."""
    slots = tuple(f"t:__permit__:{k}:job" for k in range(3))
    lease = lease_for()
    lease.key, lease.slots, lease.voters = slots[1], slots, (0, 1, 2)
    lease.marker, lease.kind = "t:job", PERMIT_KIND
    run = drive(plans.release_plan(state, fake_nodes(3), lease), [answer(RELEASE_PERMIT, *replies)])
    assert lease.handed_off is queues
    assert run.calls(0)[0].keys[3:] == (slots[1], slots[0], slots[2])
    assert run.calls(0)[0].args[2] == PERMIT_HANDOFF_MS


def test_other_kind_is_its_own_failure(state: AliasState) -> None:
    run = drive(
        plans.acquire_plan(state, fake_nodes(3), NAME, 5.0),
        [answer(ACQUIRE, [-2, 5, 0], [-2, 5, 0], busy(5, 100))],
    )
    assert run.result.reason == "other_kind"


# -- lock_many ----------------------------------------------------------------------------
ACQUIRE_MANY = primitive_scripts.ACQUIRE_MANY
_many = sys.modules["django_redlock.engine.plans.many"]


def test_many_tokens_follow_the_highest_first_token_and_laggards_raise_every_key(
    state: AliasState,
) -> None:
    """Names get first, first + 1, ... of the highest winner; a lagging winner is raised to
    the set's last token, and RAISE checks every key of the set."""
    run = drive(
        _many.acquire_many_plan(state, fake_nodes(3), ["a", "b", "c"], 5.0),
        [
            answer(ACQUIRE_MANY, [1, 10, 0], [1, 20, 0], [0, 22, 300, 2]),
            answer(RAISE, 1, None, None),
        ],
    )
    assert [r.token for r in run.result] == [20, 21, 22]
    assert [r.key for r in run.result] == ["t:a", "t:b", "t:c"]
    assert len({r.owner for r in run.result}) == 1
    call = run.calls(1)[0]
    assert call.keys == ("t:__fence__", "t:a", "t:b", "t:c")
    assert call.args[:2] == (20, 22)  # strictly: none of the set's tokens handed out there


def test_a_set_give_back_that_did_not_reach_its_node_is_owed(state: AliasState) -> None:
    """Node 0 granted the set, the others refused it; the give-back of each name to node 0
    could not be sent (its connection broke, as an interrupt mid-call leaves it): each name
    is owed to node 0, to be given back from the background (it stayed there for its TTL)."""
    plan = _many.acquire_many_plan(state, fake_nodes(3), ["a", "b"], 5.0)
    give_backs_unsent(plan, [[1, 10, 0], [0, 10, 300, 2], [0, 10, 300, 2]], 0)
    assert [(r.name, r.key, r.reached, r.kind) for r in state.owed] == [
        ("a", "t:a", (True, False, False), ""),
        ("b", "t:b", (True, False, False), ""),
    ]


def test_many_failure_names_the_busy_name_and_gives_back_every_grant(
    state: AliasState,
) -> None:
    run = drive(
        _many.acquire_many_plan(state, fake_nodes(3), ["a", "b", "c"], 5.0),
        [
            answer(ACQUIRE_MANY, [1, 10, 0], [0, 10, 300, 3], [0, 10, 300, 3]),
            fire(RELEASE, to=[0]),
            fire(RELEASE, to=[0]),
            fire(RELEASE, to=[0]),
        ],
    )
    assert run.result.reason == "busy"
    assert run.result.busy_name == "c"
    assert [run.calls(i)[0].keys[0] for i in (1, 2, 3)] == ["t:a", "t:b", "t:c"]


def test_many_given_up_mid_attempt_withdraws_the_waiter_from_every_name(
    state: AliasState,
) -> None:
    """A lock_many caller cancelled with its attempt in flight gives back every name, then
    stops counting as a waiter of any name of the set, on every node."""
    plan = _many.acquire_many_plan(state, fake_nodes(3), ["a", "b"], 5.0, waiter="w1")
    next(plan)
    request = plan.throw(Abandoned())
    while request.calls[0] is not None and request.calls[0].script is RELEASE:
        request = plan.send([None] * 3)
    keys = ("t:__waiters__:a", "t:__handoff__:a", "t:__waiters__:b", "t:__handoff__:b")
    assert _withdraws(request, keys, "w1") == [0, 1, 2]
    with pytest.raises(Abandoned):
        plan.send([None] * 3)


def test_many_finding_another_kind_withdraws_the_waiter_where_busy(
    state: AliasState,
) -> None:
    """A name of the set is another kind's on one node: the caller will not wait, so the
    nodes that said "busy" (and registered it) get a WITHDRAW for the set's names."""
    run = drive(
        _many.acquire_many_plan(state, fake_nodes(3), ["a", "b"], 5.0, waiter="w1"),
        [
            answer(ACQUIRE_MANY, [0, 10, 300, 1], [-2, 10, 0, 2], [0, 10, 300, 1]),
            fire(scripts.WITHDRAW, to=[0, 2]),
        ],
    )
    assert run.result.reason == "other_kind"
    assert _withdraws(
        run.requests[1],
        ("t:__waiters__:a", "t:__handoff__:a", "t:__waiters__:b", "t:__handoff__:b"),
        "w1",
    ) == [0, 2]


def test_release_many_is_one_call_per_node_and_judges_each_lease(
    state: AliasState,
) -> None:
    """A set's release sends one RELEASE_MANY per node with every name's keys; a name that a
    majority says is not ours any more is reported not held, the others held."""
    run = drive(
        _many.acquire_many_plan(state, fake_nodes(3), ["a", "b"], 5.0),
        [answer(ACQUIRE_MANY, [1, 10, 0], [1, 10, 0], [1, 10, 0])],
    )
    records = run.result
    lease_plans = sys.modules["django_redlock.engine.plans.lease"]
    release = drive(
        lease_plans.release_many_plan(state, fake_nodes(3), records),
        [answer(primitive_scripts.RELEASE_MANY, [1, 0], [1, 0], [2, 1])],
    )
    assert release.result == [True, False]
    call = release.calls(0)[0]
    assert call.keys[0::4] == ("t:a", "t:b")
    assert records[0].handed_off and not records[1].handed_off
    assert all(record.released for record in records)


# -- quorum first (FAN_OUT "quorum") -----------------------------------------------------


@pytest.fixture
def qstate() -> AliasState:
    return AliasState(
        prefix="t:", node_timeout=0.05, drift_factor=0.01, ttl=5.0, host="h", pid=7,
        quorum_first=True,
    )  # fmt: skip


WAKE5 = wake_node(NAME, 5)
FIRST5 = [(WAKE5 + k) % 5 for k in range(3)]
REST5 = [i for i in range(5) if i not in FIRST5]


def _per_node(values: dict[int, Any], count: int = 5) -> list[Any]:
    return [values.get(i) for i in range(count)]


def test_quorum_first_asks_the_wake_node_and_the_next_ones_only(qstate: AliasState) -> None:
    """Three grants from the three nodes asked first win: one request, the other two nodes
    never asked, and the lease reaches only the three (its renewals and release go there)."""
    run = drive(
        plans.acquire_plan(qstate, fake_nodes(5), NAME, 5.0),
        [answer(ACQUIRE, *_per_node({i: granted(9) for i in FIRST5}))],
    )
    assert run.sent_to(0) == sorted(FIRST5)
    assert run.result.token == 9
    assert run.result.reached == tuple(i in FIRST5 for i in range(5))


def test_quorum_first_asks_the_rest_when_the_first_did_not_win(qstate: AliasState) -> None:
    """One of the first three says busy: the request is not settled (a "no" is not the end
    while the rest may make a quorum), so once the first three answered the hedge goes to the
    other two, in the same request; three grants win, the token is the highest counter among
    them (the laggards are raised to it), and the busy node is not reached."""
    first = {FIRST5[0]: granted(9), FIRST5[1]: granted(9), FIRST5[2]: busy(9, 300)}
    rest = {REST5[1]: granted(11), REST5[0]: granted(7)}
    run = drive(
        plans.acquire_plan(qstate, fake_nodes(5), NAME, 5.0),
        [
            answer(ACQUIRE, *_per_node({**first, **rest}), order=[FIRST5[2], *FIRST5[:2], *rest]),
            answer(RAISE, *_per_node({i: scripts.STILL_HELD for i in FIRST5[:2]})),
        ],
    )
    assert run.sent_to(0) == sorted(FIRST5) and run.hedged_to(0) == REST5
    assert run.settled_after[0] == 4  # three grants: the last hedge node is not awaited
    assert run.result.token == 11
    assert run.result.reached == tuple(i != FIRST5[2] for i in range(5))


def test_quorum_first_hedges_around_a_slow_first_node(qstate: AliasState) -> None:
    """A first node does not answer in time: the hedge asks the other two and the slow
    node's reply still counts when it comes (the quorum here needs it: one of the hedge
    nodes says busy). The lease reaches the four that granted."""
    slow = FIRST5[1]
    replies = {
        FIRST5[0]: granted(9),
        FIRST5[2]: granted(9),
        REST5[0]: busy(9, 300),
        REST5[1]: TIMED_OUT,
        slow: granted(9),
    }
    run = drive(
        plans.acquire_plan(qstate, fake_nodes(5), NAME, 5.0),
        [answer(ACQUIRE, *_per_node(replies), order=[FIRST5[0], FIRST5[2], *REST5, slow])],
    )
    assert run.hedged_to(0) == REST5
    assert run.result.token == 9
    assert run.result.reached == tuple(i in (*FIRST5, REST5[1]) for i in range(5))


def test_hedge_delay_follows_the_round_trips_within_bounds(qstate: AliasState) -> None:
    """The hedge waits about two usual round trips: at least HEDGE_MIN, at most NODE_TIMEOUT."""
    for _ in range(100):
        qstate.saw_round_trip(0.002)
    assert qstate.hedge_delay() == pytest.approx(0.004, rel=0.01)
    for _ in range(200):
        qstate.saw_round_trip(0.00001)
    assert qstate.hedge_delay() == HEDGE_MIN
    for _ in range(200):
        qstate.saw_round_trip(1.0)
    assert qstate.hedge_delay() == qstate.node_timeout


def test_a_hedged_round_counts_as_the_hedge_delay(qstate: AliasState, clock: Clock) -> None:
    """A round that needed the hedge counts as one that took the hedge delay, not its whole
    wait (a paused node's 200 ms would inflate the average); one that did not, as it took."""
    qstate.round_trip = 0.001  # hedge delay 2 ms
    slow = {**{i: granted(9) for i in (FIRST5[0], *REST5)}, FIRST5[1]: TIMED_OUT}
    slow[FIRST5[2]] = TIMED_OUT
    drive(
        plans.acquire_plan(qstate, fake_nodes(5), NAME, 5.0),
        [answer(ACQUIRE, *_per_node(slow), elapsed=0.2)],
        clock,
    )
    assert qstate.round_trip == pytest.approx(0.001 + 0.1 * (0.002 - 0.001))
    before = qstate.round_trip
    drive(
        plans.acquire_plan(qstate, fake_nodes(5), "other", 5.0),
        [answer(ACQUIRE, *_per_node({i: granted(9) for i in _first("other")}), elapsed=0.0005)],
        clock,
    )
    assert qstate.round_trip == pytest.approx(before + 0.1 * (0.0005 - before))


def _first(name: str) -> list[int]:
    wake = wake_node(name, 5)
    return [(wake + k) % 5 for k in range(3)]


def test_a_hedged_attempt_given_up_releases_on_every_node(qstate: AliasState) -> None:
    """Cancelled while the hedge may be out: the give-back goes to all five nodes."""
    plan = plans.acquire_plan(qstate, fake_nodes(5), NAME, 5.0)
    request = next(plan)
    assert request.later_nodes() == set(REST5)
    give_back = plan.throw(Abandoned())
    assert not give_back.wait
    assert [i for i, c in enumerate(give_back.calls) if c is not None] == list(range(5))


def test_quorum_first_does_not_ask_the_rest_when_they_cannot_win(
    qstate: AliasState,
) -> None:
    """All three asked first say busy: the other two could not make a quorum, so they are not
    asked; the failure is "busy" and names no node as failing."""
    run = drive(
        plans.acquire_plan(qstate, fake_nodes(5), NAME, 5.0, waiter="w"),
        [answer(ACQUIRE, *_per_node({i: busy(9, 300) for i in FIRST5}))],
    )
    assert len(run.requests) == 1
    assert run.result.reason == "busy" and run.result.errors == {}


def test_quorum_first_skips_nodes_down_or_behind(qstate: AliasState) -> None:
    """A node with a call still unanswered (paused) or down is skipped: the next healthy ones
    are asked instead; with fewer healthy nodes than a quorum, every node is asked."""
    nodes = fake_nodes(5)
    nodes[FIRST5[1]].behind = True
    next_one = (FIRST5[2] + 1) % 5
    assert plans.quorum_first(qstate, nodes, NAME) == [FIRST5[0], FIRST5[2], next_one]
    nodes = fake_nodes(5, down=FIRST5[:2])
    nodes[FIRST5[2]].behind = True
    assert plans.quorum_first(qstate, nodes, NAME) is None
    assert plans.quorum_first(qstate, fake_nodes(1), NAME) is None


def test_a_rejoin_check_whose_probes_went_unanswered_holds_nobody_back(
    state: AliasState, clock: Clock
) -> None:
    """Probes that too few nodes answered in time (a loaded client) tell nothing: the next
    caller of the process probes again at once. Such a check used to hold every other caller
    back for REJOIN_INTERVAL, so on a new cluster their first acquires failed "quarantined"."""
    nodes = fake_nodes(3)
    silent = [NodeFailure("timed out")] * 2 + [probe("", 0, 0, 0)]
    assert drive(rejoin_plan(state, nodes, (0, 1, 2)), [answer(PROBE, *silent)]).result is False
    assert state.next_rejoin_check == 0.0
    fresh = [probe("", 0, 0, 0)] * 3
    again = drive(
        rejoin_plan(state, nodes, (0, 1, 2)),
        [answer(PROBE, *fresh), answer(REJOIN, FLOOR, FLOOR, FLOOR)],
    )
    assert again.result is True


# -- late answers to a release -----------------------------------------------------------


@pytest.mark.parametrize("voter", [False, True], ids=["never-answered", "voter"])
def test_a_late_not_yours_from_a_node_that_never_answered_the_acquire_is_rechecked(
    voter: bool,
) -> None:
    """A release's answer read late (the next call on its connection) settles its node. A
    "not yours" from a node that never answered the acquire is looked at once more later, as
    a timely one is: the acquire, on another connection, may still run there after the
    release (a paused node that resumed ran a read lease's release before its acquire and
    kept the reader for its TTL: found by an attack). A voter's "not yours" needs no look."""
    from django_redlock.engine.plans import lease as lease_plans
    from django_redlock.engine.replies import Slot

    voters = (0, 1, 2) if voter else (0, 1)
    record = LeaseRecord(NAME, NAME, "o", ttl=5.0, reached=(True,) * 3, voters=voters)
    late = Slot(None)
    late.fill(scripts.NOT_HELD)
    record.unsure, record.late = (2,), {2: late}
    lease_plans.late_answers(record)
    assert record.unsure == ()
    assert (2 in record.recheck) is not voter
