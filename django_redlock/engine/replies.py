"""What plans ask of the nodes and what the nodes answered: the vocabulary between the plans
and the transport (sync and asyncio alike)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from .scripts import Script


@dataclass(frozen=True, slots=True)
class Call:
    """One script call for one node. ``before``: commands written ahead of it in the same
    write (a waiter's ``BLPOP``: the server then runs the script the moment the ``BLPOP``
    returns, with no round trip in between); their replies land in :attr:`Slot.ahead`."""

    script: Script
    keys: tuple[str, ...]
    args: tuple[str | int, ...]
    before: tuple[tuple[str | int, ...], ...] = ()

    def packed_args(self, *, by_sha: bool) -> tuple[str | int, ...]:
        head = ("EVALSHA", self.script.sha) if by_sha else ("EVAL", self.script.source)
        return (*head, len(self.keys), *self.keys, *self.args)


#: The reason of a call whose node did not answer by the request's deadline.
TIMED_OUT = "timed out"
#: The reason of a call still unanswered when the request was settled early (its outcome was
#: already decided by the other replies): the node may be healthy, it was just not waited for.
NOT_AWAITED = "not awaited (the attempt was decided without its reply)"
#: The reason of a node left out because a quorum of the others was asked first (and won).
NOT_ASKED = "not asked (a quorum of the other nodes was asked first)"
#: The reason of a connected node a plan had no call for (a quorum-first lease's renewal or
#: release skips the nodes the lease never reached).
NOT_INVOLVED = "not asked (the call does not concern it)"
#: Reasons that say nothing against the node: it may answer (and have run the call) later,
#: or was not asked.
SILENT = (TIMED_OUT, NOT_AWAITED, NOT_ASKED, NOT_INVOLVED)


@dataclass(frozen=True, slots=True)
class NodeFailure:
    """A call that got no usable answer: the node is down, timed out, or replied an error.

    ``sent`` is False when the call never left this process (node down, or too far behind):
    such a call cannot have taken effect on the node."""

    reason: str
    sent: bool = True
    #: the call's :class:`Slot` when it was sent and not answered yet (timed out, or not
    #: awaited): the reply may still come, read in order by the connection's next call
    late: Slot | None = field(default=None, compare=False, repr=False)

    def __str__(self) -> str:
        return self.reason


class Slot:
    """The reply to one call, filled when the node answers (or fails); ``notify`` (asyncio)
    is called after each fill, so a waiting request wakes once it is settled."""

    __slots__ = ("ahead", "call", "done", "notify", "value")

    def __init__(self, call: Call | None, notify: Callable[[], None] | None = None) -> None:
        self.call = call
        self.done = False
        self.value: Any = None
        self.notify = notify
        #: the slots of the call's ``before`` commands, in order
        self.ahead: tuple[Slot, ...] = ()

    def fill(self, value: Any) -> None:
        self.value = value
        self.done = True
        if self.notify is not None:
            self.notify()

    def result(self, *, expired: bool = True) -> Any:
        """The reply, or a :class:`NodeFailure` when none arrived: ``timed out`` once the
        request's deadline has passed (``expired``), else ``not awaited``."""
        if self.done:
            return self.value
        return NodeFailure(TIMED_OUT if expired else NOT_AWAITED, late=self)


def failed_slot(call: Call | None, reason: str) -> Slot:
    """A slot for a call that never left this process (so it cannot have taken effect)."""
    slot = Slot(call)
    slot.fill(NodeFailure(reason, sent=False))
    return slot


def is_noscript(value: Any) -> bool:
    return isinstance(value, NodeFailure) and (
        value.reason.startswith("NoScriptError") or "NOSCRIPT" in value.reason
    )


@dataclass
class Request:
    """Send ``calls`` (index = node) and collect replies until ``settled`` or ``timeout``.

    ``wait`` False: fire and forget (the replies are read later, in order, and dropped).
    ``later``: calls to more nodes (a hedge), sent only if the request is not settled
    ``hedge`` seconds after ``calls`` went out, or sooner once every call has answered; their
    nodes count as still to answer until then, and the replies of all calls are collected
    from then on. A node of ``later`` never sent to gets ``NodeFailure(NOT_ASKED, sent=False)``.
    ``ahead``: filled by the transport when a call carried ``before`` commands: per node, their
    replies in order (a :class:`NodeFailure` for each one that got none). ``unanswered``: called
    with a node's index when its call could not be sent, or its connection failed (or the
    node answered an error) before its reply was read, also after a waited request returned.
    """

    calls: list[Call | None]
    timeout: float
    settled: Callable[[list[Slot]], bool] | None = None
    wait: bool = True
    later: list[Call | None] | None = None
    hedge: float = 0.0
    ahead: dict[int, list[Any]] | None = None
    unanswered: Callable[[int], None] | None = None

    def later_nodes(self) -> set[int]:
        """The nodes ``later`` has a call for."""
        return {i for i, call in enumerate(self.later or ()) if call is not None}


def statuses_of(replies: Sequence[Any]) -> list[int | None]:
    """Each reply's status (the script's first element); None for a node that failed."""
    return [None if isinstance(r, NodeFailure) else int(r[0]) for r in replies]


def unanswered(reply: Any) -> bool:
    """True for a call that was sent and not answered when its request was decided: its reply
    may still come (and the node may still run it)."""
    return isinstance(reply, NodeFailure) and reply.late is not None


def result_of(slot: Slot, *, expired: bool) -> Any:
    """A slot's reply; ``NOT_ASKED`` for a hedge call never sent (a slot without a call that
    was never filled: see ``transport.base.hold_for_later``)."""
    if slot.call is None and not slot.done:
        return NodeFailure(NOT_ASKED, sent=False)
    return slot.result(expired=expired)


class Labelled(Protocol):
    """A node as error messages name it."""

    label: str


def node_errors(nodes: Sequence[Labelled], replies: Sequence[Any]) -> dict[str, str]:
    """Per node label, why it failed (the nodes merely not awaited are left out)."""
    return {
        node.label: str(reply)
        for node, reply in zip(nodes, replies, strict=True)
        if isinstance(reply, NodeFailure)
        and reply.reason not in (NOT_AWAITED, NOT_ASKED, NOT_INVOLVED)
    }


def granted_per_node(replies: Sequence[Any], yes: Callable[[Any], bool]) -> list[bool | None]:
    """Per node: True if it said yes, False if it said no or never got the call, None if it
    got the call but did not answer (it may have executed it)."""
    return [
        (None if reply.sent else False) if isinstance(reply, NodeFailure) else yes(reply)
        for reply in replies
    ]
