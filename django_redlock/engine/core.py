"""The engine of one alias: channels to its nodes, and the sync and async plan drivers."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import weakref
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Sequence
from typing import Any

from .alinks import AsyncChannel, AsyncConnectionFactory
from .links import Channel, ConnectionFactory
from .plans import AliasState, NodeState, Plan
from .waiting import ReleaseWaiter

PlanMaker = Callable[[Sequence[NodeState]], Plan]


class Engine:
    """Runs lock plans against the nodes of one alias. Thread-safe; knows nothing of Django."""

    def __init__(
        self,
        state: AliasState,
        labels: Sequence[str],
        factories: Sequence[ConnectionFactory],
        async_factories: Sequence[AsyncConnectionFactory],
    ) -> None:
        self.state = state
        self.labels = list(labels)
        self._factories = list(factories)
        self._async_factories = list(async_factories)
        self._free: list[Channel] = []
        self._all: list[Channel] = []
        self._guard = threading.Lock()
        self._async_free: weakref.WeakKeyDictionary[
            asyncio.AbstractEventLoop, list[AsyncChannel]
        ] = weakref.WeakKeyDictionary()
        self._closers: weakref.WeakKeyDictionary[
            asyncio.AbstractEventLoop, AsyncGenerator[None, None]
        ] = weakref.WeakKeyDictionary()
        self.waiter = ReleaseWaiter(factories, async_factories)
        self._async_waiting: weakref.WeakKeyDictionary[
            asyncio.AbstractEventLoop, list[list[Any]]
        ] = weakref.WeakKeyDictionary()

    @property
    def node_count(self) -> int:
        return len(self.labels)

    # -- sync ----------------------------------------------------------------------------
    def run(self, make_plan: PlanMaker, pinned: Channel | None = None) -> tuple[Any, Channel]:
        """Run a plan to its end on one channel; returns its result and the channel used."""
        if pinned is not None:
            with pinned.mutex:
                return _drive(make_plan, pinned), pinned
        # pool checkout inline (no context manager): this is the hot path of every call
        with self._guard:
            channel = self._free.pop() if self._free else None
        if channel is None:
            channel = Channel(self.labels, self._factories, self.state.busy_poll)
            with self._guard:
                self._all.append(channel)
        try:
            with channel.mutex:
                return _drive(make_plan, channel), channel
        finally:
            with self._guard:
                self._free.append(channel)

    # -- async ---------------------------------------------------------------------------
    @contextlib.asynccontextmanager
    async def achannel(self, pinned: AsyncChannel | None = None) -> AsyncIterator[AsyncChannel]:
        loop = asyncio.get_running_loop()
        if pinned is not None and pinned in self._async_free.get(loop, ()):
            async with pinned.mutex:
                yield pinned
            return
        pool = self._async_free.get(loop)
        if pool is None:
            pool = self._async_free[loop] = []
            waiting = self._async_waiting[loop] = self.waiter.new_idle()
            closer = _close_at_loop_shutdown(pool, waiting)
            await closer.asend(None)
            self._closers[loop] = closer
        idle = [c for c in pool if not c.mutex.locked()]
        if idle:
            async with idle[-1].mutex:
                yield idle[-1]
            return
        channel = AsyncChannel(self.labels, self._async_factories, self.state.node_timeout)
        async with channel.mutex:  # held while connecting so no other task uses it half-made
            pool.append(channel)
            await channel.connect()
            yield channel

    async def arun(
        self, make_plan: PlanMaker, pinned: AsyncChannel | None = None
    ) -> tuple[Any, AsyncChannel]:
        async with self.achannel(pinned) as channel:
            await channel.prepare()
            plan = make_plan(channel.links)
            try:
                request = next(plan)
                while True:
                    request = plan.send(await channel.execute(request))
            except StopIteration as stop:
                return stop.value, channel

    async def await_release(self, name: str, seconds: float, *, mark: bool = False) -> bool:
        """Wait up to ``seconds`` for a release of ``name`` to wake this task (True if so);
        ``mark``: first mark the name as wanted (when no failed attempt did)."""
        async with self.achannel():  # makes sure this loop's state (and its closer) exists
            pass
        idle = self._async_waiting[asyncio.get_running_loop()]
        return await self.waiter.await_release(
            self.state.wake_key(name), name, seconds, idle, self._mark(name, mark)
        )

    def wait_release(self, name: str, seconds: float, *, mark: bool = False) -> bool:
        """Wait up to ``seconds`` for a release of ``name`` to wake this thread (True if so);
        ``mark``: first mark the name as wanted (when no failed attempt did)."""
        return self.waiter.wait(self.state.wake_key(name), name, seconds, self._mark(name, mark))

    def _mark(self, name: str, mark: bool) -> tuple[str, ...] | None:
        return self.state.mark_command(name) if mark else None

    def close(self) -> None:
        """Close every sync connection (asyncio ones are closed with their event loop)."""
        self.waiter.close()
        with self._guard:
            channels, self._all, self._free = self._all, [], []
        for channel in channels:
            with channel.mutex:
                channel.close()


def _drive(make_plan: PlanMaker, channel: Channel) -> Any:
    channel.prepare()
    plan = make_plan(channel.links)
    try:
        request = next(plan)
        while True:
            request = plan.send(channel.execute(request))
    except StopIteration as stop:
        return stop.value


async def _close_at_loop_shutdown(
    pool: list[AsyncChannel], waiting: list[list[Any]]
) -> AsyncGenerator[None, None]:
    """Suspended once per event loop; ``loop.shutdown_asyncgens()`` (run by ``asyncio.run``)
    closes it, which closes that loop's connections before the loop goes away."""
    try:
        yield
        await asyncio.Event().wait()  # never resumed on purpose
    finally:
        channels = list(pool)
        pool.clear()
        for channel in channels:
            await channel.close()
        for conns in waiting:
            while conns:
                with contextlib.suppress(Exception):
                    await conns.pop().disconnect(nowait=True)
