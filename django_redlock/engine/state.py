"""What the plans know and keep: one alias's settings and learned facts, one lease's record,
one failed attempt, and the view of a node's connection that plans may read."""

from __future__ import annotations

import math
import os
import socket
import time
from collections.abc import Generator
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

from . import handoff, scripts
from .keyspace import Keyspace
from .kinds import KINDS
from .replies import Call, Request

T_co = TypeVar("T_co", covariant=True)

#: A plan: yields :class:`~.replies.Request` objects, receives one reply per node for each,
#: and returns its result (``T_co``).
Plan = Generator[Request, list[Any], T_co]

#: The fixed part of the clock-drift allowance, seconds.
DRIFT_ALLOWANCE = 0.002


def drift_allowance(ttl: float, drift_factor: float) -> float:
    """How much of a ``ttl``-second lease the clock-drift allowance takes: ``TTL *
    DRIFT_FACTOR + 2 ms`` (a lease is valid for ``TTL`` minus this, minus the round trip)."""
    return ttl * drift_factor + DRIFT_ALLOWANCE


#: How long a wake-up left by a release waits for a waiter to take it, in ms.
WAKE_TTL_MS = 2000
#: A failed attempt of a caller that will wait registers it as a waiter for this long (ms), or
#: until the caller's timeout if that comes sooner; each later attempt renews it. Longer than
#: the longest single wait (``policy.MAX_BACKOFF``), so a blocked waiter is always covered, and
#: at most 1 s, so a waiter that died stops counting within 1 s (docs/production.md).
WAIT_MARK_MS = 1000
#: Quorum-first (``FAN_OUT = "quorum"``): the other nodes are asked once the first quorum has
#: not settled after this many of its usual round trips (a moving average), and never
#: sooner than :data:`HEDGE_MIN` seconds (never later than ``NODE_TIMEOUT``).
HEDGE_ROUND_TRIPS = 2.0
HEDGE_MIN = 0.0005
#: Weight of the newest round trip in that moving average.
ROUND_TRIP_WEIGHT = 0.1


class NodeView(Protocol):
    """What a plan may know about one node's connection."""

    label: str

    @property
    def run_id(self) -> str | None: ...

    def uptime(self) -> float | None: ...

    @property
    def last_error(self) -> str: ...

    @property
    def behind(self) -> bool:
        """True while a call sent to the node has no reply yet (slow, paused)."""
        ...

    @property
    def tick(self) -> float:
        """How late the node may answer a blocking command that timed out, seconds: it ends
        such waits on its next cycle (``1 / hz``)."""
        ...


@dataclass
class AliasState:
    """One alias's settings, and what its plans learn and share across calls."""

    prefix: str
    node_timeout: float
    drift_factor: float
    ttl: float
    #: base of the backoff between attempts, seconds
    retry_delay: float = 0.2
    #: how long a sync call may spin for replies before it sleeps in poll(), seconds
    busy_poll: float = 0.0
    #: ask a quorum of nodes first, the others only when that did not win (``FAN_OUT``)
    quorum_first: bool = False
    host: str = field(default_factory=socket.gethostname)
    pid: int = field(default_factory=os.getpid)
    longest_ttl_ms: int = 0
    next_rejoin_check: float = 0.0
    #: the labels of the nodes the last rejoin check left untrusted: until next_rejoin_check,
    #: a caller that found only these untrusted does not probe again
    held_back: frozenset[str] = frozenset()
    #: (node label, run_id) -> when this process first saw that incarnation untrusted
    untrusted_seen: dict[tuple[str, str], float] = field(default_factory=dict)
    #: moving average of how long a quorum-first round took, seconds
    round_trip: float = 0.001
    #: give-backs a plan could not send (their node's connection had broken): records of
    #: the grants to release, for the engine to send again (see ``giveback``)
    owed: list[LeaseRecord] = field(default_factory=list)
    #: the alias's straggler give-back thread, started on first use (``giveback``)
    stragglers: Any = field(default=None, repr=False, compare=False)
    #: set when the engine is closed: its background give-backs stop
    closed: bool = False
    keys: Keyspace = field(init=False)

    def __post_init__(self) -> None:
        self.keys = Keyspace(self.prefix)
        self.longest_ttl_ms = max(self.longest_ttl_ms, math.ceil(self.ttl * 1000))

    def release_call(
        self,
        name: str,
        owner: str,
        *,
        wakes: bool,
        mark_ms: int = 0,
        waiter: str = "",
        held: tuple[str, ...] = (),
        kind: str = "",
        slots: tuple[str, ...] = (),
    ) -> Call:
        """Compare-and-delete ``name`` for ``owner``; ``wakes`` on the node waiters block on;
        ``mark_ms`` > 0 for a failed attempt that will wait: it registers ``waiter`` for that
        long, as its ACQUIRE would have. ``kind``: the lease's (:attr:`LeaseRecord.kind`).
        ``held``: the keys the lease may hold instead of the name's own (a permit: its slot,
        or every slot when which one is unknown); ``slots``: a permit's semaphore's slots (its
        release counts the free ones: see ``RELEASE_LUA`` in :mod:`.scripts.fragments`;
        ignored for the other kinds)."""
        keys = self.keys
        spec = KINDS[kind]
        queue = (keys.waiters(name), keys.wake(name), keys.handoff(name))
        touched = spec.release_keys(keys, name, held, slots, queue)
        args = (owner, WAKE_TTL_MS, spec.handoff_ms, "1" if wakes else "0", mark_ms)
        return Call(spec.release, touched, (*args, waiter if mark_ms else "", spec.wakes))

    def mark_command(self, name: str, waiter: str, mark_ms: int) -> tuple[str | int, ...]:
        """The command registering ``waiter`` for ``mark_ms``, for a caller that queues
        without a failed attempt (which registers it otherwise). Sent with the ``BLPOP`` on the
        wake-up connection, which loads no scripts: hence ``EVAL``, cached by the server."""
        keys = self.keys
        return (
            "EVAL",
            scripts.REGISTER.source,
            4,
            keys.waiters(name),
            keys.lock(name),
            keys.wake(name),
            keys.handoff(name),
            waiter,
            mark_ms,
        )

    def hedge_delay(self) -> float:
        """When a quorum-first attempt asks the other nodes (see :data:`HEDGE_ROUND_TRIPS`)."""
        return min(self.node_timeout, max(HEDGE_MIN, self.round_trip * HEDGE_ROUND_TRIPS))

    def saw_round_trip(self, seconds: float) -> None:
        """Fold how long a quorum-first round took into the average."""
        self.round_trip += (seconds - self.round_trip) * ROUND_TRIP_WEIGHT

    def drift(self, ttl: float) -> float:
        """:func:`drift_allowance` with this alias's factor (inlined: every attempt runs it)."""
        return ttl * self.drift_factor + DRIFT_ALLOWANCE


@dataclass
class LeaseRecord:
    """What the engine needs to renew or release one lease."""

    name: str
    key: str
    owner: str = field(repr=False)
    token: int = 0
    ttl: float = 0.0
    deadline: float = 0.0
    lost: bool = False
    released: bool = False
    #: per node: False when the acquire never reached it (so it cannot hold the key)
    reached: tuple[bool, ...] = ()
    #: set by the release: it woke a waiter and reserved the name for it
    handed_off: bool = False
    #: the connection the acquire ran on (set by the driver, opaque to plans): renewals and
    #: the release follow on it, so on a paused node they queue behind the acquire
    pinned: Any = field(default=None, repr=False, compare=False)
    #: the process generation (``forks.generation()``) that acquired it
    generation: int = 0
    #: a permit's or a read lease's marker key (renewed with it); '' otherwise
    marker: str = ""
    #: a key of :data:`~.kinds.KINDS`: '' for a lock, ``permit``, ``read`` or ``write``
    kind: str = ""
    #: the nodes (indexes) whose grant made the quorum
    voters: tuple[int, ...] = ()
    #: a permit's slot keys: a node that had not answered the acquire when it was decided
    #: may have granted any of them (its slot 1 taken, say), so its release looks in all
    slots: tuple[str, ...] = field(default=(), repr=False)
    #: the release's nodes whose compare-and-delete is not confirmed yet (no reply: the
    #: connection broke, or the node did not answer in time): it is sent there again
    unsure: tuple[int, ...] = ()
    #: of the ``unsure`` nodes, the slots of release calls sent and not answered yet: a
    #: reply that comes later (read by the connection's next call) settles that node
    #: without sending the release again (see :func:`~.plans.lease.late_answers`)
    late: dict[int, Any] = field(default_factory=dict, repr=False, compare=False)
    #: nodes whose acquire never answered and that said "not yours" to the release: the call
    #: that took the name there may still be on its way (written on a connection that
    #: closed with it unanswered, held by a proxy), so the release goes there once more at
    #: the time given (``time.monotonic()``; see :data:`~.plans.lease.LATE_DELIVERY`)
    recheck: dict[int, float] = field(default_factory=dict, repr=False, compare=False)
    #: why the nodes of ``unsure`` did not confirm it ("label: reason; ...": a refused
    #: command names the permission the node's ACL user lacks)
    unsure_why: str = ""
    #: how many nodes confirmed the release (its compare-and-delete ran there)
    confirmed: int = 0
    #: a quorum confirmed the release (nodes left in ``unsure`` are stragglers)
    settled: bool = False
    #: whether the lease was still valid when its release began
    valid_at_release: bool = False
    #: its unconfirmed release went to a background give-back (set for good: the release was
    #: not a loss, even once the give-back has ended)
    given_back: bool = False
    #: set by the driver: seconds the acquire call took, its attempts, when it won (monotonic)
    waited: float = 0.0
    attempts: int = 0
    acquired_at: float = 0.0

    def __post_init__(self) -> None:
        # an acquire interrupted before its caller holds the lease gives this grant back
        # (so a record is made with every field its release reads: kind, marker, slots)
        if (open_handoff := handoff.current()) is not None:
            open_handoff.records.append(self)

    def may_hold(self, node: int) -> bool:
        """Whether node ``node`` (an index) may hold its keys (its acquire may have reached it)."""
        return node >= len(self.reached) or self.reached[node]

    def validity(self) -> float:
        if self.lost or self.released:
            return 0.0
        return max(0.0, self.deadline - time.monotonic())


class Abandoned(Exception):
    """Thrown into a plan by its driver when the caller gave up while a request was in flight
    (an asyncio task cancelled, an interrupt): the plan yields what undoes its effects (fire and
    forget), then lets this exception propagate."""


#: What a renewal found: renewed (a quorum extended it in time), lost (validity gone, or a
#: quorum can no longer hold it because nodes said "not yours"), or unconfirmed (too few answers
#: in time; the lease keeps the validity it had and its keys are left alone).
RENEWED, LOST, UNCONFIRMED = "renewed", "lost", "unconfirmed"


@dataclass
class Renewal:
    """The outcome of one renewal: :data:`RENEWED`, :data:`LOST` or :data:`UNCONFIRMED`."""

    status: str
    answered: int = 0
    errors: dict[str, str] = field(default_factory=dict)


@dataclass
class AcquireFailure:
    """Why one attempt failed: ``busy`` (someone holds it), ``unavailable`` (no quorum) or
    ``other_kind`` (the name is taken as another kind: a lock, or a semaphore of other size)."""

    reason: str
    votes: int
    answered: int
    errors: dict[str, str]
    retry_after: float | None = None
    #: ``lock_many``: the name found busy (the one to wait for)
    busy_name: str | None = None
    #: set by the driver: seconds the acquire call took until it gave up, and its attempts
    waited: float = 0.0
    attempts: int = 0
    #: a permit's quorum granted it, but a lagging node's counter had passed its token
    #: (permits racing for tokens, see ``RAISE``): nobody holds it, a new attempt may win
    raced: bool = False

    @property
    def final(self) -> bool:
        """True when no wait ends this failure: the name is taken as another kind, so the
        caller asked for the wrong kind (a release would not change that)."""
        return self.reason == "other_kind"

    def retried_quickly(self, woken: bool) -> bool:
        """True when the caller retries within a moment instead of blocking for a wake-up: a
        woken one that some node granted (the release is on its way to the others; see
        ``HANDOFF_RETRY`` in :mod:`.policy`)."""
        return woken and self.votes > 0
