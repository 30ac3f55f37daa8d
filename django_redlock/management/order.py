"""What ``manage.py redlock order`` prints: the lock-order checker's edges as the nodes hold
them (every process of the run), inverted pairs flagged (docs/admin-and-cli.md)."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Any

from ..locking.ordering.shared import Recorded, Shape

ORDER_HEADERS = ("HELD", "TAKEN", "PROCESSES", "INVERTED", "FIRST AT", "PID")


@dataclass
class OrderReport:
    """Every edge read (merged over the aliases) and the inverted pairs among them."""

    edges: list[Recorded]

    def __post_init__(self) -> None:
        merged: dict[Any, Recorded] = {}
        for record in self.edges:
            known = merged.get(record.edge)
            if known is None:
                merged[record.edge] = record
            else:
                known.processes = max(known.processes, record.processes)
                known.first = known.first or record.first
        self.edges = sorted(merged.values(), key=lambda r: (r.edge[0], r.edge[1]))
        keys = set(merged)
        self.inverted: list[tuple[Shape, Shape]] = sorted(
            {(min(a, b), max(a, b)) for a, b in keys if (b, a) in keys}
        )
        self.cycles = cycles(keys)

    def is_inverted(self, record: Recorded) -> bool:
        return (record.edge[1], record.edge[0]) in {r.edge for r in self.edges}


def _shortest_path(after: dict[Shape, list[Shape]], start: Shape, end: Shape) -> list[Shape]:
    """The shortest path from ``start`` to ``end`` of two or more edges (empty: none)."""
    parent: dict[Shape, Shape] = {}
    queue = deque(s for s in after.get(start, ()) if s != end)
    for first in queue:
        parent[first] = start
    while queue:
        node = queue.popleft()
        for nxt in after.get(node, ()):
            if nxt in parent or nxt == start:
                continue
            parent[nxt] = node
            if nxt == end:
                path = [end]
                while path[-1] != start:
                    path.append(parent[path[-1]])
                return path[::-1]
            queue.append(nxt)
    return []


def cycles(edges: set[tuple[Shape, Shape]]) -> list[tuple[Shape, ...]]:
    """Cycles of three or more shapes (``A -> B -> C -> A``: three callers can deadlock with
    no pair inverted): for each edge ``X -> S``, the shortest way from S back to X that is not
    the edge itself, each cycle once, starting at its smallest shape."""
    after: dict[Shape, list[Shape]] = {}
    for a, b in sorted(edges):
        after.setdefault(a, []).append(b)
    found: set[tuple[Shape, ...]] = set()
    for held, taken in sorted(edges):
        path = _shortest_path(after, taken, held)
        if len(path) >= 3 and len(set(path)) == len(path):
            low = path.index(min(path))
            found.add(tuple(path[low:] + path[:low]))
    return sorted(found, key=lambda c: (len(c), c))


def shape_text(shape: Shape) -> str:
    """``order:{n}``, or ``order:{n} (alias 'fast')`` off the default alias."""
    alias, text = shape
    return text if alias == "default" else f"{text} (alias {alias!r})"


def order_row(report: OrderReport, record: Recorded) -> list[object]:
    first = record.first
    return [
        shape_text(record.edge[0]),
        shape_text(record.edge[1]),
        record.processes,
        "yes" if report.is_inverted(record) else "",
        first.where if first else "?",
        first.pid if first else "?",
    ]


def _shape_document(shape: Shape) -> dict[str, str]:
    return {"alias": shape[0], "shape": shape[1]}


def order_document(report: OrderReport) -> dict[str, Any]:
    """``--json``: ``edges`` (held, taken, processes, inverted, first), ``inverted`` and
    ``cycles``."""
    edges = []
    for record in report.edges:
        first = record.first
        edges.append(
            {
                "held": _shape_document(record.edge[0]),
                "taken": _shape_document(record.edge[1]),
                "processes": record.processes,
                "inverted": report.is_inverted(record),
                "first": None
                if first is None
                else {
                    "where": first.where,
                    "pid": first.pid,
                    "host": first.host,
                    "stack": first.stack,
                },
            }
        )
    return {
        "edges": edges,
        "inverted": [[_shape_document(a), _shape_document(b)] for a, b in report.inverted],
        "cycles": [[_shape_document(s) for s in cycle] for cycle in report.cycles],
    }


def inverted_details(report: OrderReport) -> list[str]:
    """For each inverted pair: both orders' first stacks (the text output's tail)."""
    by_edge = {record.edge: record for record in report.edges}
    lines: list[str] = []
    for a, b in report.inverted:
        lines.append(f"Inverted: {shape_text(a)} <-> {shape_text(b)}")
        for edge in ((a, b), (b, a)):
            first = by_edge[edge].first
            lines.append(f"  {shape_text(edge[1])} taken while holding {shape_text(edge[0])}:")
            stack = first.stack if first else "  (no stack recorded)\n"
            lines.extend("  " + line for line in stack.rstrip("\n").splitlines())
    for cycle in report.cycles:
        lines.append("Cycle: " + " -> ".join(shape_text(s) for s in (*cycle, cycle[0])))
        for held, taken in zip(cycle, (*cycle[1:], cycle[0]), strict=True):
            first = by_edge[(held, taken)].first
            where = first.where if first else "?"
            lines.append(f"  {shape_text(taken)} taken while holding {shape_text(held)} at {where}")
    return lines
