"""Which nodes may vote: restarted or new nodes rejoin only when that is safe (docs/algorithm.md).

A node whose fence hash does not carry the ``run_id`` of its current incarnation has restarted
(or was wiped, or is new): its lock keys may be gone, so it votes neither for locks nor for
tokens until the longest TTL has passed and its counter has been raised to what a majority of
trusted nodes has seen.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from .. import scripts
from ..keyspace import TOKEN_LIMIT, as_text, quorum
from ..replies import Call, NodeFailure, Request
from ..state import AliasState, NodeView, Plan

#: On (re)initialisation a node's counter is raised to at least ``unix_ms * CLOCK_FLOOR``. No
#: node can run 1,024 acquisitions per millisecond, so a cluster that lost every node's data
#: still hands out tokens above all earlier ones (until the year 2248).
CLOCK_FLOOR = 1024
#: How often one engine re-examines untrusted nodes.
REJOIN_INTERVAL = 0.5


#: While another caller initialises a new cluster (see :func:`_initialising`), a rejoin check
#: looks again until that caller's ``REJOIN`` has reached every node: for up to RACE_WAIT
#: seconds and RACE_LOOKS probes, whichever ends first (a caller that died mid-way leaves the
#: rest to the quarantine). Measured: a loaded machine's initialising thread took 14 ms to
#: reach the last node, while three looks took 4 ms.
RACE_WAIT = 0.25
RACE_LOOKS = 32
#: A node that joined with a counter at the clock floor of the last RACE_RECENT seconds was
#: initialised just now (a cluster's first ``REJOIN`` sets its counter to the clock floor).
RACE_RECENT = 5.0


def rejoin_plan(
    state: AliasState,
    nodes: Sequence[NodeView],
    seen_untrusted: Sequence[int] = (),
    drawn: Sequence[int] = (),
) -> Plan[bool]:
    """Make restarted or new nodes trusted again when it is safe; returns True when a retry
    can win now: a quorum is trusted, with a node rejoined here among them or one of
    ``seen_untrusted`` (the caller found it untrusted) rejoined by another caller since
    (several processes' first acquires on a new cluster race to initialise it).
    ``drawn``: per node, the tokens the caller's own failed attempt drew there (its grants
    are no lease, so they do not make a new cluster look used).

    * A brand-new cluster (every node answers and none has granted a lease yet) is initialised
      at once.
    * A restarted node waits until the longest TTL has passed since it started, then gets the
      highest counter of a majority of trusted nodes (or, when fewer than a quorum are trusted,
      the highest counter of all reachable nodes and the clock floor).
    """
    seen = {nodes[i].label for i in seen_untrusted}
    if time.monotonic() < state.next_rejoin_check and seen <= state.held_back:
        return False
    checked = yield from _rejoin_check(state, nodes, seen_untrusted, drawn)
    if checked is None:
        # Too few probes answered in time (a loaded client or node): nothing was learnt, so
        # nobody is held back. It used to hold back the other callers of this process for
        # REJOIN_INTERVAL: on a new cluster their first acquires failed "quarantined".
        return False
    rejoined, left_untrusted = checked
    if not rejoined:
        # Only a check that made nothing trusted holds the others back, and only those that
        # found no other node untrusted (a restarted node in its quarantine: no probe per
        # attempt). A check still in flight holds back nobody: on a new cluster, the callers
        # of this process that found the nodes untrusted while another initialised them probe
        # too, find them trusted (or finish the job) and retry at once, as callers in other
        # processes do, timeout=0 ones included. A caller that found nodes untrusted that the
        # last check found trusted probes too (it was refused "quarantined" on a new cluster
        # when a busy caller's check had found only the third node still uninitialised).
        state.next_rejoin_check = time.monotonic() + REJOIN_INTERVAL
        state.held_back = frozenset(nodes[i].label for i in left_untrusted)
    return rejoined


def _rejoin_check(
    state: AliasState,
    nodes: Sequence[NodeView],
    seen_untrusted: Sequence[int],
    drawn: Sequence[int],
) -> Plan[tuple[bool, list[int]] | None]:
    """:func:`rejoin_plan`'s probe and rejoin, without its throttle: whether a retry can win
    now, and the nodes left untrusted; None when too few nodes answered the probe to tell."""
    now = time.monotonic()
    total = len(nodes)
    needed = quorum(total)
    fence = state.keys.fence
    calls: list[Call | None] = [
        None if node.run_id is None else Call(scripts.PROBE, (fence,), ()) for node in nodes
    ]
    give_up_at = now + RACE_WAIT
    for _look in range(RACE_LOOKS):
        probes = yield Request(calls, state.node_timeout * 2, None)
        reachable = [i for i, p in enumerate(probes) if not isinstance(p, NodeFailure)]
        if len(reachable) < needed:
            return None
        markers = {i: as_text(probes[i][0]) for i in reachable}
        trusted = [i for i in reachable if markers[i] == nodes[i].run_id]
        untrusted = [i for i in reachable if i not in trusted]
        # No reachable node has ever granted a lease (a grant records its TTL in the fence
        # hash): a brand-new cluster, or one whose first acquires of several processes race to
        # initialise it (some nodes initialised by another process, the rest not yet). With
        # every node answering, no lease can exist, so every untrusted node may join at once.
        # The caller's own grants of its failed attempt are no lease: they do not count.
        never_granted = not any(_granted_by_others(probes[i], drawn, i) for i in reachable)
        if never_granted or len(trusted) >= needed:
            break
        if not _initialising(probes, trusted, untrusted, seen_untrusted):
            break
        if time.monotonic() >= give_up_at:
            break
    counters = {i: int(probes[i][1]) for i in reachable}
    longest = max([state.longest_ttl_ms, *(int(probes[i][2]) for i in reachable)])
    state.longest_ttl_ms = longest
    # Another caller made a node this caller found untrusted trusted since: a retry can win
    # only if a quorum is trusted now (one of three is not enough: it used to retry, and the
    # retry failed "quarantined" with the other two a moment from joining).
    rejoined_elsewhere = len(trusted) >= needed and any(i in trusted for i in seen_untrusted)
    floor = int(time.time() * 1000) * CLOCK_FLOOR
    if len(reachable) == total and never_granted:
        targets, value = untrusted, max([floor, *counters.values()])
    else:
        targets = [i for i in untrusted if quarantine_over(state, nodes[i], now, longest)]
        if len(trusted) >= needed:
            value = max(counters[i] for i in trusted)
        else:
            value = max([floor, *counters.values()])
    if not targets or value >= TOKEN_LIMIT:
        return rejoined_elsewhere, untrusted
    rejoin: list[Call | None] = [None] * total
    for i in targets:
        run_id = nodes[i].run_id
        if run_id is not None:
            rejoin[i] = Call(scripts.REJOIN, (fence,), (run_id, value))
    replies = yield Request(rejoin, state.node_timeout * 2, None)
    joined = [i for i in targets if not isinstance(replies[i], NodeFailure)]
    left = [i for i in untrusted if i not in joined]
    return (rejoined_elsewhere or bool(joined)) and len(trusted) + len(joined) >= needed, left


def _initialising(
    probes: Sequence[Any],
    trusted: Sequence[int],
    untrusted: Sequence[int],
    seen_untrusted: Sequence[int],
) -> bool:
    """Another caller is initialising a new cluster as this one probes: the probes of the
    nodes do not run at one instant, so a node this caller found without any fence state may
    have been probed just before that caller's ``REJOIN`` reached it, and a trusted node just
    after that caller's first grant. Told by a node still without fence state beside trusted
    nodes that all joined at a recent clock floor (a node restarted beside an older cluster
    sees trusted nodes that joined long ago: no race, no more looks)."""
    if not any(i in seen_untrusted and not int(probes[i][3]) for i in untrusted):
        return False
    recent = int((time.time() - RACE_RECENT) * 1000) * CLOCK_FLOOR
    return bool(trusted) and all(int(probes[i][4]) >= recent for i in trusted)


def _granted_by_others(probe: Sequence[Any], drawn: Sequence[int], index: int) -> bool:
    """A PROBE reply shows grants other than the caller's own: a lease was granted there
    (a grant records its TTL) and more tokens were drawn since the node joined than the
    caller drew (a node that does not say when it joined counts as used)."""
    if not (int(probe[3]) and int(probe[2])):
        return False
    joined, own = int(probe[4]), drawn[index] if index < len(drawn) else 0
    return joined < 0 or int(probe[1]) - joined > own


def quarantine_over(state: AliasState, node: NodeView, now: float, longest_ms: int) -> bool:
    """An untrusted node may rejoin once the longest TTL has passed since it started *and*
    since this process first saw it without its marker: a node wiped without a restart
    (``FLUSHALL``, ``REPLICAOF``) has a long uptime but lost its lock keys just now."""
    first_seen = state.untrusted_seen.setdefault((node.label, node.run_id or ""), now)
    uptime = node.uptime() or 0.0
    return min(uptime, now - first_seen) * 1000 >= longest_ms
