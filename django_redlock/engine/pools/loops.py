"""One event loop's connections of one engine: its lock channels, its channels for piped
waits and its idle ``BLPOP`` connections, within the alias's :class:`~.budget.Budget`;
closed when idle for ``IDLE_TIMEOUT`` (a timer on the loop) or when another pool starves."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from typing import Any

from ..transport import redis_py
from ..transport.aio import AsyncChannel
from .budget import Budget


class LoopPools:
    """What one engine keeps per event loop. Used only on its loop's thread, except
    :meth:`evict_soon` (any thread)."""

    def __init__(self, loop: asyncio.AbstractEventLoop, budget: Budget, nodes: int) -> None:
        self.loop = loop
        self.budget = budget
        self.every = tuple(range(nodes))
        self.channels: list[AsyncChannel] = []
        #: an idle channel may have a connection down (see :func:`.pick.reconnect_down`)
        self.down_idle = False
        self.blocking: list[AsyncChannel] = []
        #: idle ``BLPOP`` connections, per node
        self.waiting: list[list[Any]] = [[] for _ in range(nodes)]
        #: tasks waiting for a channel of this loop
        self.waiters: deque[asyncio.Future[None]] = deque()
        self._timer: asyncio.TimerHandle | None = None
        budget.add_evictor(self, self.evict_soon)

    def busy(self) -> bool:
        """True while a call runs on one of this loop's channels."""
        return any(channel.mutex.locked() for channel in self.channels + self.blocking)

    # -- waiting for a channel -------------------------------------------------------------
    def wake_one(self) -> asyncio.Future[None] | None:
        """A channel went back to the pool: the first task waiting for one tries again;
        returns its wake-up (None: nobody waited)."""
        while self.waiters:
            future = self.waiters.popleft()
            if not future.done():
                future.set_result(None)
                return future
        return None

    def wake_threadsafe(self, future: asyncio.Future[None]) -> None:
        """The budget gave a slot back (on any thread): ``future``'s task tries again."""
        with contextlib.suppress(RuntimeError):  # the loop is closed: nobody waits
            self.loop.call_soon_threadsafe(finish, future)

    # -- idle connections ------------------------------------------------------------------
    def opened(self) -> None:
        """A connection was opened: make sure the idle timer runs."""
        if self._timer is None:
            self._timer = self.loop.call_later(self.budget.idle_timeout, self.reap)

    def reap(self) -> None:
        """Close the connections idle for ``IDLE_TIMEOUT``; then run again when the next one
        would be due."""
        self._timer = None
        idle_before = time.monotonic() - self.budget.idle_timeout
        oldest: float | None = None
        for pool, blocking in ((self.channels, False), (self.blocking, True)):
            for channel in list(pool):
                if channel.mutex.locked():
                    continue
                if channel.idle_since < idle_before:
                    pool.remove(channel)
                    self.retire(channel, blocking=blocking)
                else:
                    oldest = min(oldest or channel.idle_since, channel.idle_since)
        for node, conns in enumerate(self.waiting):
            for conn in list(conns):
                if conn.idle_since < idle_before:
                    conns.remove(conn)
                    self.loop.create_task(self._disconnect_and_give(conn, node))
                else:
                    oldest = min(oldest or conn.idle_since, conn.idle_since)
        if oldest is not None or self.channels or self.blocking:
            delay = self.budget.idle_timeout if oldest is None else oldest - idle_before
            self._timer = self.loop.call_later(max(delay, 0.001), self.reap)

    def _evict_one(self, idle_before: float) -> None:
        """Close one connection idle since before ``idle_before`` (for a starving pool,
        ``math.inf``: however recent), if any, but not one a node still owes a reply on (the
        loop reads replies as they come: a paused node's acquire), whose lease's release
        must follow it on that connection; the idle timer keeps running for the rest."""
        for pool, blocking in ((self.channels, False), (self.blocking, True)):
            for channel in pool:
                idle = not channel.mutex.locked() and channel.reserved is None
                if idle and not channel.pending() and channel.idle_since < idle_before:
                    pool.remove(channel)
                    self.retire(channel, blocking=blocking)
                    return
        for node, conns in enumerate(self.waiting):
            for conn in conns:
                if conn.idle_since < idle_before:
                    conns.remove(conn)
                    self.loop.create_task(self._disconnect_and_give(conn, node))
                    return

    def retire(self, channel: AsyncChannel, *, blocking: bool = False) -> None:
        """Close ``channel`` (no longer in a pool); its slots come back once its sockets are
        closed, the ones of reconnects it cancelled included."""
        stopped = [task for task in channel.close_now() if not task.done()]
        if not stopped:
            self.give_soon(self.every, blocking=blocking)
            return
        left = [len(stopped)]

        def one_stopped(_: object) -> None:
            left[0] -= 1
            if left[0] == 0:  # each closed its socket in its last step, before this
                self.give_soon(self.every, blocking=blocking)

        for task in stopped:
            task.add_done_callback(one_stopped)

    def give_soon(self, nodes: tuple[int, ...], *, blocking: bool = False) -> None:
        """Give slots back once the sockets just closed are closed (see
        :meth:`~.budget.Budget.give_after_close`)."""
        self.budget.give_after_close(nodes, blocking=blocking)

    async def _disconnect_and_give(self, conn: Any, node: int) -> None:
        await _disconnect(conn)
        self.give_soon((node,), blocking=True)

    def evict_soon(self, idle_before: float) -> None:
        """The budget wants room: close one connection of this loop idle since before
        ``idle_before`` (any thread)."""
        try:
            self.loop.call_soon_threadsafe(self._evict_one, idle_before)
        except RuntimeError:  # the loop is closed without closing its pools: reclaim them
            self.reclaim()

    def reclaim(self) -> None:
        """The loop closed without closing its pools: close every connection now (their
        sockets, which the closed loop never will) and give their slots back."""
        self._forget_all()
        for conns in self.waiting:
            for conn in conns:
                with contextlib.suppress(Exception):
                    redis_py.abandon(conn)
        self._give_all()

    def _forget_all(self) -> list[asyncio.Task[bool]]:
        """Close every lock channel and forget them; returns the reconnects it cancelled."""
        self.budget.remove_evictor(self)
        stopped: list[asyncio.Task[bool]] = []
        for channel in self.channels + self.blocking:
            with contextlib.suppress(Exception):
                stopped += channel.close_now()
        return stopped

    def _give_all(self) -> None:
        """Give back the slots of every connection :meth:`_forget_all` closed."""
        for pool, blocking in ((self.channels, False), (self.blocking, True)):
            while pool:
                pool.pop()
                self.budget.give(self.every, blocking=blocking)
        for node, conns in enumerate(self.waiting):
            while conns:
                conns.pop()
                self.budget.give((node,), blocking=True)

    async def close(self) -> None:
        """Close every connection of this loop (at the loop's shutdown); the slots come back
        once the sockets are closed."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        conns = [c for per_node in self.waiting for c in per_node]
        stopped = self._forget_all()
        try:
            for conn in conns:
                await _disconnect(conn)
            if stopped:  # let each cancelled reconnect close its socket before the loop closes
                await asyncio.gather(*stopped, return_exceptions=True)
            await asyncio.sleep(0)  # the transports closed above close their sockets now
        finally:
            self._give_all()


def finish(future: asyncio.Future[None]) -> None:
    """Wake the task waiting on ``future`` (once; a wake-up or a timer may come first)."""
    if not future.done():
        future.set_result(None)


async def _disconnect(conn: Any) -> None:
    with contextlib.suppress(Exception):
        await conn.disconnect(nowait=True)
