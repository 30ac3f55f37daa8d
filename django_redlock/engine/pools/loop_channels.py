"""The asyncio side of an engine's connections: each event loop's :class:`~.loops.LoopPools`
(made on first use, closed at the loop's shutdown), and plans run on their channels."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import time
import weakref
from collections.abc import AsyncGenerator, Awaitable, Callable
from typing import Any, TypeVar

from ..drive import PlanMaker, adrive
from ..state import AliasState
from ..transport.aio import AsyncChannel, AsyncConnectionFactory
from .budget import SPARE, SPARE_WAIT, Budget, line_up
from .loops import LoopPools, finish
from .pick import all_up, apick, reconnect_down

T = TypeVar("T")
J = TypeVar("J")


class LoopChannels:
    """Each event loop's channels of one engine (its :class:`~.channels.ChannelPools`'
    ``loops``), within the alias's budget."""

    def __init__(
        self,
        state: AliasState,
        labels: list[str],
        factories: list[AsyncConnectionFactory],
        budget: Budget,
        spent: Callable[[], str],
        check_fork: Callable[[], None],
        reopen: Callable[[], None],
    ) -> None:
        self.state = state
        self.labels = labels
        self._async_factories = factories
        self.budget = budget
        self._every = tuple(range(len(labels)))
        self._spent = spent
        self._check_fork = check_fork
        #: the sync pools' :meth:`~.channels.ChannelPools.reopen`: a call after a close
        self._reopen = reopen
        self.start_afresh()

    def start_afresh(self) -> None:
        """No loop's pools: at creation, and in a forked child (the parent's are dropped)."""
        #: each event loop's pools, and the suspended generator that closes them at its
        #: shutdown
        self.pools_of: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, LoopPools] = (
            weakref.WeakKeyDictionary()
        )
        self._closers: weakref.WeakKeyDictionary[
            asyncio.AbstractEventLoop, AsyncGenerator[None, None]
        ] = weakref.WeakKeyDictionary()

    async def loop_pools(self) -> LoopPools:
        """This event loop's pools, made (with their closer) on first use."""
        loop = asyncio.get_running_loop()
        pools = self.pools_of.get(loop)
        if pools is None:
            pools = self.pools_of[loop] = LoopPools(loop, self.budget, len(self.labels))
            closer = _close_at_loop_shutdown(pools)
            await closer.asend(None)
            self._closers[loop] = closer
        return pools

    def _areturn(self, pools: LoopPools, channel: AsyncChannel) -> None:
        """``channel`` is free again: pooled, or closed while another kind starves (unless a
        node still owes a reply on it: a paused node's acquire, whose lease's release must
        follow it on that connection, else the node may run the release first)."""
        surrender = channel in pools.channels and self.budget.should_surrender(pools)
        if surrender and not channel.pending():
            pools.channels.remove(channel)
            pools.retire(channel)
            return
        channel.idle_since = time.monotonic()
        if not all_up(channel):
            pools.down_idle = True
        if pools.waiters:
            # handed to the first waiting task: the task that returned it, calling again at
            # once (a tight loop), would otherwise take it back before the woken one runs,
            # every time, and the others starved until their wait for a connection ran out
            channel.reserved = pools.wake_one()

    async def _acheckout(self, pools: LoopPools, until: float) -> AsyncChannel | None:
        """Asyncio twin of :meth:`_checkout`: an idle channel, None when the budget gave a
        slot for a new one, or a stand-in past ``until``."""
        urgent = until == SPARE  # a release or an extend: served before waiting attempts
        if urgent:
            until = time.monotonic() + SPARE_WAIT
        loop = asyncio.get_running_loop()
        #: this call's key in the budget, kept across its wake-ups: a hungry caller stays
        #: hungry (served first) until it leaves, not only until its first wake-up
        caller = object()
        try:
            while True:
                channel = apick(pools.channels)
                if channel is not None:
                    return channel
                future: asyncio.Future[None] = loop.create_future()
                wake = functools.partial(pools.wake_threadsafe, future)
                fed = bool(pools.channels)
                if self.budget.take(self._every, listener=caller, wake=wake, kind=pools):
                    return None
                remaining = until - time.monotonic()
                if remaining <= 0:
                    stand_in = AsyncChannel(
                        self.labels, self._async_factories, self.state.node_timeout, self._spent()
                    )
                    stand_in.idle_since = -1.0
                    return stand_in
                line_up(pools.waiters, future, urgent=urgent)
                if not fed:  # nothing of ours will come back: ask the others for one
                    self.budget.starve(caller, pools)
                timer = loop.call_later(remaining, finish, future)
                try:
                    await future
                except BaseException:  # cancelled: a channel handed to it goes to the next
                    handed = _handed(pools, future)
                    if handed is not None:
                        self._areturn(pools, handed)
                    raise
                finally:
                    timer.cancel()
                    with contextlib.suppress(ValueError):
                        pools.waiters.remove(future)
                handed = _handed(pools, future)
                if handed is not None:
                    return handed
        finally:
            self.budget.forget(caller)

    async def arun(
        self, make_plan: PlanMaker[T], pinned: Any = None, until: float = SPARE
    ) -> tuple[T, AsyncChannel]:
        """The asyncio twin of :meth:`run`: ``make_plan`` run on a channel of this event loop
        (``pinned`` if it is one). Plain coroutines only, no async generator (a context
        manager made with ``asynccontextmanager`` is one): a release made while the loop
        shuts down (an ``@alock`` generator closed by ``shutdown_asyncgens``) must not start
        one, which asyncio refuses to finalize then (a ResourceWarning; an error where
        warnings are errors)."""
        return await self.arun_with(adrive, make_plan, pinned, until)

    async def arun_with(
        self,
        driver: Callable[[J, AsyncChannel], Awaitable[T]],
        job: J,
        pinned: Any = None,
        until: float = SPARE,
    ) -> tuple[T, AsyncChannel]:
        """:meth:`arun` with another driver: ``await driver(job, channel)`` (the single-node
        lane's, see :mod:`..alane`)."""
        self._check_fork()
        if self.state.closed:  # closed by a settings change, and used again
            self._reopen()
        pools = self.pools_of.get(asyncio.get_running_loop()) or await self.loop_pools()
        if isinstance(pinned, AsyncChannel) and pinned in pools.channels:
            used = False
            try:
                async with pinned.mutex:
                    if pinned in pools.channels:  # not closed as idle meanwhile
                        used = True
                        return await driver(job, pinned), pinned
            finally:
                if used:  # free again: a task waiting for a channel gets it, as below
                    self._areturn(pools, pinned)
        if pools.down_idle:  # an idle channel has a connection down: start reconnecting it
            idle = [c for c in pools.channels if not c.mutex.locked()]
            pools.down_idle = reconnect_down(idle)
        while True:
            channel = apick(pools.channels)
            if channel is None:
                channel = await self._acheckout(pools, until)
                if channel is None:  # a slot for a new one
                    return await self._arun_new(pools, driver, job)
                if channel.idle_since < 0:  # a stand-in
                    return await driver(job, channel), channel
            # An unlocked channel with a task already woken for it makes this task wait for
            # its mutex; meanwhile the channel may be closed (idle, or evicted for a starving
            # pool): then it is not ours to use, pick again.
            await channel.mutex.acquire()
            if channel in pools.channels:
                break
            channel.mutex.release()
        try:
            try:
                return await driver(job, channel), channel
            finally:
                channel.mutex.release()
        finally:
            self._areturn(pools, channel)

    async def _arun_new(
        self, pools: LoopPools, driver: Callable[[J, AsyncChannel], Awaitable[T]], job: J
    ) -> tuple[T, AsyncChannel]:
        """:meth:`arun_with` on a new channel of this loop, on a slot the budget gave; held while
        it connects, so no other task uses it."""
        channel = AsyncChannel(
            self.labels,
            self._async_factories,
            self.state.node_timeout,
            busy_poll=self.state.busy_poll,
        )
        async with channel.mutex:
            pools.channels.append(channel)
            pools.opened()
            try:
                await channel.connect()
            except BaseException:  # cancelled while connecting: never leave it half-made
                pools.channels.remove(channel)
                # no await: a second cancel here would skip the give-back, or give the
                # slot back before the socket is closed; retire gives it once it is
                pools.retire(channel)
                raise
            try:
                result = await driver(job, channel)
            finally:
                channel.idle_since = time.monotonic()
        self._areturn(pools, channel)
        return result, channel

    async def arun_blocking_with(
        self,
        driver: Callable[[J, AsyncChannel], Awaitable[tuple[T, list[Any]]]],
        job: J,
        pools: LoopPools,
        channel: AsyncChannel | None,
    ) -> tuple[T, list[Any]]:
        """Asyncio twin of :meth:`.channels.ChannelPools.run_blocking_with`: on ``channel``
        (None: a new one, on a blocking slot already taken) of this event loop."""
        reusable = False
        try:
            if channel is None:
                channel = AsyncChannel(self.labels, self._async_factories, self.state.node_timeout)
                await channel.connect()
            result, ahead = await driver(job, channel)
            reusable = not channel.pending()
            return result, ahead
        finally:
            if reusable and channel is not None:
                channel.idle_since = time.monotonic()
                pools.blocking.append(channel)
            else:  # given up mid-call (cancelled) or a reply still due: never reused
                if channel is not None:
                    pools.retire(channel, blocking=True)
                else:
                    pools.give_soon(self._every, blocking=True)


#: How long the loop's shutdown lets calls still running finish before closing its
#: connections (see :func:`_close_at_loop_shutdown`), seconds.
SHUTDOWN_GRACE = 1.0


def _handed(pools: LoopPools, future: asyncio.Future[None]) -> AsyncChannel | None:
    """The channel handed to the task waiting on ``future`` (see ``_areturn``), no longer
    reserved; None if none was (or it was closed meanwhile)."""
    for channel in pools.channels:
        if channel.reserved is future:
            channel.reserved = None
            return channel
    return None


async def _close_at_loop_shutdown(pools: LoopPools) -> AsyncGenerator[None, None]:
    """Suspended once per event loop; ``loop.shutdown_asyncgens()`` (run by ``asyncio.run``)
    closes it, which closes that loop's connections before the loop goes away.

    The shutdown closes the loop's other async generators at the same time: an ``@alock``
    generator among them releases its lease as it closes. Their first steps run first, and
    the calls they started finish (within :data:`SHUTDOWN_GRACE`) before the connections
    close; else such a release found its connection closed and the name stayed locked until
    a background give-back got through."""
    try:
        yield
        await asyncio.Event().wait()  # never resumed on purpose
    finally:
        for _ in range(3):  # the other generators' closing steps, up to their first call
            await asyncio.sleep(0)
        deadline = time.monotonic() + SHUTDOWN_GRACE
        while pools.busy() and time.monotonic() < deadline:
            await asyncio.sleep(0.001)
        await pools.close()
