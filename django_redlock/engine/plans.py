"""The Redlock algorithm as I/O-free plans, run by the sync and the async driver alike.

A plan is a generator: it yields a :class:`Request` (one call per node, a deadline and an
optional "settled" test) and receives the per-node replies, so one algorithm serves both
``lock()`` and ``alock()`` without a duplicated line.
"""

from __future__ import annotations

import math
import os
import secrets
import socket
import time
import zlib
from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from . import scripts
from .replies import Call, NodeFailure, Slot

#: Tokens stay below 2**53 so they are exact in JavaScript, JSON and Lua doubles.
TOKEN_LIMIT = 2**53
#: On (re)initialisation a node's counter is raised to at least ``unix_ms * CLOCK_FLOOR``. No
#: node can run 1,024 acquisitions per millisecond, so a cluster that lost every node's data
#: still hands out tokens above all earlier ones (until the year 2248).
CLOCK_FLOOR = 1024
#: How often one engine re-examines untrusted nodes.
REJOIN_INTERVAL = 0.5
#: How long a wake-up left by a release waits for a waiter to take it, in ms.
WAKE_TTL_MS = 2000
#: A failed attempt marks the name as wanted for at least this long, in ms: longer than the
#: longest single wait (``waiting.MAX_BACKOFF``), so a blocked waiter is always covered.
WAIT_MARK_MS = 2500
#: After a release that woke a waiter, only a woken waiter may take the name for this long
#: (ms); if it never comes (it died, or its timeout ran out) anyone may take it afterwards.
HANDOFF_MS = 10


class NodeState(Protocol):
    """What a plan may know about one node's connection."""

    label: str

    @property
    def run_id(self) -> str | None: ...

    def uptime(self) -> float | None: ...

    @property
    def last_error(self) -> str: ...


@dataclass
class Request:
    """Send ``calls`` (index = node) and collect replies until ``settled`` or ``timeout``."""

    calls: list[Call | None]
    timeout: float
    settled: Callable[[list[Slot]], bool] | None = None
    wait: bool = True


Plan = Generator[Request, list[Any], Any]


@dataclass
class AliasState:
    """Per-alias constants and the little state plans share across calls."""

    prefix: str
    node_timeout: float
    drift_factor: float
    ttl: float
    #: how long a sync call may spin for replies before it sleeps in poll(), seconds
    busy_poll: float = 0.0
    host: str = field(default_factory=socket.gethostname)
    pid: int = field(default_factory=os.getpid)
    longest_ttl_ms: int = 0
    next_rejoin_check: float = 0.0
    #: (node label, run_id) -> when this process first saw that incarnation untrusted
    untrusted_seen: dict[tuple[str, str], float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.longest_ttl_ms = max(self.longest_ttl_ms, math.ceil(self.ttl * 1000))

    @property
    def fence_key(self) -> str:
        return f"{self.prefix}__fence__"

    def key(self, name: str) -> str:
        return f"{self.prefix}{name}"

    def wait_key(self, name: str) -> str:
        return f"{self.prefix}__wait__:{name}"

    def wake_key(self, name: str) -> str:
        return f"{self.prefix}__wake__:{name}"

    def handoff_key(self, name: str) -> str:
        return f"{self.prefix}__handoff__:{name}"

    def release_call(self, name: str, owner: str, *, wakes: bool, mark_ms: int = 0) -> Call:
        """Compare-and-delete ``name`` for ``owner``; ``wakes`` on the node waiters block on;
        ``mark_ms`` > 0 for a failed attempt that will wait (it marks the name as wanted)."""
        return Call(
            scripts.RELEASE,
            (self.key(name), self.wait_key(name), self.wake_key(name), self.handoff_key(name)),
            (owner, WAKE_TTL_MS, HANDOFF_MS, "1" if wakes else "0", mark_ms),
        )

    def mark_command(self, name: str) -> tuple[str, ...]:
        """A plain command marking ``name`` as wanted, for a caller that queues without a
        failed attempt (which marks it otherwise); it lives longer than any single wait."""
        return ("SET", self.wait_key(name), "1", "PX", str(WAIT_MARK_MS))

    def drift(self, ttl: float) -> float:
        return ttl * self.drift_factor + 0.002


def wake_node(name: str, count: int) -> int:
    """The node every waiter of ``name`` blocks on (and the only one releases push to)."""
    return zlib.crc32(name.encode("utf-8", "surrogatepass")) % count


@dataclass
class LeaseState:
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

    def validity(self) -> float:
        if self.lost or self.released:
            return 0.0
        return max(0.0, self.deadline - time.monotonic())


@dataclass
class AcquireFailure:
    """Why one attempt failed: ``busy`` (someone holds it) or ``unavailable`` (no quorum)."""

    reason: str
    votes: int
    answered: int
    errors: dict[str, str]
    retry_after: float | None = None


def quorum_of(count: int) -> int:
    return count // 2 + 1


def _errors(nodes: Sequence[NodeState], replies: Sequence[Any]) -> dict[str, str]:
    return {
        node.label: str(reply)
        for node, reply in zip(nodes, replies, strict=True)
        if isinstance(reply, NodeFailure)
    }


def _acquire_status(slot: Slot) -> int | None:
    if not slot.done or isinstance(slot.value, NodeFailure):
        return None
    return int(slot.value[0])


def acquire_plan(
    state: AliasState,
    nodes: Sequence[NodeState],
    name: str,
    ttl: float,
    *,
    will_wait: bool = False,
    woken: bool = False,
) -> Plan:
    """One acquisition attempt; returns a :class:`LeaseState` or an :class:`AcquireFailure`.

    ``will_wait``: on failure the caller waits, so the name is marked as wanted.
    ``woken``: a release woke this caller, so it may take a name reserved for the hand-off."""
    total = len(nodes)
    quorum = quorum_of(total)
    ttl_ms = math.ceil(ttl * 1000)
    state.longest_ttl_ms = max(state.longest_ttl_ms, ttl_ms)
    key = state.key(name)
    owner = secrets.token_hex(16)
    suffix = f"|{int(time.time() * 1000)}|{state.host}|{state.pid}"
    mark_ms = WAIT_MARK_MS if will_wait else 0

    def settled(slots: list[Slot]) -> bool:
        statuses = [_acquire_status(s) for s in slots]
        won = statuses.count(1)
        lost = sum(1 for s, st in zip(slots, statuses, strict=True) if s.done and st != 1)
        return won >= quorum or total - lost < quorum

    rejoined = False
    while True:
        started = time.monotonic()
        calls: list[Call | None] = [
            None
            if node.run_id is None
            else Call(
                scripts.ACQUIRE,
                (key, state.fence_key, state.wait_key(name), state.handoff_key(name)),
                (owner, ttl_ms, node.run_id, suffix, mark_ms, "1" if woken else "0"),
            )
            for node in nodes
        ]
        replies = yield Request(calls, state.node_timeout, settled)
        statuses = [None if isinstance(reply, NodeFailure) else int(reply[0]) for reply in replies]
        if statuses.count(-1) and statuses.count(1) < quorum and not rejoined:
            rejoined = True
            if (yield from rejoin_plan(state, nodes)):
                yield from _release_calls(
                    state, nodes, calls, _granted(replies, _acquired), owner, name
                )
                owner = secrets.token_hex(16)
                continue
        break

    won = [i for i, st in enumerate(statuses) if st == 1]
    if len(won) >= quorum:
        token = max(int(replies[i][1]) for i in won)
        behind = [i for i in won if int(replies[i][1]) < token]
        confirmed = len(won) - len(behind)
        if behind and token < TOKEN_LIMIT:
            raise_calls: list[Call | None] = [None] * total
            for i in behind:
                run_id = nodes[i].run_id
                if run_id is not None:
                    raise_calls[i] = Call(
                        scripts.RAISE, (state.fence_key, key), (token, run_id, owner)
                    )
            needed = quorum - confirmed
            raised = yield Request(
                raise_calls,
                state.node_timeout,
                lambda slots: sum(1 for s in slots if s.done and s.value == 1) >= needed,
            )
            confirmed += sum(1 for i in behind if raised[i] == 1)
        validity_deadline = started + ttl - state.drift(ttl)
        if confirmed >= quorum and token < TOKEN_LIMIT and time.monotonic() < validity_deadline:
            reached = tuple(g is not False for g in _granted(replies, _acquired))
            return LeaseState(name, key, owner, token, ttl, validity_deadline, reached=reached)

    granted = _granted(replies, _acquired)
    yield from _release_calls(state, nodes, calls, granted, owner, name, mark_ms)
    trusted_answers = sum(1 for st in statuses if st in (0, 1))
    busy = statuses.count(0)
    failing = statuses.count(-1) + sum(
        1 for r in replies if isinstance(r, NodeFailure) and r.reason != "timed out"
    )
    pttls = [int(r[2]) for r, st in zip(replies, statuses, strict=True) if st == 0]
    retry_after = max(pttls) / 1000 if pttls and max(pttls) > 0 else None
    if busy and total - failing >= quorum:
        return AcquireFailure(
            "busy", len(won), trusted_answers, _errors(nodes, replies), retry_after
        )
    if len(won) >= quorum:  # quorum reached but validity ran out or the token overflowed
        return AcquireFailure("busy", len(won), trusted_answers, _errors(nodes, replies))
    errors = _errors(nodes, replies)
    for i, st in enumerate(statuses):
        if st == -1:
            errors[nodes[i].label] = "restarted or new node, quarantined"
    return AcquireFailure("unavailable", len(won), trusted_answers, errors, retry_after)


def _release_calls(
    state: AliasState,
    nodes: Sequence[NodeState],
    calls: Sequence[Call | None],
    granted: Sequence[bool | None],
    owner: str,
    name: str,
    mark_ms: int = 0,
) -> Plan:
    """Fire-and-forget release on every node that may hold the key: those that granted it
    (``True``) or did not answer (``None``), not those that said no (``False``).

    A release is sent on the same connection as the acquire, so on a paused node it runs right
    after the late SET when the node resumes; no stale key outlives the pause.
    """
    release: list[Call | None] = [None] * len(nodes)
    waking = wake_node(name, len(nodes))
    for i, call in enumerate(calls):
        if call is not None and granted[i] is not False:
            release[i] = state.release_call(name, owner, wakes=i == waking, mark_ms=mark_ms)
    if any(release):
        yield Request(release, 0.0, wait=False)


def _granted(replies: Sequence[Any], yes: Callable[[Any], bool]) -> list[bool | None]:
    """Per node: True if it said yes, False if it said no or never got the call, None if it
    got the call but did not answer (it may have executed it)."""
    return [
        (None if reply.sent else False) if isinstance(reply, NodeFailure) else yes(reply)
        for reply in replies
    ]


def _acquired(reply: Any) -> bool:
    return int(reply[0]) == 1


def release_plan(state: AliasState, nodes: Sequence[NodeState], lease: LeaseState) -> Plan:
    """Compare-and-delete on every node; returns True if the lease was still held."""
    if lease.released:
        return False
    was_valid = lease.validity() > 0
    lease.released = True
    total = len(nodes)
    quorum = quorum_of(total)
    waking = wake_node(lease.name, total)
    reached = lease.reached or (True,) * total
    calls: list[Call | None] = [
        state.release_call(lease.name, lease.owner, wakes=i == waking)
        if node.run_id is not None and reached[i]
        else None
        for i, node in enumerate(nodes)
    ]

    def settled(slots: list[Slot]) -> bool:
        # a quorum of answers decides; a paused node's reply is read later, in order
        answered = sum(1 for s, c in zip(slots, calls, strict=True) if c is not None and s.done)
        return answered >= quorum or all(s.done for s, c in zip(slots, calls, strict=True) if c)

    replies = yield Request(calls, state.node_timeout, settled)
    lease.handed_off = any(r == 2 for r in replies)
    refused = sum(1 for r in replies if r == 0)
    confirmed = any(r in (1, 2) for r in replies)
    return was_valid and not lease.lost and confirmed and refused <= total - quorum


def extend_plan(
    state: AliasState, nodes: Sequence[NodeState], lease: LeaseState, ttl: float
) -> Plan:
    """Compare-and-pexpire on every node; returns True (deadline renewed) or False (lost)."""
    if lease.lost or lease.released or lease.validity() <= 0:
        lease.lost = True
        return False
    total = len(nodes)
    quorum = quorum_of(total)
    ttl_ms = math.ceil(ttl * 1000)
    state.longest_ttl_ms = max(state.longest_ttl_ms, ttl_ms)
    calls: list[Call | None] = [
        None
        if node.run_id is None
        else Call(scripts.EXTEND, (lease.key, state.fence_key), (lease.owner, ttl_ms, node.run_id))
        for node in nodes
    ]

    def settled(slots: list[Slot]) -> bool:
        won = sum(1 for s in slots if s.done and s.value == 1)
        lost = sum(1 for s in slots if s.done and s.value != 1)
        return won >= quorum or total - lost < quorum

    started = time.monotonic()
    replies = yield Request(calls, state.node_timeout, settled)
    deadline = started + ttl - state.drift(ttl)
    if sum(1 for r in replies if r == 1) >= quorum and time.monotonic() < deadline:
        lease.deadline = deadline
        lease.ttl = ttl
        return True
    lease.lost = True
    granted = _granted(replies, lambda reply: reply == 1)
    yield from _release_calls(state, nodes, calls, granted, lease.owner, lease.name)
    return False


def rejoin_plan(state: AliasState, nodes: Sequence[NodeState]) -> Plan:
    """Make restarted or new nodes trusted again when it is safe; returns True if any rejoined.

    * A brand-new cluster (every node answers and none has a fence hash) is initialised at once.
    * A restarted node waits until the longest TTL has passed since it started, then gets the
      highest counter of a majority of trusted nodes (or, when fewer than a quorum are trusted,
      the highest counter of all reachable nodes and the clock floor).
    """
    now = time.monotonic()
    if now < state.next_rejoin_check:
        return False
    state.next_rejoin_check = now + REJOIN_INTERVAL
    total = len(nodes)
    quorum = quorum_of(total)
    calls: list[Call | None] = [
        None if node.run_id is None else Call(scripts.PROBE, (state.fence_key,), ())
        for node in nodes
    ]
    probes = yield Request(calls, state.node_timeout * 2, None)
    reachable = [i for i, p in enumerate(probes) if not isinstance(p, NodeFailure)]
    if len(reachable) < quorum:
        return False
    markers = {i: _text(probes[i][0]) for i in reachable}
    counters = {i: int(probes[i][1]) for i in reachable}
    longest = max([state.longest_ttl_ms, *(int(probes[i][2]) for i in reachable)])
    state.longest_ttl_ms = longest
    trusted = [i for i in reachable if markers[i] == nodes[i].run_id]
    untrusted = [i for i in reachable if i not in trusted]
    floor = int(time.time() * 1000) * CLOCK_FLOOR
    if len(reachable) == total and not any(int(probes[i][3]) for i in reachable):
        targets, value = untrusted, max([floor, *counters.values()])
    else:
        targets = [i for i in untrusted if _quarantine_over(state, nodes[i], now, longest)]
        if len(trusted) >= quorum:
            value = max(counters[i] for i in trusted)
        else:
            value = max([floor, *counters.values()])
    if not targets or value >= TOKEN_LIMIT:
        return False
    rejoin: list[Call | None] = [None] * total
    for i in targets:
        run_id = nodes[i].run_id
        if run_id is not None:
            rejoin[i] = Call(scripts.REJOIN, (state.fence_key,), (run_id, value))
    replies = yield Request(rejoin, state.node_timeout * 2, None)
    return any(not isinstance(replies[i], NodeFailure) for i in targets)


def _quarantine_over(state: AliasState, node: NodeState, now: float, longest_ms: int) -> bool:
    """An untrusted node may rejoin once the longest TTL has passed since it started *and*
    since this process first saw it without its marker: a node wiped without a restart
    (``FLUSHALL``, ``REPLICAOF``) has a long uptime but lost its lock keys just now."""
    first_seen = state.untrusted_seen.setdefault((node.label, node.run_id or ""), now)
    uptime = node.uptime() or 0.0
    return min(uptime, now - first_seen) * 1000 >= longest_ms


def force_release_plan(
    state: AliasState, nodes: Sequence[NodeState], name: str, expected: str = ""
) -> Plan:
    """Delete ``name`` on every node whoever holds it; returns how many nodes deleted it."""
    calls: list[Call | None] = [
        None
        if node.run_id is None
        else Call(
            scripts.FORCE_RELEASE,
            (state.key(name), state.fence_key, state.wake_key(name)),
            (expected, WAKE_TTL_MS),
        )
        for node in nodes
    ]
    replies = yield Request(calls, state.node_timeout * 4, None)
    return sum(1 for r in replies if r == 1)


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
