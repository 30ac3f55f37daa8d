"""The connection budget of one alias (docs/production.md): at most ``MAX_CONNECTIONS``
connections to each node per process, counted across sync callers and every event loop, waiting
(``BLPOP``) connections included.

A channel (one connection per node) takes a slot on every node; a ``BLPOP`` connection one
slot on its node. Blocking waits may hold at most half the budget (rounded down), so lock
calls, releases first, always keep connections of their own; a waiter refused one polls, and
when the whole budget is spent asks the pools to close one connection idle for a second. A
caller that finds the budget full registers a wake-up (called, outside any lock, when a slot
is given back) and asks the pools holding idle connections to close one. A caller whose kind
(the sync callers, or one event loop) holds no connection is *hungry*: while one waits, no
other kind takes a new slot, and every other kind closes its channels as they come back, its
last one included, until the hungry caller got one (with ``MAX_CONNECTIONS=1`` the kinds take
turns).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import math
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import TypeVar

from .. import forks

#: Default of ``MAX_CONNECTIONS`` and ``IDLE_TIMEOUT`` (seconds).
DEFAULT_MAX_CONNECTIONS = 50
DEFAULT_IDLE_TIMEOUT = 300.0
#: How long a call that is not an acquire with a deadline (a release, an extend, a
#: ``timeout=0`` attempt) waits for a free connection, seconds.
SPARE_WAIT = 5.0
#: ``until`` of a call that is not an acquire attempt with a deadline: it waits up to
#: :data:`SPARE_WAIT` for a connection.
SPARE = -1.0
#: A wait refused a blocking connection while the budget is spent closes connections idle
#: at least this long (seconds): a burst's leftovers, not the ones a busy pool cycles through.
ROOM_IDLE = 1.0
#: ... and looks for them at most this often (seconds), however many waits are refused.
ROOM_EVERY = 0.1

Wake = Callable[[], None]
#: A pool's eviction: close one connection idle since before the given ``time.monotonic()``
#: (``math.inf``: any idle one), if it has one.
Evict = Callable[[float], None]
W = TypeVar("W")


class Doorbell:
    """A flag a thread waits on until another sets it: :class:`threading.Event`'s
    ``set``/``clear``/``wait``, on one lock. A signal handler that raises while the waiter
    waits ends the wait with its own exception and leaves nothing broken (an ``Event``'s
    wait can then raise ``RuntimeError: release unlocked lock`` instead, from its
    ``Condition``, hiding a ``KeyboardInterrupt`` or a worker's time limit)."""

    __slots__ = ("_rung",)

    def __init__(self) -> None:
        self._rung = threading.Lock()  # held while not rung
        self._rung.acquire()

    def set(self) -> None:
        with contextlib.suppress(RuntimeError):  # rung already
            self._rung.release()

    def clear(self) -> None:
        self._rung.acquire(blocking=False)

    def wait(self, timeout: float) -> bool:
        """Until rung (True) or ``timeout`` seconds pass (False); rung stays rung."""
        if not self._rung.acquire(timeout=max(timeout, 0.0)):
            return False
        self._rung.release()
        return True


def line_up(waiters: deque[W], waiter: W, *, urgent: bool) -> None:
    """Put ``waiter`` in the queue for a pool's next free channel: a release or an extend
    (``urgent``) at the front, ahead of waiting attempts."""
    if urgent:
        waiters.appendleft(waiter)
    else:
        waiters.append(waiter)


class Budget:
    """Slots per node, shared by the engines (shards) of one alias. Thread-safe."""

    def __init__(
        self,
        nodes: int,
        limit: int = DEFAULT_MAX_CONNECTIONS,
        idle_timeout: float = DEFAULT_IDLE_TIMEOUT,
    ) -> None:
        self.nodes = nodes
        self.limit = limit
        self.blocking_limit = limit // 2
        self.idle_timeout = idle_timeout
        self._reset()

    def _reset(self) -> None:
        self._generation = forks.generation()
        self._mutex = threading.Lock()
        self._used = [0] * self.nodes
        self._blocking = [0] * self.nodes
        self._listeners: dict[object, Wake] = {}
        #: pools that may hold idle connections: each closes one when called (if it can)
        self._evictors: dict[object, Evict] = {}
        #: when :meth:`make_room` last looked for idle connections (``time.monotonic()``)
        self._room_looked = -math.inf
        #: callers waiting that hold no connection of their kind, each with its kind: while
        #: there are any, another kind's channel coming back is closed instead of kept
        self.hungry: dict[object, object] = {}

    def _check_fork(self) -> None:
        if self._generation != forks.generation():  # a child: the parent's slots are not ours
            self._reset()

    def take(
        self,
        nodes: Sequence[int],
        *,
        blocking: bool = False,
        listener: object = None,
        wake: Wake | None = None,
        kind: object = None,
        receipt: list[bool] | None = None,
    ) -> bool:
        """Take a slot on each of ``nodes``; False if one has none left, or if a hungry
        caller of another ``kind`` waits (the slot is its). Then ``wake`` (if given) is
        registered under ``listener``, called once a slot is given back. ``receipt`` (an
        empty list) gets ``True`` in the same step as the slots are taken: a caller that a
        signal handler's exception interrupts on the way back (a ``with`` block's exit is a
        call) still learns it holds them, and gives them back."""
        self._check_fork()
        with self._mutex:
            used, limit = self._used, self.limit
            if (
                (listener in self.hungry or not self._starving_besides(kind))
                and all(used[i] < limit for i in nodes)
                and not (blocking and any(self._blocking[i] >= self.blocking_limit for i in nodes))
            ):
                taken = [u + 1 if i in nodes else u for i, u in enumerate(used)]
                held = self._blocking
                if blocking:
                    held = [b + 1 if i in nodes else b for i, b in enumerate(held)]
                # stores, then one append: no interrupt lands between them
                self._used, self._blocking = taken, held
                if receipt is not None:
                    receipt.append(True)
                return True
            if wake is not None:
                self._listeners[listener] = wake
            return False

    def make_room(self, nodes: Sequence[int]) -> None:
        """A wait found no slot to block in (a blocking ``take`` refused). When the budget
        of one of ``nodes`` is spent, not only the blocking waits' half, every pool closes one
        connection idle for :data:`ROOM_IDLE` seconds, so a later wait blocks: a burst of
        callers leaves the whole budget in idle lock connections, and every wait after it
        polled until ``IDLE_TIMEOUT`` closed them. Connections a busy pool keeps using are
        never idle that long, and stay. Call it holding no pool's lock: pools take theirs."""
        self._check_fork()
        now = time.monotonic()
        with self._mutex:
            if now - self._room_looked < ROOM_EVERY:
                return
            if not any(self._used[i] >= self.limit for i in nodes):
                return
            self._room_looked = now
            evictors = list(self._evictors.values())
        for evict in evictors:
            evict(now - ROOM_IDLE)

    def _starving_besides(self, kind: object) -> bool:
        """A hungry caller of a kind other than ``kind`` waits (hold the mutex)."""
        return any(other is not kind for other in self.hungry.values())

    def should_surrender(self, kind: object) -> bool:
        """A channel of ``kind`` coming back should be closed, not kept: a caller of another
        kind starves and the budget is spent (a slot already free is the hungry caller's)."""
        if not self.hungry:  # the hot path: nobody starves
            return False
        with self._mutex:
            return self._starving_besides(kind) and any(u >= self.limit for u in self._used)

    def give(
        self, nodes: Sequence[int], *, blocking: bool = False, receipt: list[bool] | None = None
    ) -> None:
        """Give back the slots ``take`` took; wakes every registered caller. With the
        ``receipt`` ``take`` filled: only if it is still filled, and it is emptied in the same
        step (so giving back twice, from an interrupted clean-up and its caller's, is one)."""
        if self._generation != forks.generation():
            return  # a slot of the parent's: this process's budget never counted it
        with self._mutex:
            if receipt is not None:
                if not receipt:
                    return
                receipt.clear()
            used = [max(0, u - 1) if i in nodes else u for i, u in enumerate(self._used)]
            held = self._blocking
            if blocking:
                held = [max(0, b - 1) if i in nodes else b for i, b in enumerate(held)]
            self._used, self._blocking = used, held  # stores only: all or nothing
            listeners, self._listeners = self._listeners, {}
        for wake in listeners.values():
            wake()

    def give_after_close(self, nodes: Sequence[int], *, blocking: bool = False) -> None:
        """:meth:`give` on the running event loop's next turn, once the sockets just closed
        there are closed (a transport closes its socket then): a new connection never
        overlaps the old one."""
        asyncio.get_running_loop().call_soon(functools.partial(self.give, nodes, blocking=blocking))

    def forget(self, listener: object) -> None:
        """Drop ``listener``'s wake-up (it got a connection another way, or gave up)."""
        self._check_fork()
        with self._mutex:
            self._listeners.pop(listener, None)
            self.hungry.pop(listener, None)

    def add_evictor(self, owner: object, evict: Evict) -> None:
        self._check_fork()
        with self._mutex:
            self._evictors[owner] = evict

    def remove_evictor(self, owner: object) -> None:
        self._check_fork()
        with self._mutex:
            self._evictors.pop(owner, None)

    def starve(self, listener: object, kind: object) -> None:
        """``listener`` waits and its ``kind`` holds no connection to wait for: every pool
        closes one idle connection now, and the other kinds give back channels as they come
        back meanwhile."""
        self._check_fork()
        with self._mutex:
            self.hungry[listener] = kind
            evictors = list(self._evictors.values())
        for evict in evictors:
            evict(math.inf)

    def in_use(self) -> list[int]:
        """Slots taken per node (for tests and reports)."""
        with self._mutex:
            return list(self._used)
