"""One call on every connected node, all replies awaited (until the node timeout): the plan of
fenced records (:mod:`..scripts.records`), which need every node's answer, not a quorum's."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..replies import Call, Request
from ..state import AliasState, NodeView, Plan


def each_node_plan(
    state: AliasState,
    nodes: Sequence[NodeView],
    call: Call,
    reached: Sequence[bool] = (),
) -> Plan[list[Any]]:
    """Send ``call`` to every node known to be up (``reached``: only to those marked True);
    returns the replies in node order (a ``NodeFailure`` for a node that gave none)."""
    calls: list[Call | None] = [
        call if node.run_id is not None and (not reached or reached[i]) else None
        for i, node in enumerate(nodes)
    ]
    replies = yield Request(calls, state.node_timeout)
    return list(replies)
