"""The retry and renewal policies (engine/policy.py) driven with scripted outcomes: no Redis.

The real drivers (``Engine.acquire``/``aacquire``, the lease's renewal thread and task) are
covered against real nodes in test_engine.py; these tests pin the decisions themselves.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from django_redlock.engine import policy, state
from django_redlock.engine.policy import (
    HANDOFF_RETRIES,
    HANDOFF_RETRY,
    Attempt,
    AwaitRelease,
    Pause,
    Renew,
    RenewalBound,
    Stepper,
    acquire_policy,
    renewal_policy,
)
from django_redlock.engine.state import (
    LOST,
    RENEWED,
    UNCONFIRMED,
    AcquireFailure,
    LeaseRecord,
)


@pytest.fixture(autouse=True)
def _session_redlock() -> Iterator[None]:
    """These tests start no redis-server (overrides the suite's session fixture)."""
    yield


class Clock:
    """A fake ``time`` module for the policy: ``monotonic()`` moves only when told."""

    def __init__(self) -> None:
        self.now = 1000.0

    def monotonic(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    fake = Clock()
    monkeypatch.setattr(policy, "time", fake)
    monkeypatch.setattr(state, "time", fake)  # LeaseRecord.validity()
    monkeypatch.setattr(policy.random, "uniform", lambda low, high: high)
    return fake


BUSY = AcquireFailure("busy", 0, 1, {}, retry_after=5.0)


def won(ttl: float = 10.0) -> LeaseRecord:
    return LeaseRecord("n", "k", "owner", token=7, ttl=ttl, deadline=2000.0)


def steps_of(run: Stepper[Any], replies: list[Any], clock: Clock | None = None) -> list[Any]:
    """Answer each step with the next reply; pauses and waits advance ``clock``."""
    seen = []
    for reply in replies:
        seen.append(run.step)
        if clock is not None and isinstance(run.step, Pause | AwaitRelease):
            clock.now += run.step.seconds
        run.send(reply)
    return seen


def test_timeout_zero_makes_exactly_one_attempt(clock: Clock) -> None:
    """timeout=0: one attempt, and its failure is the result (no waiting at all)."""
    run = Stepper(acquire_policy(0.2, 0))
    assert run.step == Attempt(woken=False)
    run.send(BUSY)
    assert run.step is None and run.result is BUSY


@pytest.mark.parametrize("timeout", [0, 10.0])
def test_a_permit_whose_token_lost_a_race_is_tried_again_at_once(
    clock: Clock, timeout: float
) -> None:
    """A raced permit (nobody holds the name) is tried again at once, without a wait, up to
    RACED_RETRIES times, with timeout=0 too; then timeout=0 gives up, a timeout waits,
    registering first (a raced attempt's give-back registers nobody: it was to try again at
    once, so a release would otherwise not wake it)."""
    raced = AcquireFailure("busy", 2, 3, {}, raced=True)
    run = Stepper(acquire_policy(0.2, timeout))
    seen = steps_of(run, [raced] * (policy.RACED_RETRIES + 1), clock)
    assert seen == [Attempt(False)] * (policy.RACED_RETRIES + 1)
    if timeout == 0:
        assert run.step is None and run.result is raced
    else:
        assert isinstance(run.step, AwaitRelease) and run.step.mark
    run = Stepper(acquire_policy(0.2, 0))
    assert steps_of(run, [raced, won()], clock) == [Attempt(False)] * 2
    assert isinstance(run.result, LeaseRecord)


def test_busy_waits_for_a_release_with_growing_backoff(clock: Clock) -> None:
    """A busy name is waited for (BLPOP), each wait one backoff step longer, until it is won."""
    run = Stepper(acquire_policy(0.2, 10.0))
    seen = steps_of(run, [BUSY, False, BUSY, False, won()], clock)
    assert seen == [
        Attempt(False),
        AwaitRelease(0.2),
        Attempt(False),
        AwaitRelease(0.4),
        Attempt(False),
    ]
    assert run.step is None and isinstance(run.result, LeaseRecord)


def test_wait_never_outlasts_the_holders_ttl_or_the_timeout(clock: Clock) -> None:
    """A wait is capped by the holder's remaining TTL (+1 ms) and by what is left of timeout."""
    short = AcquireFailure("busy", 0, 1, {}, retry_after=0.05)
    run = Stepper(acquire_policy(1.0, 10.0))
    assert steps_of(run, [short], clock)[-1] == Attempt(False)
    assert run.step == AwaitRelease(pytest.approx(0.051))
    run = Stepper(acquire_policy(1.0, 0.3))
    run.send(BUSY)
    assert run.step == AwaitRelease(pytest.approx(0.3))


def test_gives_up_when_the_timeout_is_used_up(clock: Clock) -> None:
    """Once the deadline has passed, the last failure is the result."""
    run = Stepper(acquire_policy(0.25, 0.75))
    seen = steps_of(run, [BUSY, False, BUSY, False, BUSY], clock)
    assert [s.seconds for s in seen if isinstance(s, AwaitRelease)] == [0.25, 0.5]
    assert run.step is None and run.result is BUSY


#: a woken waiter's attempt that some node granted: the release has not reached the others yet
PARTLY = AcquireFailure("busy", 1, 3, {}, retry_after=5.0)


def test_woken_waiter_retries_quickly_then_waits_again(clock: Clock) -> None:
    """A woken waiter that still finds the name busy on some nodes (granted on others: the
    release has not reached them yet) retries every HANDOFF_RETRY, at most HANDOFF_RETRIES
    times, passing woken=True each time; then it queues again."""
    run = Stepper(acquire_policy(0.2, 10.0))
    steps_of(run, [BUSY, True], clock)
    quick = steps_of(run, [PARTLY, None] * HANDOFF_RETRIES, clock)
    assert quick[0::2] == [Attempt(woken=True)] * HANDOFF_RETRIES
    assert quick[1::2] == [Pause(HANDOFF_RETRY)] * HANDOFF_RETRIES
    assert run.step == Attempt(woken=True)
    run.send(PARTLY)
    assert isinstance(run.step, AwaitRelease)


def test_a_woken_waiter_that_no_node_granted_waits_again_at_once(clock: Clock) -> None:
    """The node a waiter blocks on wakes it only after the release ran there: a woken attempt
    that no node granted lost the name to another caller, who holds it now, so it waits for
    the next release instead of retrying quickly. (Before, it retried ten times, every
    0.5 ms; with eight processes handing one name on five nodes such retries reached 7
    attempts per section, and a loser could take the next reservation ahead of the waiter
    the next release woke.)"""
    run = Stepper(acquire_policy(0.2, 10.0))
    steps_of(run, [BUSY, True], clock)
    assert run.step == Attempt(woken=True)
    run.send(BUSY)
    assert isinstance(run.step, AwaitRelease)
    run.send(True)  # the next release woke it
    assert run.step == Attempt(woken=True)
    run.send(PARTLY)  # granted somewhere: the quick retries are for this
    assert run.step == Pause(HANDOFF_RETRY)


@pytest.mark.parametrize("timeout", [10.0, None])
def test_a_kind_conflict_ends_the_wait_at_once(clock: Clock, timeout: float | None) -> None:
    """An attempt that finds the name taken as another kind is the last, whatever the
    timeout: no wait ends that conflict. So is a first attempt the driver already made."""
    other = AcquireFailure("other_kind", 0, 1, {})
    run = Stepper(acquire_policy(0.2, timeout))
    assert run.step == Attempt(False)
    run.send(other)
    assert run.step is None and run.result is other
    run = Stepper(acquire_policy(0.2, timeout, first=other))
    assert run.step is None and run.result is other
    run = Stepper(acquire_policy(0.2, timeout))  # busy at first, then another kind
    steps_of(run, [BUSY, False], clock)
    assert run.step == Attempt(False)
    run.send(other)
    assert run.step is None and run.result is other
    run = Stepper(acquire_policy(0.2, timeout, queue_first=True))
    steps_of(run, [True], clock)
    run.send(other)
    assert run.step is None and run.result is other


def test_queue_first_waits_before_the_first_attempt(clock: Clock) -> None:
    """queue_first: the caller marks the name and waits in line before any attempt."""
    run = Stepper(acquire_policy(0.2, 10.0, queue_first=True))
    assert run.step == AwaitRelease(0.2, mark=True)
    run.send(True)
    assert run.step == Attempt(woken=True)


def test_registration_lives_wait_mark_ms_or_until_the_callers_deadline(clock: Clock) -> None:
    """A waiter is registered for WAIT_MARK_MS (at most 1 s: a dead waiter stops counting
    within 1 s), for less when its timeout ends sooner (one that gives up stops counting then)
    and not at all once its deadline has passed. One wait always ends within a registration."""
    assert policy.registration_ms(None) == state.WAIT_MARK_MS <= 1000
    assert policy.registration_ms(clock.now + 10.0) == state.WAIT_MARK_MS
    assert policy.registration_ms(clock.now + 0.25) == 250
    assert policy.registration_ms(clock.now) == 0
    assert policy.registration_ms(clock.now - 1.0) == 0
    assert policy.MAX_BACKOFF * 1000 < state.WAIT_MARK_MS


def test_waits_forever_without_timeout(clock: Clock) -> None:
    """timeout=None: attempts go on however long it takes; backoff is capped at MAX_BACKOFF."""
    run = Stepper(acquire_policy(0.2, None))
    seen = steps_of(run, [BUSY, False] * 20, clock)
    waits = [s.seconds for s in seen if isinstance(s, AwaitRelease)]
    assert len(waits) == 20 and max(waits) == min(policy.MAX_BACKOFF, BUSY.retry_after + 0.001)
    assert run.step == Attempt(False)


def test_renewal_renews_every_third_of_the_ttl_until_a_renewal_finds_it_lost(
    clock: Clock,
) -> None:
    """Pause ttl/3, Renew, ... and the policy ends (None: already reported) on LOST."""
    run = Stepper(renewal_policy(won(ttl=9.0), RenewalBound(None)))
    seen = steps_of(run, [None, RENEWED, None, RENEWED, None, LOST], clock)
    assert seen == [Pause(3.0), Renew(), Pause(3.0), Renew(), Pause(3.0), Renew()]
    assert run.step is None and run.result is None


def test_unconfirmed_renewal_is_retried_until_the_validity_runs_out(clock: Clock) -> None:
    """A renewal that merely timed out is retried every tenth of the TTL (at most half the
    validity left) while the lease is valid; then the policy reports that it ran out."""
    lease = won(ttl=10.0)
    lease.deadline = clock.now + 5.0
    run = Stepper(renewal_policy(lease, RenewalBound(None)))
    seen = steps_of(run, [None, UNCONFIRMED, None, UNCONFIRMED, None, RENEWED], clock)
    assert seen[:3] == [Pause(pytest.approx(10 / 3)), Renew(), Pause(pytest.approx(5 / 6))]
    assert seen[3:] == [Renew(), Pause(pytest.approx(5 / 12)), Renew()]
    assert run.step == Pause(pytest.approx(10 / 3))  # renewed: back to the normal rhythm
    steps_of(run, [None], clock)
    assert run.step == Renew()
    lease.deadline = clock.now + 0.1
    assert steps_of(run, [UNCONFIRMED, None], clock) == [Renew(), Pause(pytest.approx(0.05))]
    clock.now = lease.deadline + 0.001
    run.send(UNCONFIRMED)
    assert run.step is None and run.result == "ran out"


def test_renewal_stops_at_max_hold_and_lets_the_lease_run_out(clock: Clock) -> None:
    """After max_hold the policy stops renewing, waits out the validity, returns "max_hold"."""
    lease = won(ttl=3.0)
    lease.deadline = clock.now + 100.0
    run = Stepper(renewal_policy(lease, RenewalBound(2.5)))
    seen = steps_of(run, [None, RENEWED, None, RENEWED, None], clock)
    assert seen[:4] == [Pause(1.0), Renew(), Pause(1.0), Renew()]
    assert seen[4] == Pause(1.0)
    assert isinstance(run.step, Pause) and run.step.seconds == pytest.approx(lease.validity())
    run.send(None)
    assert run.step is None and run.result == "max_hold"
