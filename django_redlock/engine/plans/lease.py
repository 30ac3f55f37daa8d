"""The plans of a lease once it is held: release, extend (renew) and force-release; like
every plan, I/O-free generators run by the sync and the asyncio driver alike."""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from typing import Any

from .. import scripts
from ..keyspace import quorum, wake_node
from ..kinds import HANDOFF_MS, KINDS, LOCK
from ..replies import (
    Call,
    Labelled,
    NodeFailure,
    Request,
    Slot,
    granted_per_node,
    node_errors,
)
from ..scripts import primitives as more
from ..state import (
    LOST,
    RENEWED,
    UNCONFIRMED,
    WAKE_TTL_MS,
    AliasState,
    LeaseRecord,
    NodeView,
    Plan,
    Renewal,
)


def _renewed(reply: Any) -> bool:
    return bool(reply == scripts.RENEWED)


def release_plan(state: AliasState, nodes: Sequence[NodeView], lease: LeaseRecord) -> Plan[bool]:
    """Compare-and-delete on every node; returns True if the lease was still held."""
    if lease.released:
        return False
    was_valid = lease.validity() > 0
    lease.released = True
    total = len(nodes)
    needed = quorum(total)
    waking = wake_node(lease.name, total)
    reached = lease.reached or (True,) * total
    calls: list[Call | None] = [
        release_of(state, lease, wakes=i == waking, unsure=i not in lease.voters)
        if node.run_id is not None and reached[i]
        else None
        for i, node in enumerate(nodes)
    ]

    def settled(slots: list[Slot]) -> bool:
        # a quorum of answers decides; a paused node's reply is read later, in order
        answered = sum(1 for s, c in zip(slots, calls, strict=True) if c is not None and s.done)
        return answered >= needed or all(s.done for s, c in zip(slots, calls, strict=True) if c)

    replies = yield Request(calls, state.node_timeout, settled)
    handed = sum(1 for r in replies if r == scripts.HANDED_OFF)
    # a permit's releaser queues only when a quorum left no free slot that it could take
    lease.handed_off = handed >= needed if KINDS[lease.kind].handoff_needs_quorum else handed > 0
    held = counted_release(lease, reached, replies, was_valid)
    note_unsure(lease, nodes, replies)
    return held


def counted_release(
    lease: LeaseRecord, reached: Sequence[bool], replies: Sequence[Any], was_valid: bool
) -> bool:
    """What a release's replies say: True when its compare-and-delete ran on a quorum of the
    nodes while the lease was valid; False when so many nodes said "not yours" (or were never
    ``reached`` by the acquire) that no quorum held it (lost), or when too few answered to
    tell. ``lease.unsure`` names the nodes to send it to again (down, a connection that
    broke, a node that did not answer in time; see :func:`release_again_plan`), also when a
    quorum confirmed it (``lease.settled``), so no node keeps the name for the TTL."""
    total = len(replies)
    needed = quorum(total)
    lease.valid_at_release = was_valid and not lease.lost
    refused = confirmed = 0
    unsure = []
    for i, (reply, holds) in enumerate(zip(replies, reached, strict=True)):
        if not holds or reply == scripts.NOT_HELD:
            refused += 1
            if holds:
                _look_again_later(lease, i, time.monotonic())
        elif isinstance(reply, NodeFailure):
            unsure.append(i)
            if reply.late is not None:
                lease.late[i] = reply.late
        else:
            confirmed += 1
    lease.confirmed, lease.unsure, lease.settled = confirmed, (), confirmed >= needed
    if refused > total - needed:  # no quorum held it: lost, nothing to send again
        return False
    lease.unsure = tuple(unsure)
    return lease.valid_at_release if lease.settled else False


def note_unsure(lease: LeaseRecord, nodes: Sequence[Labelled], replies: Sequence[Any]) -> None:
    """Record on ``lease`` why its ``unsure`` nodes did not confirm the release (shown by the
    background give-back's warning and ``Lease.check()``)."""
    unsure = [(nodes[i], replies[i]) for i in lease.unsure]
    lease.unsure_why = "; ".join(f"{node.label}: {reply}" for node, reply in unsure)


#: Seconds after a node that never answered a lease's acquire said "not yours" to its
#: release before the release is sent there once more: the acquire may have been written on a
#: connection that closed with it unanswered, and a proxy between us and the node can still
#: deliver it after the release ran (a copy nobody holds, until its TTL). One more send after
#: this long catches such a late grant; a proxy that holds a call longer leaves it to its TTL.
LATE_DELIVERY = 2.0


def _late_grant_possible(lease: LeaseRecord, node: int) -> bool:
    """Whether ``node`` may still receive ``lease``'s acquire: a lease (a quorum voted for
    it) whose acquire that node never answered. A failed attempt's grant given back again
    (``state.owed``: no voters) is not rechecked: its give-back went out on the same
    connection as its acquire before that connection broke, and rechecking every one of them
    kept give-back threads busy on the connection budget (a pool of 4 shared by 60 callers
    took 3x as long)."""
    return bool(lease.voters) and node not in lease.voters


def _look_again_later(lease: LeaseRecord, node: int, now: float) -> None:
    """After ``node`` said "not yours" to ``lease``'s release: send the release there once more
    :data:`LATE_DELIVERY` from ``now`` if the acquire may still reach it."""
    if _late_grant_possible(lease, node):
        lease.recheck[node] = now + LATE_DELIVERY


def late_answers(lease: LeaseRecord) -> None:
    """Settle the ``unsure`` nodes whose release reply came after the call was decided (a
    quorum answered first, or it timed out) and was read since, in order, by the next call
    on that connection: an answer says the compare-and-delete ran there, so it is not sent
    again. A refusal stays unsure (sent again); "not yours" leaves nothing to release, but
    from a node that never answered the acquire it is looked at once more later, as
    :func:`counted_release` does (the acquire, on another connection, may run there after
    the release: a paused node that resumed)."""
    late = lease.late
    if not late:
        return
    still = []
    for i in lease.unsure:
        slot = late.get(i)
        if slot is None or not slot.done or isinstance(slot.value, NodeFailure):
            still.append(i)
        elif slot.value != scripts.NOT_HELD:
            lease.confirmed += 1
        else:  # "not yours", as a timely one: the acquire may still follow
            _look_again_later(lease, i, time.monotonic())
    lease.unsure = tuple(still)
    if not still:
        lease.late = {}


def release_again_plan(
    state: AliasState, nodes: Sequence[NodeView], lease: LeaseRecord, *, background: bool = False
) -> Plan[bool]:
    """Send a release once more to the nodes that did not confirm it (``lease.unsure``), each
    on the connection this call got (a new one where the old one broke). Compare-and-delete by
    the owner value runs at most once in effect: a node that says "not yours" while the lease
    is still valid had run the earlier send (or an operator force-released the name). True
    once a quorum confirmed it (``lease.settled``); nodes still in ``lease.unsure`` then are
    stragglers, sent to again until the lease's validity ends.

    ``background`` (a give-back thread's send): a node that is ``behind`` on this connection
    (calls sent to it still unanswered: paused, or slow) is left for a later round instead of
    being waited for, so a background send never holds a pooled connection for
    ``NODE_TIMEOUT`` (a caller would open another meanwhile, and wait for that node to
    connect)."""
    late_answers(lease)  # answers this call's connections read before the plan began
    total = len(nodes)
    waking = wake_node(lease.name, total)
    unsure = set(lease.unsure)
    now = time.monotonic()
    # nodes to look at once more for a late grant (never waited for: background only)
    due = {i for i, at in lease.recheck.items() if at <= now} if background else set()
    calls: list[Call | None] = [
        release_of(state, lease, wakes=i == waking, unsure=i not in lease.voters)
        if (i in unsure or i in due)
        and node.run_id is not None
        and not (background and node.behind)
        else None
        for i, node in enumerate(nodes)
    ]
    # sent even with no call: the driver starts reconnecting the nodes that are down
    replies = yield Request(calls, state.node_timeout)
    now = time.monotonic()
    ran_before = not lease.lost and lease.deadline > now
    still = []
    for i in sorted(unsure):
        reply = replies[i]
        if isinstance(reply, NodeFailure):
            still.append(i)
            if reply.late is not None:
                lease.late[i] = reply.late
        elif reply != scripts.NOT_HELD or ran_before:
            lease.confirmed += 1
            if reply == scripts.NOT_HELD:
                _look_again_later(lease, i, now)  # its acquire may still arrive
    for i in due - unsure:  # looked at once more: whatever it says, nothing is on its way
        if not isinstance(replies[i], NodeFailure):
            del lease.recheck[i]
    if not ran_before:
        lease.recheck.clear()  # its keys have expired
    lease.unsure = tuple(still)
    lease.settled = lease.confirmed >= quorum(total)
    note_unsure(lease, nodes, replies)
    return lease.settled


def release_many_plan(
    state: AliasState, nodes: Sequence[NodeView], leases: Sequence[LeaseRecord]
) -> Plan[list[bool]]:
    """Release every lease of a ``lock_many`` set (one owner) in one call per node; returns,
    per lease, True if it was still held (as :func:`release_plan`)."""
    live = [lease for lease in leases if not lease.released]
    was_valid = [lease.validity() > 0 for lease in live]
    for lease in live:
        lease.released = True
    total = len(nodes)
    needed = quorum(total)
    if not live:
        return [False] * len(leases)
    reached = live[0].reached or (True,) * total
    keys = state.keys
    touched: tuple[str, ...] = ()
    for lease in live:
        name = lease.name
        touched += (lease.key, keys.waiters(name), keys.wake(name), keys.handoff(name))
    waking = [wake_node(lease.name, total) for lease in live]

    def call(i: int) -> Call:
        wakes = "".join("1" if i == node else "0" for node in waking)  # per name, in order
        args = (live[0].owner, WAKE_TTL_MS, HANDOFF_MS, wakes, 0, "", KINDS[LOCK].wakes)
        return Call(more.RELEASE_MANY, touched, args)

    calls: list[Call | None] = [
        call(i) if node.run_id is not None and reached[i] else None for i, node in enumerate(nodes)
    ]

    def settled(slots: list[Slot]) -> bool:
        answered = sum(1 for s, c in zip(slots, calls, strict=True) if c is not None and s.done)
        return answered >= needed or all(s.done for s, c in zip(slots, calls, strict=True) if c)

    replies = yield Request(calls, state.node_timeout, settled)
    held = []
    for j, lease in enumerate(live):
        mine = [int(r[j]) if isinstance(r, list) else r for r in replies]
        lease.handed_off = any(answer == scripts.HANDED_OFF for answer in mine)
        held.append(counted_release(lease, reached, mine, was_valid[j]))
        note_unsure(lease, nodes, mine)
    by_record = {id(lease): ok for lease, ok in zip(live, held, strict=True)}
    return [by_record.get(id(lease), False) for lease in leases]


def extend_plan(
    state: AliasState, nodes: Sequence[NodeView], lease: LeaseRecord, ttl: float
) -> Plan[Renewal]:
    """Compare-and-pexpire on every node.

    Renewed when a quorum extended it in time. Lost when its validity is gone or so many nodes
    said "not yours" that no quorum can hold it (the nodes that did extend it are released).
    Otherwise (nodes slow, down or restarted) unconfirmed: the lease keeps the validity it had
    and nothing is deleted, so a node's hiccup never forfeits a valid lease."""
    if lease.lost or lease.released or lease.validity() <= 0:
        lease.lost = True
        return Renewal(LOST)
    total = len(nodes)
    needed = quorum(total)
    ttl_ms = math.ceil(ttl * 1000)
    state.longest_ttl_ms = max(state.longest_ttl_ms, ttl_ms)
    script = KINDS[lease.kind].extend
    extended = (lease.key, state.keys.fence, *((lease.marker,) if lease.marker else ()))
    reached = lease.reached or (True,) * total  # nodes that said no never hold it
    calls: list[Call | None] = [
        None
        if node.run_id is None or not reached[i]
        else Call(script, extended, (lease.owner, ttl_ms, node.run_id))
        for i, node in enumerate(nodes)
    ]

    def settled(slots: list[Slot]) -> bool:
        won = sum(1 for s in slots if s.done and s.value == scripts.RENEWED)
        lost = sum(1 for s in slots if s.done and s.value != scripts.RENEWED)
        return won >= needed or total - lost < needed

    started = time.monotonic()
    replies = yield Request(calls, state.node_timeout, settled)
    deadline = started + ttl - state.drift(ttl)
    answered = sum(1 for r in replies if not isinstance(r, NodeFailure))
    if sum(1 for r in replies if r == scripts.RENEWED) >= needed and time.monotonic() < deadline:
        lease.deadline = deadline
        lease.ttl = ttl
        return Renewal(RENEWED, answered)
    # a node the acquire did not win holds nothing: it counts as a "not yours"
    refused = sum(1 for r in replies if r == scripts.NOT_HELD) + reached.count(False)
    if refused <= total - needed and lease.validity() > 0:
        return Renewal(UNCONFIRMED, answered, node_errors(nodes, replies))
    lease.lost = True
    waking = wake_node(lease.name, total)
    release = [
        release_of(state, lease, wakes=i == waking, unsure=i not in lease.voters)
        if calls[i] is not None and renewed is not False
        else None
        for i, renewed in enumerate(granted_per_node(replies, _renewed))
    ]
    if any(release):
        yield Request(release, 0.0, wait=False)
    return Renewal(LOST, answered, node_errors(nodes, replies))


class SemaphoreName(ValueError):
    """:func:`force_release_plan` without the expected marker found a semaphore's name."""


def force_release_plan(
    state: AliasState, nodes: Sequence[NodeView], name: str, expected: str = "", key: str = ""
) -> Plan[int]:
    """Delete ``name`` (or ``key``, one of its semaphore's slot keys) on every node whoever
    holds it (a read-write lock's readers: all of them); returns how many nodes deleted it.
    A waiter of ``name`` is woken. Raises ``ValueError`` when ``name`` is a semaphore's and
    ``expected`` does not name its marker: its permits must go first (their slot keys), else
    a lock could be taken beside them; nothing is deleted on the nodes that hold it."""
    keys = state.keys
    calls: list[Call | None] = [
        None
        if node.run_id is None
        else Call(
            scripts.FORCE_RELEASE,
            (key or keys.lock(name), keys.fence, keys.wake(name), keys.readers(name)),
            (expected, WAKE_TTL_MS),
        )
        for node in nodes
    ]
    replies = yield Request(calls, state.node_timeout * 4, None)
    if scripts.OTHER_KIND in replies:
        raise SemaphoreName(
            f"{name!r} is a semaphore's name: force-releasing it alone would leave its permits "
            "valid beside a lock taken next. Release its permits and then the name with "
            "django_redlock.inspection.force_release(alias, name), the admin's force-release "
            "action or 'manage.py redlock release'; nothing was deleted where it is a semaphore"
        )
    return sum(1 for r in replies if r == scripts.DELETED)


def release_of(state: AliasState, lease: LeaseRecord, *, wakes: bool, unsure: bool) -> Call:
    """The call releasing ``lease`` (a lock, a permit, a read or a write lease) on one node;
    ``unsure``: the node's grant is unknown (it had not answered), so a permit's release there
    frees whichever slot holds the owner."""
    held = lease.slots if unsure and lease.slots else (lease.key,)
    return state.release_call(
        lease.name, lease.owner, wakes=wakes, held=held, kind=lease.kind, slots=lease.slots
    )
