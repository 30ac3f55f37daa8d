"""The channel pools of one alias's engine: checking a channel out (within the connection
budget, ``MAX_CONNECTIONS``), running a plan on it, blocking and asyncio, and closing idle
ones (``IDLE_TIMEOUT``). :class:`ChannelPools` is the part of
:class:`~.core.Engine` that knows connections; the engine's acquire loops use it."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import threading
import time
import weakref
from collections import deque
from collections.abc import AsyncGenerator, Callable
from typing import Any, TypeVar

from .. import forks
from ..drive import PlanMaker, adrive, drive
from ..state import AliasState
from ..transport.aio import AsyncChannel, AsyncConnectionFactory
from ..transport.blpop import ReleaseWaiter
from ..transport.sync import Channel, ConnectionFactory
from .budget import SPARE_WAIT, Budget
from .loops import LoopPools

T = TypeVar("T")
J = TypeVar("J")

#: ``until`` of a call that is not an acquire attempt with a deadline: it waits up to
#: :data:`~.budget.SPARE_WAIT` for a connection.
SPARE = -1.0


class ChannelPools:
    """Sync channels shared by threads, each event loop's own, and the channels of blocking
    waits, all within one :class:`~.budget.Budget`: an engine's ``pools``. Started afresh by
    the engine (:meth:`start_afresh`) at creation and in a forked child."""

    state: AliasState
    labels: list[str]
    _factories: list[ConnectionFactory]
    _async_factories: list[AsyncConnectionFactory]
    budget: Budget
    _every: tuple[int, ...]
    generation: int
    waiter: ReleaseWaiter
    _free: list[Channel]
    _all: list[Channel]
    _mutex: threading.Lock
    #: threads waiting for a channel (each woken by a channel going back to the pool)
    _sync_waiters: deque[threading.Event]
    #: wakes the idle reaper thread early (engine closed); True while it runs
    _reaper_wake: threading.Event
    _reaping: bool
    _loops: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, LoopPools]
    _closers: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, AsyncGenerator[None, None]]
    #: channels for waits piped with the next attempt; never pinned by a lease
    _blocking_free: list[Channel]
    _blocking_all: list[Channel]
    #: the background give-backs' channel (see :meth:`run_aside`), made on first use
    _aside: Channel | None
    _aside_mutex: threading.Lock

    def __init__(
        self,
        state: AliasState,
        labels: list[str],
        factories: list[ConnectionFactory],
        async_factories: list[AsyncConnectionFactory],
        budget: Budget,
        check_fork: Callable[[], None],
    ) -> None:
        self.state = state
        self.labels = labels
        self._factories = factories
        self._async_factories = async_factories
        self.budget = budget
        self._every = tuple(range(len(labels)))
        #: the engine's: starts the engine (and so these pools) afresh in a forked child
        self._check_fork = check_fork

    def start_afresh(self) -> None:
        """Empty pools: at the engine's creation, and in a forked child (the parent's
        connections are dropped unused)."""
        self.generation = forks.generation()
        self._free = []
        self._all = []
        self._mutex = threading.Lock()
        self._sync_waiters = deque()
        self._reaper_wake = threading.Event()
        self._reaping = False
        self._loops = weakref.WeakKeyDictionary()
        self._closers = weakref.WeakKeyDictionary()
        self.waiter = ReleaseWaiter(
            self._factories, self._async_factories, self.budget, self._opened
        )
        self.budget.add_evictor(self, self._evict_one)
        self._blocking_free = []
        self._blocking_all = []
        self._aside = None
        self._aside_mutex = threading.Lock()

    def _spent(self) -> str:
        """Why a call that found no connection in time fails (its nodes count as down)."""
        return f"no free connection in time (MAX_CONNECTIONS={self.budget.limit} in use)"

    def blocking_channel(self) -> Channel | None:
        """An idle channel for a piped wait, or a new one if the budget allows; else None."""
        with self._mutex:
            if self._blocking_free:
                return self._blocking_free.pop()
            if not self.budget.take(self._every, blocking=True):
                return None
        channel = Channel(self.labels, self._factories)
        with self._mutex:
            self._blocking_all.append(channel)
        self._opened()
        return channel

    def run_blocking(self, make_plan: PlanMaker[T], channel: Channel) -> tuple[T, list[Any]]:
        """Run a plan whose first call blocks, on a channel of its own; returns its result
        and the replies of the commands sent ahead of that call. A channel given up
        mid-call, or with replies still due, is closed, not reused: whatever was written
        before the close runs in full or not at all (the server drops a blocked client's
        unread commands), so the plan's own give-back stays behind its attempt."""
        reusable = False
        try:
            with channel.mutex:
                channel.ahead = []
                result = drive(make_plan, channel)
                ahead = channel.ahead
                reusable = not channel.pending()
            return result, ahead
        finally:
            with self._mutex:
                if reusable:
                    channel.idle_since = time.monotonic()
                    self._blocking_free.append(channel)
                else:
                    self._blocking_all.remove(channel)
            if not reusable:
                channel.close()
                self.budget.give(self._every, blocking=True)

    # -- blocking driver -----------------------------------------------------------------
    def run(
        self, make_plan: PlanMaker[T], pinned: Any = None, until: float = SPARE
    ) -> tuple[T, Channel]:
        """Run a plan to its end on one channel (``pinned`` if it is a blocking one); with
        none free and the budget spent, wait for one until ``until`` (``time.monotonic()``;
        :data:`SPARE`: :data:`~.budget.SPARE_WAIT` from now), then fail as if the nodes
        were down."""
        return self.run_with(drive, make_plan, pinned, until)

    def run_with(
        self, driver: Callable[[J, Channel], T], job: J, pinned: Any = None, until: float = SPARE
    ) -> tuple[T, Channel]:
        """:meth:`_run` with another driver: ``driver(job, channel)`` (the single-node
        lane's, see :mod:`.lane`)."""
        if self.generation != forks.current:  # a forked child: start afresh (inlined)
            self._check_fork()
        if pinned is not None and isinstance(pinned, Channel) and pinned in self._all:
            with pinned.mutex:
                if pinned in self._all:  # not closed as idle meanwhile
                    return driver(job, pinned), pinned
        # pool checkout inline (no context manager): this is the hot path of every call
        with self._mutex:
            channel = self._free.pop() if self._free else None
        if channel is None:
            channel = self._checkout(until)
        try:
            with channel.mutex:
                return driver(job, channel), channel
        finally:
            if channel.idle_since >= 0:  # not a stand-in
                with self._mutex:
                    surrender = bool(self.budget.hungry) and len(self._all) > 1
                    if surrender:
                        self._all.remove(channel)
                    else:
                        channel.idle_since = time.monotonic()
                        self._free.append(channel)
                        if self._sync_waiters:
                            self._sync_waiters.popleft().set()
                if surrender:  # a caller of another kind holds none: its turn
                    channel.close()
                    self.budget.give(self._every)

    def _checkout(self, until: float) -> Channel:
        """No channel free: open one if the budget allows, else wait for one to come back
        (or for the budget) until ``until``; past it, a stand-in whose nodes are all down."""
        urgent = until == SPARE  # a release or an extend: served before waiting attempts
        if urgent:
            until = time.monotonic() + SPARE_WAIT
        wake = threading.Event()
        try:
            while True:
                with self._mutex:
                    if self._free:
                        return self._free.pop()
                    wake.clear()
                    fed = bool(self._all)
                    if self.budget.take(self._every, listener=wake, wake=wake.set, fed=fed):
                        break
                    if wake not in self._sync_waiters:
                        if urgent:
                            self._sync_waiters.appendleft(wake)
                        else:
                            self._sync_waiters.append(wake)
                if not fed:  # nothing of ours will come back: ask the others for one
                    self.budget.starve(wake)
                remaining = until - time.monotonic()
                if remaining <= 0:
                    return self._stand_in()
                wake.wait(remaining)
        finally:
            self._leave(wake)
        try:
            channel = Channel(self.labels, self._factories, self.state.busy_poll)
        except BaseException:
            self.budget.give(self._every)
            raise
        with self._mutex:
            self._all.append(channel)
        self._opened()
        return channel

    def _leave(self, wake: threading.Event) -> None:
        """A thread stops waiting for a channel; a wake-up meant for it goes to the next."""
        self.budget.forget(wake)
        with self._mutex:
            try:
                self._sync_waiters.remove(wake)
            except ValueError:  # already woken: pass it on if a channel is still free
                if self._free and self._sync_waiters:
                    self._sync_waiters.popleft().set()

    def _stand_in(self) -> Channel:
        channel = Channel(self.labels, self._factories, unavailable=self._spent())
        channel.idle_since = -1.0
        return channel

    # -- background give-backs ------------------------------------------------------------
    def run_aside(self, make_plan: PlanMaker[T]) -> T:
        """Run a background give-back's plan on a channel of its own, outside the pool, so a
        node that does not answer holds that channel (for ``NODE_TIMEOUT`` per send), never
        the callers' (a caller would open another meanwhile, and wait for that node to
        connect). The channel takes a slot of the budget like any other and is closed when
        idle; with no slot to spare the plan runs on a pooled channel."""
        self._check_fork()
        with self._aside_mutex:
            if self.state.closed:  # the give-backs stop; their keys expire by TTL
                raise ConnectionError("the engine is closed")
            channel, opened = self._aside, False
            if channel is None and self.budget.take(self._every):
                channel = self._aside = Channel(self.labels, self._factories, self.state.busy_poll)
                opened = True
            if channel is not None:
                try:
                    with channel.mutex:
                        return drive(make_plan, channel)
                finally:
                    channel.idle_since = time.monotonic()
                    if self.state.closed:  # closed meanwhile: close() could not take it
                        self._close_aside()
                    elif opened:
                        self._opened()
        return self.run(make_plan)[0]

    def _reap_aside(self, idle_before: float, *, now: bool = False) -> float | None:
        """Close the give-backs' channel if idle since before ``idle_before`` (``now``: if
        idle at all); returns its ``idle_since`` while it stays open."""
        if not self._aside_mutex.acquire(blocking=False):
            return None  # in use right now
        try:
            channel = self._aside
            if channel is None:
                return None
            if now or channel.idle_since < idle_before:
                self._close_aside()
                return None
            return channel.idle_since
        finally:
            self._aside_mutex.release()

    def _close_aside(self) -> None:
        """Close the give-backs' channel and give its slot back (hold ``_aside_mutex``)."""
        channel, self._aside = self._aside, None
        if channel is not None:
            with channel.mutex:
                channel.close()
            self.budget.give(self._every)

    # -- idle connections (sync) -----------------------------------------------------------
    def _opened(self) -> None:
        """A sync connection was opened: make sure the idle reaper runs."""
        with self._mutex:
            if self._reaping:
                return
            self._reaping = True
        threading.Thread(target=self._reap_loop, name="redlock-idle", daemon=True).start()

    def _reap_loop(self) -> None:
        """Close sync connections idle for ``IDLE_TIMEOUT``; ends when none is left."""
        generation, timeout = self.generation, self.budget.idle_timeout
        while generation == self.generation:
            oldest = self._reap(time.monotonic() - timeout)
            with self._mutex:
                idle = not (self._all or self._blocking_all or self.waiter.open or self._aside)
                if oldest is None and idle:
                    self._reaping = False
                    return
            due = timeout if oldest is None else oldest + timeout - time.monotonic()
            if self._reaper_wake.wait(max(due, 0.001)):
                self._reaper_wake.clear()

    def _reap(self, idle_before: float, *, one: bool = False) -> float | None:
        """Close idle channels idle since before ``idle_before`` (``one``: the oldest idle
        one, however recent); returns the oldest ``idle_since`` left idle."""
        closed: list[tuple[Channel, bool]] = []
        oldest: float | None = None
        with self._mutex:
            for pool, every, blocking in (
                (self._free, self._all, False),
                (self._blocking_free, self._blocking_all, True),
            ):
                for channel in sorted(pool, key=lambda c: c.idle_since):
                    if (one and not closed) or channel.idle_since < idle_before:
                        pool.remove(channel)
                        every.remove(channel)
                        closed.append((channel, blocking))
                    elif oldest is None or channel.idle_since < oldest:
                        oldest = channel.idle_since
        for channel, blocking in closed:
            with channel.mutex:
                channel.close()
            self.budget.give(self._every, blocking=blocking)
        if one and closed:
            return oldest
        had_aside = self._aside is not None
        aside = self._reap_aside(idle_before, now=one)
        if one and had_aside and self._aside is None:  # the one closed
            return oldest
        waiting = self.waiter.reap(idle_before, one=one)
        left = [t for t in (oldest, waiting, aside) if t is not None]
        return min(left) if left else None

    def _evict_one(self) -> None:
        """Another pool starves: close one idle sync connection, if any."""
        self._reap(0.0, one=True)

    # -- asyncio driver ------------------------------------------------------------------
    async def loop_pools(self) -> LoopPools:
        """This event loop's pools, made (with their closer) on first use."""
        loop = asyncio.get_running_loop()
        pools = self._loops.get(loop)
        if pools is None:
            pools = self._loops[loop] = LoopPools(loop, self.budget, len(self.labels))
            closer = _close_at_loop_shutdown(pools)
            await closer.asend(None)
            self._closers[loop] = closer
        return pools

    def _areturn(self, pools: LoopPools, channel: AsyncChannel) -> None:
        """``channel`` is free again: pooled, or closed while another kind starves."""
        if self.budget.hungry and len(pools.channels) > 1 and channel in pools.channels:
            pools.channels.remove(channel)
            pools.retire(channel)
            return
        channel.idle_since = time.monotonic()
        if pools.waiters:
            pools.wake_one()

    async def _acheckout(self, pools: LoopPools, until: float) -> AsyncChannel | None:
        """Asyncio twin of :meth:`_checkout`: an idle channel, None when the budget gave a
        slot for a new one, or a stand-in past ``until``."""
        urgent = until == SPARE  # a release or an extend: served before waiting attempts
        if urgent:
            until = time.monotonic() + SPARE_WAIT
        loop = asyncio.get_running_loop()
        while True:
            channel = next((c for c in reversed(pools.channels) if not c.mutex.locked()), None)
            if channel is not None:
                return channel
            future: asyncio.Future[None] = loop.create_future()
            wake = functools.partial(pools.wake_threadsafe, future)
            fed = bool(pools.channels)
            if self.budget.take(self._every, listener=future, wake=wake, fed=fed):
                return None
            remaining = until - time.monotonic()
            if remaining <= 0:
                self.budget.forget(future)
                stand_in = AsyncChannel(
                    self.labels, self._async_factories, self.state.node_timeout, self._spent()
                )
                stand_in.idle_since = -1.0
                return stand_in
            if urgent:
                pools.waiters.appendleft(future)
            else:
                pools.waiters.append(future)
            if not fed:  # nothing of ours will come back: ask the others for one
                self.budget.starve(future)
            timer = loop.call_later(remaining, _finish, future)
            try:
                await future
            finally:
                timer.cancel()
                self.budget.forget(future)
                with contextlib.suppress(ValueError):
                    pools.waiters.remove(future)

    async def arun(
        self, make_plan: PlanMaker[T], pinned: Any = None, until: float = SPARE
    ) -> tuple[T, AsyncChannel]:
        """The asyncio twin of :meth:`run`: ``make_plan`` run on a channel of this event loop
        (``pinned`` if it is one). Plain coroutines only, no async generator (a context
        manager made with ``asynccontextmanager`` is one): a release made while the loop
        shuts down (an ``@alock`` generator closed by ``shutdown_asyncgens``) must not start
        one, which asyncio refuses to finalize then (a ResourceWarning; an error where
        warnings are errors)."""
        self._check_fork()
        pools = self._loops.get(asyncio.get_running_loop()) or await self.loop_pools()
        if isinstance(pinned, AsyncChannel) and pinned in pools.channels:
            async with pinned.mutex:
                if pinned in pools.channels:  # not closed as idle meanwhile
                    return await adrive(make_plan, pinned), pinned
        while True:
            channel = next((c for c in reversed(pools.channels) if not c.mutex.locked()), None)
            if channel is None:
                channel = await self._acheckout(pools, until)
                if channel is None:  # a slot for a new one
                    return await self._arun_new(pools, make_plan)
                if channel.idle_since < 0:  # a stand-in
                    return await adrive(make_plan, channel), channel
            # An unlocked channel with a task already woken for it makes this task wait for
            # its mutex; meanwhile the channel may be closed (idle, or evicted for a starving
            # pool): then it is not ours to use, pick again.
            await channel.mutex.acquire()
            if channel in pools.channels:
                break
            channel.mutex.release()
        try:
            try:
                return await adrive(make_plan, channel), channel
            finally:
                channel.mutex.release()
        finally:
            self._areturn(pools, channel)

    async def _arun_new(self, pools: LoopPools, make_plan: PlanMaker[T]) -> tuple[T, AsyncChannel]:
        """:meth:`arun` on a new channel of this loop, on a slot the budget gave; held while
        it connects, so no other task uses it."""
        channel = AsyncChannel(self.labels, self._async_factories, self.state.node_timeout)
        async with channel.mutex:
            pools.channels.append(channel)
            pools.opened()
            try:
                await channel.connect()
            except BaseException:  # cancelled while connecting: never leave it half-made
                pools.channels.remove(channel)
                await asyncio.shield(channel.close())
                pools.give_soon(self._every)
                raise
            try:
                result = await adrive(make_plan, channel)
            finally:
                channel.idle_since = time.monotonic()
        self._areturn(pools, channel)
        return result, channel

    async def arun_blocking(
        self, make_plan: PlanMaker[T], pools: LoopPools, channel: AsyncChannel | None
    ) -> tuple[T, list[Any]]:
        """Asyncio twin of :meth:`_run_blocking`: on ``channel`` (None: a new one, on a
        blocking slot already taken) of this event loop."""
        reusable = False
        try:
            if channel is None:
                channel = AsyncChannel(self.labels, self._async_factories, self.state.node_timeout)
                await channel.connect()
            channel.ahead = []
            result = await adrive(make_plan, channel)
            reusable = not channel.pending()
            return result, channel.ahead
        finally:
            if reusable and channel is not None:
                channel.idle_since = time.monotonic()
                pools.blocking.append(channel)
            else:  # given up mid-call (cancelled) or a reply still due: never reused
                if channel is not None:
                    pools.retire(channel, blocking=True)
                else:
                    pools.give_soon(self._every, blocking=True)

    def close(self) -> None:
        """Close every blocking connection (asyncio ones are closed with their event loop)
        and stop the background give-backs (the keys they would release expire by TTL)."""
        self.state.closed = True
        self.budget.remove_evictor(self)
        self.waiter.close()
        with self._mutex:
            channels, self._all, self._free = self._all, [], []
            blocking, self._blocking_all, self._blocking_free = self._blocking_all, [], []
        for channel in channels + blocking:
            with channel.mutex:
                channel.close()
            self.budget.give(self._every, blocking=channel in blocking)
        self._reap_aside(0.0, now=True)
        self._reaper_wake.set()


#: How long the loop's shutdown lets calls still running finish before closing its
#: connections (see :func:`_close_at_loop_shutdown`), seconds.
SHUTDOWN_GRACE = 1.0


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


def _finish(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)
