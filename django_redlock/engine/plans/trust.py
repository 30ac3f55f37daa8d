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


#: How many times a rejoin check probes while another caller is initialising a new cluster
#: (a node it found without fence state is still without, another has a grant already): each
#: probe is a round trip more for that caller's rejoin to land everywhere. Two missed it on a
#: loaded machine (12 threads' first write leases on a new cluster, one "quarantined").
RACE_LOOKS = 3


def rejoin_plan(
    state: AliasState,
    nodes: Sequence[NodeView],
    seen_untrusted: Sequence[int] = (),
    drawn: Sequence[int] = (),
) -> Plan[bool]:
    """Make restarted or new nodes trusted again when it is safe; returns True if any rejoined,
    here or, for a node in ``seen_untrusted`` (the caller found it untrusted), in another
    process since (several processes' first acquires on a new cluster race to initialise it).
    ``drawn``: per node, the tokens the caller's own failed attempt drew there (its grants
    are no lease, so they do not make a new cluster look used).

    * A brand-new cluster (every node answers and none has granted a lease yet) is initialised
      at once.
    * A restarted node waits until the longest TTL has passed since it started, then gets the
      highest counter of a majority of trusted nodes (or, when fewer than a quorum are trusted,
      the highest counter of all reachable nodes and the clock floor).
    """
    if time.monotonic() < state.next_rejoin_check:
        return False
    rejoined = yield from _rejoin_check(state, nodes, seen_untrusted, drawn)
    if rejoined is None:
        # Too few probes answered in time (a loaded client or node): nothing was learnt, so
        # nobody is held back. It used to hold back the other callers of this process for
        # REJOIN_INTERVAL: on a new cluster their first acquires failed "quarantined".
        return False
    if not rejoined:
        # Only a check that made nothing trusted holds the others back (a restarted node in
        # its quarantine: no probe per attempt). A check still in flight holds back nobody:
        # on a new cluster, the callers of this process that found the nodes untrusted while
        # another initialised them probe too, find them trusted (or finish the job) and retry
        # at once, as callers in other processes do, timeout=0 ones included.
        state.next_rejoin_check = time.monotonic() + REJOIN_INTERVAL
    return rejoined


def _rejoin_check(
    state: AliasState,
    nodes: Sequence[NodeView],
    seen_untrusted: Sequence[int],
    drawn: Sequence[int],
) -> Plan[bool | None]:
    """:func:`rejoin_plan`'s probe and rejoin, without its throttle; None when too few
    nodes answered the probe to tell."""
    now = time.monotonic()
    total = len(nodes)
    needed = quorum(total)
    fence = state.keys.fence
    calls: list[Call | None] = [
        None if node.run_id is None else Call(scripts.PROBE, (fence,), ()) for node in nodes
    ]
    for look in range(RACE_LOOKS):
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
        # The probes of the nodes do not run at one instant: a node this caller found without
        # any fence state may have been probed just before another process's initialisation
        # reached it, and another node just after that process's first grant. Look again (up
        # to RACE_LOOKS times in all).
        racing = any(i in seen_untrusted and not int(probes[i][3]) for i in untrusted)
        if look == RACE_LOOKS - 1 or never_granted or not racing:
            break
    counters = {i: int(probes[i][1]) for i in reachable}
    longest = max([state.longest_ttl_ms, *(int(probes[i][2]) for i in reachable)])
    state.longest_ttl_ms = longest
    rejoined_elsewhere = any(i in trusted for i in seen_untrusted)
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
        return rejoined_elsewhere
    rejoin: list[Call | None] = [None] * total
    for i in targets:
        run_id = nodes[i].run_id
        if run_id is not None:
            rejoin[i] = Call(scripts.REJOIN, (fence,), (run_id, value))
    replies = yield Request(rejoin, state.node_timeout * 2, None)
    return rejoined_elsewhere or any(not isinstance(replies[i], NodeFailure) for i in targets)


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
