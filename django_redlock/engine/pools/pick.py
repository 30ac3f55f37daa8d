"""Which idle channel a call takes, and reconnecting idle channels with a connection down.

The channel that went back to its pool last is taken first (its connections are the warmest,
and the others may be closed as idle), unless one of its connections is down: a channel whose
connect failed (its node did not answer the handshake in time) fails every call at once while
it waits out its backoff, so it is free again at once and, taken first, would take every
call, while channels whose connections are all up sit idle beside it. A release sent again
at once, or a ``timeout=0`` acquire, would then report a node down that answers on every
other connection. Such a channel is taken only when no idle channel has all its
connections up; when a node is really down every channel has it down, and the order is the
usual one. The channels a piped wait blocks on are taken the same way.

Passed over, such a channel would stay down until a burst of calls needs every channel, long
after its node came back: a pool that got one back asks its idle channels to reconnect
(:func:`reconnect_down`) at its next checkouts, until none is down.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Protocol, TypeVar


class _Link(Protocol):
    @property
    def connected(self) -> bool: ...

    @property
    def revives_inline(self) -> bool: ...

    def usable(self) -> bool: ...


class _Pooled(Protocol):
    @property
    def links(self) -> Sequence[_Link]: ...


class _Locked(Protocol):
    def locked(self) -> bool: ...


class _LoopPooled(_Pooled, Protocol):
    @property
    def mutex(self) -> _Locked: ...

    @property
    def reserved(self) -> object: ...


L = TypeVar("L", bound=_LoopPooled)


def all_up(channel: _Pooled) -> bool:
    """True while every connection of ``channel`` is up."""
    return all(link.connected for link in channel.links)


def pick(free: Sequence[_Pooled]) -> int:
    """The index in ``free`` (idle channels, not empty, last returned last) of the one to
    take; -1 (the last) unless it has a connection down and another has none."""
    if all_up(free[-1]):
        return -1
    for i in range(len(free) - 2, -1, -1):
        if all_up(free[i]):
            return i
    return -1


def apick(channels: Sequence[L]) -> L | None:
    """The channel of an event loop's ``channels`` (last opened last) to take: the last one
    nobody holds (nor was handed as it came back) whose connections are all up, else the
    last one nobody holds, else None."""
    spare = None
    for channel in reversed(channels):
        if not channel.mutex.locked() and channel.reserved is None:
            if all_up(channel):
                return channel
            if spare is None:
                spare = channel
    return spare


def reconnect_down(idle: Iterable[_Pooled]) -> bool:
    """Start a background reconnect of each connection down among the ``idle`` channels, when
    its backoff allows, but not of one the next call on its channel reconnects itself;
    True if a connection is still down."""
    down = False
    for channel in idle:
        for link in channel.links:
            if not link.connected:
                down = True
                if not link.revives_inline:
                    link.usable()
    return down
