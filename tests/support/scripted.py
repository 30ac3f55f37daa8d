"""A scripted driver for the I/O-free plans of ``django_redlock.engine.plans``, no Redis.

``drive(plan, steps)`` runs a plan generator the way ``engine/core.py`` does, but answers each
yielded :class:`Request` from a script: one :class:`Step` per request, saying which Lua script
the calls must use, which nodes must get a call at all, and what every node answers. Every
request is recorded on the returned :class:`Run`, so a test can assert on the calls sent.

Conventions of a step's ``replies`` (one entry per node):

* ``None``: the plan must send this node *no* call; like the real driver, it gets
  ``NodeFailure("down: not connected", sent=False)``.
* anything else (a reply value or a :class:`NodeFailure`): the node must get a call and
  answers this.

:func:`fire` builds a step for a fire-and-forget request (``wait=False``), answered with
``None`` per node like ``Channel.execute`` does.
"""

from __future__ import annotations

import sys
import time as _time
from collections.abc import Generator, Iterable, Sequence
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

from django_redlock.engine.replies import NOT_ASKED, Call, NodeFailure, Request, Slot, result_of
from django_redlock.engine.scripts import Script

NOT_CONNECTED = NodeFailure("down: not connected", sent=False)
NOT_ASKED_FAILURE = NodeFailure(NOT_ASKED, sent=False)


@dataclass
class FakeNode:
    """A node as a plan sees it (the ``NodeView`` protocol); ``run_id=None`` = not connected."""

    label: str
    run_id: str | None = None
    up: float | None = 3600.0
    last_error: str = ""
    behind: bool = False
    tick: float = 0.1

    def uptime(self) -> float | None:
        return self.up


def fake_nodes(count: int, *, down: Iterable[int] = ()) -> list[FakeNode]:
    """``count`` connected nodes ``n0..`` with run ids ``r0..``; those in ``down`` are not."""
    off = set(down)
    return [FakeNode(f"n{i}", None if i in off else f"r{i}") for i in range(count)]


class Clock:
    """Stands in for the ``time`` module of the plans: it moves only when told to."""

    def __init__(self, monotonic: float = 1000.0, wall: float = 1_700_000_000.0) -> None:
        self.now = monotonic
        self.wall = wall

    def monotonic(self) -> float:
        return self.now

    def time(self) -> float:
        return self.wall

    def advance(self, seconds: float) -> None:
        self.now += seconds
        self.wall += seconds

    def modules(self) -> list[ModuleType]:
        """The engine modules whose ``time`` the plans read: every loaded module under
        ``django_redlock.engine`` that imports ``time`` (plans, lease plans, many plans,
        state, trust; the transports run no code in these tests)."""
        engine = [
            module
            for name, module in list(sys.modules.items())
            if name.startswith("django_redlock.engine") and module is not None
        ]
        return [m for m in engine if getattr(m, "time", None) is _time]


@dataclass(frozen=True)
class Step:
    """The expected request and its scripted answer."""

    script: Script
    replies: tuple[Any, ...] = ()
    wait: bool = True
    #: fire-and-forget steps: the nodes that must get a call
    to: frozenset[int] = frozenset()
    #: seconds the clock moves while this request runs
    elapsed: float = 0.0
    #: the order replies arrive in (node indexes); when given, ``settled`` is consulted after
    #: each and the nodes still silent when it says yes get ``NodeFailure(NOT_AWAITED)``
    order: tuple[int, ...] | None = None
    #: per node, the replies of the commands its call carried ahead (``Request.ahead``)
    ahead: dict[int, list[Any]] | None = None

    def expected_targets(self, count: int) -> set[int]:
        if not self.wait:
            return set(self.to)
        return {i for i in range(count) if self.replies[i] is not None}


def answer(
    script: Script,
    *replies: Any,
    elapsed: float = 0.0,
    order: Sequence[int] | None = None,
    ahead: dict[int, list[Any]] | None = None,
) -> Step:
    """A request the plan waits on; ``replies``: one per node (``None`` = no call expected);
    ``ahead``: per node, the replies of the commands its call carried ahead of it."""
    return Step(
        script,
        replies,
        elapsed=elapsed,
        order=None if order is None else tuple(order),
        ahead=ahead,
    )


def fire(script: Script, to: Iterable[int]) -> Step:
    """A fire-and-forget request (``wait=False``) that must reach exactly the nodes ``to``."""
    return Step(script, wait=False, to=frozenset(to))


@dataclass
class Run:
    """What a plan did: its result, every request it yielded and the replies it got."""

    result: Any
    requests: list[Request] = field(default_factory=list)
    replies: list[list[Any]] = field(default_factory=list)
    #: per request: how many replies had arrived when ``settled`` said yes (ordered steps)
    settled_after: list[int | None] = field(default_factory=list)

    def calls(self, index: int) -> list[Call | None]:
        return self.requests[index].calls

    def sent_to(self, index: int) -> list[int]:
        """The nodes request ``index`` sent a call to first (not its hedge)."""
        return [i for i, call in enumerate(self.calls(index)) if call is not None]

    def hedged_to(self, index: int) -> list[int]:
        """The nodes request ``index``'s hedge went to (those answered: never ``NOT_ASKED``)."""
        hedge = self.requests[index].later_nodes()
        return [i for i in sorted(hedge) if self.replies[index][i] != NOT_ASKED_FAILURE]

    def scripts(self) -> list[str]:
        """The script name of every request, in order."""
        return [next(c.script.name for c in r.calls if c is not None) for r in self.requests]


def describe(request: Request) -> str:
    calls = ", ".join("-" if c is None else c.script.name for c in request.calls)
    return f"[{calls}] wait={request.wait} timeout={request.timeout}"


def drive(
    plan: Generator[Request, list[Any], Any],
    steps: Sequence[Step],
    clock: Clock | None = None,
) -> Run:
    """Run ``plan`` to its end against ``steps``; fails on any request the script did not
    foresee (wrong script, wrong nodes, wait flag) and on a plan that ends too early."""
    run = Run(None)
    try:
        request = next(plan)
        while True:
            index = len(run.requests)
            if index >= len(steps):
                raise AssertionError(f"unexpected request #{index}: {describe(request)}")
            if steps[index].elapsed and clock is None:
                raise AssertionError(f"step #{index} has elapsed time but drive() got no clock")
            run.requests.append(request)
            replies, after = _answer(index, request, steps[index])
            run.replies.append(replies)
            run.settled_after.append(after)
            if clock is not None and steps[index].elapsed:
                clock.advance(steps[index].elapsed)
            request = plan.send(replies)
    except StopIteration as stop:
        run.result = stop.value
    if len(run.requests) != len(steps):
        done = [describe(r) for r in run.requests]
        raise AssertionError(f"plan ended after {len(done)} of {len(steps)} steps: {done}")
    return run


def _answer(index: int, request: Request, step: Step) -> tuple[list[Any], int | None]:
    count = len(request.calls)
    where = f"request #{index} {describe(request)}"
    if request.wait != step.wait:
        raise AssertionError(f"{where}: expected wait={step.wait}")
    if step.wait and len(step.replies) != count:
        raise AssertionError(f"{where}: script has {len(step.replies)} replies for {count} nodes")
    sent = {i for i, call in enumerate(request.calls) if call is not None}
    hedge = request.later_nodes()
    expected = step.expected_targets(count)
    if sent - expected or expected - sent - hedge:
        raise AssertionError(f"{where}: calls went to {sorted(sent)}, expected {sorted(expected)}")
    wrong = [
        i
        for i in sent | (hedge & expected)
        if (request.calls[i] or (request.later or [])[i]).script is not step.script  # type: ignore[union-attr]
    ]
    if wrong:
        raise AssertionError(f"{where}: nodes {wrong} do not call {step.script.name}")
    if not step.wait:
        return [None] * count, None
    carried = {i for i, call in enumerate(request.calls) if call is not None and call.before}
    if carried != set(step.ahead or ()):
        raise AssertionError(f"{where}: nodes {sorted(carried)} carry commands ahead")
    for i, replies in (step.ahead or {}).items():
        before = request.calls[i].before  # type: ignore[union-attr]
        if len(replies) != len(before):
            raise AssertionError(f"{where}: {len(replies)} replies for {len(before)} commands")
    request.ahead = step.ahead
    slots = [Slot(call) for call in request.calls]
    for i in range(count):
        if request.calls[i] is None and i not in hedge:
            slots[i].fill(NOT_CONNECTED)
    after: int | None = None

    def settled() -> bool:
        return request.settled is not None and request.settled(slots)

    def answer(i: int) -> None:
        if i in hedge and slots[i].call is None:  # the hedge goes out, to all its nodes
            for k in hedge:
                slots[k] = Slot(request.later[k])  # type: ignore[index]
        slots[i].fill(step.replies[i])

    if step.order is None:  # every first call answers; then the hedge, if still unsettled
        for i in sorted(sent):
            answer(i)
        if not settled():
            for i in sorted(expected - sent):
                answer(i)
            missing = sorted(hedge - expected)
            if missing and not settled():
                raise AssertionError(f"{where}: the hedge went to {missing}: script no reply")
    else:
        if set(step.order) != expected:
            raise AssertionError(f"{where}: order {step.order} must list {sorted(expected)}")
        for arrived, i in enumerate(step.order, 1):
            answer(i)
            if settled():
                after = arrived
                break
    return [result_of(slot, expired=after is None) for slot in slots], after


def slots(*values: Any) -> list[Slot]:
    """Slots for a ``settled`` test: ``PENDING`` = no answer yet, anything else = answered."""
    made = []
    for value in values:
        slot = Slot(None)
        if value is not PENDING:
            slot.fill(value)
        made.append(slot)
    return made


class _Pending:
    def __repr__(self) -> str:
        return "PENDING"


PENDING: Any = _Pending()


def give_backs_unsent(
    plan: Generator[Request, list[Any], Any], replies: list[Any], node: int
) -> None:
    """Run ``plan``'s first round with ``replies``, then its fire-and-forget give-backs, each
    of which could not be sent to ``node`` (its ``unanswered`` is called, as the transport
    does for a broken connection) and got no reply anywhere."""
    next(plan)
    request = plan.send(replies)
    while True:
        assert not request.wait and request.unanswered is not None
        request.unanswered(node)
        try:
            request = plan.send([None] * len(replies))
        except StopIteration:
            return
