"""The checker's records on an alias's nodes (see :mod:`django_redlock.engine.plans.order_edges`):
what other processes of the run recorded, read back when this one records a new edge, and by
``manage.py redlock order``."""

from __future__ import annotations

import json
import logging
import os
import socket
from dataclasses import dataclass
from typing import Any

from ...engine import ORDER_TTL, Engine, order_edges

# docs/index.md: one logger name (records carry .module)
logger = logging.getLogger("django_redlock")

#: One shape of one alias.
Shape = tuple[str, str]
Edge = tuple[Shape, Shape]


@dataclass(frozen=True)
class FirstSeen:
    """Where an edge was recorded first: the process and its stack."""

    stack: str
    where: str
    pid: int
    host: str

    def dumps(self) -> str:
        return json.dumps(
            {"stack": self.stack, "where": self.where, "pid": self.pid, "host": self.host}
        )

    @classmethod
    def here(cls, stack: str, where: str) -> FirstSeen:
        return cls(stack, where, os.getpid(), socket.gethostname())

    @classmethod
    def loads(cls, raw: Any) -> FirstSeen | None:
        """A stored value (None when it is missing or unreadable)."""
        if raw is None or raw is False:
            return None
        try:
            value = json.loads(raw.decode() if isinstance(raw, bytes) else raw)
            return cls(str(value["stack"]), str(value["where"]), int(value["pid"]), value["host"])
        except (ValueError, KeyError, TypeError):
            return None


def edge_field(edge: Edge) -> str:
    """The hash field of ``edge`` (JSON: shapes may hold any character)."""
    (from_alias, from_shape), (to_alias, to_shape) = edge
    return json.dumps([from_alias, from_shape, to_alias, to_shape], separators=(",", ":"))


def parse_field(text: str) -> Edge | None:
    try:
        a, b, c, d = json.loads(text)
    except (ValueError, TypeError):
        return None
    return (str(a), str(b)), (str(c), str(d))


def _first(replies: list[Any]) -> FirstSeen | None:
    for reply in replies:
        found = FirstSeen.loads(reply)
        if found is not None:
            return found
    return None


def _call(engine: Engine, *args: str | int) -> tuple[list[Any], dict[str, str]]:
    """One order operation on every node of ``engine`` (a simulated engine keeps them in
    memory): the replies, and the errors of the nodes that did not answer."""
    outcome = engine.order(*args)
    return outcome.values, outcome.errors


def _first_of(engine: Engine, replies: list[Any], errors: dict[str, str]) -> FirstSeen | None:
    """The first stack among ``replies``; the nodes that did not answer logged (DEBUG)."""
    if errors:
        logger.debug("Lock-order records: nodes %s did not answer: %s", sorted(errors), errors)
    return _first(replies)


def publish_args(edge: Edge, seen: FirstSeen) -> tuple[str | int, ...]:
    """The order operation that adds ``edge`` (its first stack kept; not past
    :data:`~django_redlock.engine.plans.order_edges.MAX_FIELDS`) and reads back where its reverse
    was recorded first."""
    reverse = (edge[1], edge[0])
    return (
        "add",
        edge_field(edge),
        seen.dumps(),
        edge_field(reverse),
        int(ORDER_TTL * 1000),
        order_edges.MAX_FIELDS,
    )


def publish(engine: Engine, edge: Edge, seen: FirstSeen) -> FirstSeen | None:
    """Add ``edge`` to ``engine``'s records and return where its reverse was recorded first,
    if any node of ``engine`` has it (see :func:`publish_args`). Best effort: a node that
    does not answer is skipped (logged at DEBUG)."""
    return _first_of(engine, *_call(engine, *publish_args(edge, seen)))


async def apublish(engine: Engine, edge: Edge, seen: FirstSeen) -> FirstSeen | None:
    """Asyncio twin of :func:`publish`: the event loop runs on while the nodes answer."""
    outcome = await engine.aorder(*publish_args(edge, seen))
    return _first_of(engine, outcome.values, outcome.errors)


def lookup(engine: Engine, edge: Edge) -> FirstSeen | None:
    """Where ``edge`` was recorded first, on ``engine``'s nodes (None: nowhere)."""
    return _first_of(engine, *_call(engine, "get", edge_field(edge)))


async def alookup(engine: Engine, edge: Edge) -> FirstSeen | None:
    """Asyncio twin of :func:`lookup`."""
    outcome = await engine.aorder("get", edge_field(edge))
    return _first_of(engine, outcome.values, outcome.errors)


@dataclass
class Recorded:
    """One edge as the nodes of an alias hold it: where first seen, and by how many
    processes (the most any node counted)."""

    edge: Edge
    first: FirstSeen | None
    processes: int


def read_all(engine: Engine) -> tuple[list[Recorded], dict[str, str]]:
    """Every edge recorded on ``engine``'s nodes (merged over the nodes), and the errors of
    the nodes that did not answer."""
    replies, errors = _call(engine, "all")
    found: dict[Edge, Recorded] = {}
    for reply in replies:
        if not reply:
            continue
        pairs = [x.decode() if isinstance(x, bytes) else str(x) for x in reply]
        for field, value in zip(pairs[::2], pairs[1::2], strict=True):
            kind, _, text = field.partition("|")
            edge = parse_field(text)
            if edge is None:
                continue
            entry = found.setdefault(edge, Recorded(edge, None, 0))
            if kind == "s" and entry.first is None:
                entry.first = FirstSeen.loads(value)
            elif kind == "n" and value.isdigit():
                entry.processes = max(entry.processes, int(value))
    return list(found.values()), errors


def clear(engine: Engine) -> tuple[int, dict[str, str]]:
    """Delete ``engine``'s records on every node: how many nodes had some, and the errors."""
    replies, errors = _call(engine, "clear")
    return sum(1 for reply in replies if reply), errors
