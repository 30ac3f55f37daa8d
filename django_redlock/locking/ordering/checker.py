"""The lock-order checker: per name shape, which shapes a thread or task held when it took
another; a warning the first time two shapes are seen taken in both orders.

Only a new edge does work: its stack is captured, it is recorded in this process and on the
nodes of the alias of the lock being taken (one Lua call per node, which also reads the
reverse edge: other processes of the run recorded it there). An edge known to this process
costs one dict lookup per lease held.
"""

from __future__ import annotations

import logging
import threading
import warnings
from collections.abc import Iterable, Iterator
from typing import Any, Protocol

from ...engine import Engine
from .. import context
from . import shared
from .shapes import masked, shape
from .shared import Edge, FirstSeen, Shape
from .stacks import caller_stack, user_stacklevel

# docs/index.md: one logger name (records carry .module)
logger = logging.getLogger("django_redlock")

#: A lease's shape (set when it was taken with the checker on).
SHAPE_ATTR = "_redlock_order_shape"

#: At most this many edges per process: names whose varying part is not masked (slugs, e-mail
#: addresses) make a shape each; past it, new edges are not recorded (logged once).
MAX_EDGES = 10000


class Taker(Protocol):
    """What the checker needs of a manager: its alias and its (first) engine."""

    @property
    def alias(self) -> str: ...

    engine: Engine


class Recorder:
    """The edges this process recorded (with where each was first seen) and the inverted
    pairs it warned about."""

    def __init__(self) -> None:
        self.edges: dict[Edge, FirstSeen] = {}
        self.warned: set[frozenset[Shape]] = set()
        self.full = False
        self.mutex = threading.Lock()

    def reset(self) -> None:
        """Forget what this process recorded and warned about (the nodes keep theirs)."""
        with self.mutex:
            self.edges.clear()
            self.warned.clear()
            self.full = False


RECORDER = Recorder()


def _held_shapes(taking: set[tuple[str, str]]) -> dict[Shape, Any]:
    """The shapes this thread or task holds now (each with one of its leases), except the
    names being taken (re-taking a held name is not an ordering)."""
    found: dict[Shape, Any] = {}
    for key, lease in context.held_now():
        if key in taking:
            continue
        alias = key[0] or ""
        held = (alias, getattr(lease, SHAPE_ATTR, None) or masked(key[1]))
        found.setdefault(held, lease)
    return found


#: What recording an edge asks of the nodes: the engine of the alias being taken, the held
#: lease (its manager's engine has the reverse when the pair spans two aliases), the edge and
#: where it is seen now; answered with where the reverse was recorded first (None: nowhere).
Ask = tuple[Engine, Any, Edge, FirstSeen]


def taking(manager: Taker, names: Iterable[str]) -> list[str]:
    """Record that this thread or task is about to take ``names`` (several: one ``lock_many``
    set, all or nothing, so no order among them) on ``manager``'s alias; warn about an order
    inverted against one recorded before. Returns each name's shape (see :func:`mark`)."""
    shapes, new = _new_edges(manager, names)
    for ask, before in _claimed(new):
        _conclude(ask, before, _published(*ask))
    return shapes


async def ataking(manager: Taker, names: Iterable[str]) -> list[str]:
    """Asyncio twin of :func:`taking`: a new edge's call to the nodes does not block the
    event loop."""
    shapes, new = _new_edges(manager, names)
    for ask, before in _claimed(new):
        _conclude(ask, before, await _apublished(*ask))
    return shapes


def _new_edges(manager: Taker, names: Iterable[str]) -> tuple[list[str], list[Ask]]:
    """The shapes of ``names``, and the edges to them from what is held that this process
    has not recorded yet (none once it recorded :data:`MAX_EDGES`)."""
    alias, engine = manager.alias, manager.engine
    names = list(names)
    shapes = [shape(name) for name in names]
    held = _held_shapes({(alias, name) for name in names})
    if not held or RECORDER.full:
        return shapes, []
    new: list[Ask] = []
    edges = RECORDER.edges
    seen: FirstSeen | None = None
    for to_shape in dict.fromkeys(shapes):
        target = (alias, to_shape)
        for source, lease in held.items():
            if source != target and (source, target) not in edges:
                seen = seen or FirstSeen.here(*caller_stack())
                new.append((engine, lease, (source, target), seen))
    return shapes, new


def mark(lease: Any, shape_: str) -> None:
    """Remember ``lease``'s shape (for the edges from it)."""
    setattr(lease, SHAPE_ATTR, shape_)


def _claimed(new: list[Ask]) -> Iterator[tuple[Ask, FirstSeen | None]]:
    """Record each new edge in this process (skipping one another thread recorded
    meanwhile; none past :data:`MAX_EDGES`), with where this process saw its reverse, if it
    did. Each is then shared on the nodes."""
    for ask in new:
        edge, seen = ask[2], ask[3]
        with RECORDER.mutex:
            if edge in RECORDER.edges:
                continue
            if len(RECORDER.edges) >= MAX_EDGES:
                RECORDER.full = True
                logger.warning(
                    "The lock-order checker recorded %d edges: it records no new ones. Names "
                    "whose varying part is not a number, UUID or digest make a shape each: "
                    'take them from a template (@lock("user:{name}")).',
                    MAX_EDGES,
                )
                return
            RECORDER.edges[edge] = seen
            before = RECORDER.edges.get((edge[1], edge[0]))
        yield ask, before


def _conclude(ask: Ask, before: FirstSeen | None, found: FirstSeen | None) -> None:
    """Warn about the edge of ``ask`` when its reverse was seen, here (``before``) or on the
    nodes (``found``), and the pair was not warned about yet."""
    before = before or found
    if before is None:
        return
    edge = ask[2]
    pair = frozenset(edge)
    with RECORDER.mutex:
        if pair in RECORDER.warned:
            return
        RECORDER.warned.add(pair)
    _warn(edge, ask[3], before)


def _other_engine(lease: Any, edge: Edge) -> Engine | None:
    """The engine of the held lease's alias, when the pair spans two aliases."""
    if edge[0][0] == edge[1][0]:
        return None
    other = getattr(getattr(lease, "_manager", None), "engine", None)
    return other if isinstance(other, Engine) else None


def _published(engine: Engine, lease: Any, edge: Edge, seen: FirstSeen) -> FirstSeen | None:
    """Add ``edge`` on the nodes of the alias being taken; the reverse as recorded on the
    nodes of the held lock's alias (the same call when it is one alias)."""
    try:
        found = shared.publish(engine, edge, seen)
        other = _other_engine(lease, edge)
        if found is None and other is not None:
            found = shared.lookup(other, (edge[1], edge[0]))
    except Exception as exc:  # a debugging aid never breaks a lock call
        logger.debug("Lock-order records could not be shared: %r", exc)
        return None
    return found


async def _apublished(engine: Engine, lease: Any, edge: Edge, seen: FirstSeen) -> FirstSeen | None:
    """Asyncio twin of :func:`_published`."""
    try:
        found = await shared.apublish(engine, edge, seen)
        other = _other_engine(lease, edge)
        if found is None and other is not None:
            found = await shared.alookup(other, (edge[1], edge[0]))
    except Exception as exc:  # a debugging aid never breaks a lock call
        logger.debug("Lock-order records could not be shared: %r", exc)
        return None
    return found


def describe(shape_: Shape, same_alias: bool) -> str:
    """A shape for messages: ``'order:{n}'``, with its alias when the pair spans two."""
    return repr(shape_[1]) if same_alias else f"{shape_[1]!r} (alias {shape_[0]!r})"


def _warn(edge: Edge, now: FirstSeen, before: FirstSeen) -> None:
    held, taken = edge
    one = held[0] == taken[0]
    a, b = describe(held, one), describe(taken, one)
    on = f" on alias {held[0]!r}" if one else ""
    message = (
        f"Lock order inversion{on}: {b} is being taken while {a} is held, and {a} was taken "
        f"while {b} was held (pid {before.pid} on {before.host}). Two callers doing both at "
        "once can wait for each other until a timeout. Take them in one order everywhere, or "
        "together with lock_many() (docs/production.md, Ordering locks).\n"
        f"{a} taken while holding {b}, first at {before.where}:\n{before.stack}"
        f"{b} taken while holding {a}, now (pid {now.pid}) at {now.where}:\n{now.stack}"
    )
    logger.warning("%s", message)
    warnings.warn(message, RuntimeWarning, stacklevel=user_stacklevel())
