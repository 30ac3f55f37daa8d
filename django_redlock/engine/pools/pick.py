"""Which idle channel a call takes.

The channel that went back to its pool last is taken first (its connections are the warmest,
and the others may be closed as idle), unless one of its connections is down: a channel whose
connect failed (its node did not answer the handshake in time) fails every call at once while
it waits out its backoff, so it is free again at once and, taken first, would take every
call, while channels whose connections are all up sit idle beside it. A release sent again
at once, or a ``timeout=0`` acquire, would then report a node down that answers on every
other connection. Such a channel is taken only when no idle channel has all its
connections up; when a node is really down every channel has it down, and the order is the
usual one. The channels a piped wait blocks on are taken the same way. A channel passed over
so is asked to reconnect in the background (when its backoff allows): nothing else would
reconnect it, and a burst of calls that needs every channel would find it still down long
after its node came back.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, TypeVar


class _Pooled(Protocol):
    def all_up(self) -> bool: ...

    def reconnect_soon(self) -> None: ...


P = TypeVar("P", bound=_Pooled)


class _Locked(Protocol):
    def locked(self) -> bool: ...


class _LoopPooled(_Pooled, Protocol):
    @property
    def mutex(self) -> _Locked: ...

    @property
    def reserved(self) -> object: ...


L = TypeVar("L", bound=_LoopPooled)


def pick(free: Sequence[_Pooled]) -> int:
    """The index in ``free`` (idle channels, not empty, last returned last) of the one to
    take; -1 (the last) unless it has a connection down and another has none."""
    if free[-1].all_up():
        return -1
    for i in range(len(free) - 2, -1, -1):
        if free[i].all_up():
            for passed_over in free[i + 1 :]:
                passed_over.reconnect_soon()
            return i
    return -1


def apick(channels: Sequence[L]) -> L | None:
    """The channel of an event loop's ``channels`` (last opened last) to take: the last one
    nobody holds (nor was handed as it came back) whose connections are all up, else the
    last one nobody holds, else None."""
    passed_over: list[L] = []
    for channel in reversed(channels):
        if not channel.mutex.locked() and channel.reserved is None:
            if channel.all_up():
                for down in passed_over:
                    down.reconnect_soon()
                return channel
            passed_over.append(channel)
    return passed_over[0] if passed_over else None
