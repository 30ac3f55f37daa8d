"""What ``manage.py redlock order`` prints: the lock-order checker's edges as the nodes hold
them (every process of the run), inverted pairs flagged (docs/admin-and-cli.md)."""

from __future__ import annotations

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

    def is_inverted(self, record: Recorded) -> bool:
        return (record.edge[1], record.edge[0]) in {r.edge for r in self.edges}


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
    """``--json``: ``edges`` (held, taken, processes, inverted, first) and ``inverted``."""
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
    return lines
