"""The channel pools of one alias's engine: checking a channel out (within the connection
budget, ``MAX_CONNECTIONS``), running a plan on it, blocking and asyncio, and closing idle
ones (``IDLE_TIMEOUT``). :class:`ChannelPools` is the part of
:class:`~.core.Engine` that knows connections; the engine's acquire loops use it."""

from __future__ import annotations

import math
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any, TypeVar

from .. import forks, starter
from ..drive import PlanMaker, drive
from ..state import AliasState
from ..transport.aio import AsyncConnectionFactory
from ..transport.blpop import ReleaseWaiter
from ..transport.link import ConnectionFactory
from ..transport.sync import Channel
from .budget import SPARE, SPARE_WAIT, Budget, Doorbell, line_up
from .loop_channels import LoopChannels
from .pick import all_up, pick, reconnect_down

T = TypeVar("T")
J = TypeVar("J")


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
    _down_pooled: bool
    _mutex: threading.Lock
    #: threads waiting for a channel (each woken by a channel going back to the pool)
    _sync_waiters: deque[Doorbell]
    #: wakes the idle reaper thread early (engine closed); True while it runs
    _reaper_wake: threading.Event
    _reaping: bool
    loops: LoopChannels
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
        #: each event loop's channels (the asyncio side)
        self.loops = LoopChannels(
            state, labels, async_factories, budget, self._spent, check_fork, self.reopen
        )

    def start_afresh(self) -> None:
        """Empty pools: at the engine's creation, and in a forked child (the parent's
        connections are dropped unused)."""
        self.generation = forks.generation()
        self._free = []
        #: an idle channel may have a connection down (see :func:`.pick.reconnect_down`)
        self._down_pooled = False
        self._all = []
        self._mutex = threading.Lock()
        self._sync_waiters = deque()
        self._reaper_wake = threading.Event()
        self._reaping = False
        self.loops.start_afresh()  # the same object: a call on it meanwhile sees it afresh
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
        if self.state.closed:
            self.reopen()
        taken: list[bool] = []  # the budget's receipt
        try:
            with self._mutex:
                if self._blocking_free:  # no call between taking it and deleting it
                    index = pick(self._blocking_free)
                    pooled = self._blocking_free[index]
                    del self._blocking_free[index]
                    return pooled
                granted = self.budget.take(self._every, blocking=True, receipt=taken)
            if not granted:
                self.budget.make_room(self._every)  # a later wait blocks (not under our lock)
                return None
            return self._open_into(self._blocking_all, taken, blocking=True)
        except BaseException:  # an interrupt before the slot has a channel: it goes back
            self.budget.give(self._every, blocking=True, receipt=taken)
            raise

    def _open_into(self, pool: list[Channel], taken: list[bool], *, blocking: bool) -> Channel:
        """A new channel on the slot ``taken`` (the budget's receipt) holds, registered in
        ``pool`` (the lock channels, or the blocking ones). An interrupt on the way closes
        what it made and gives the slot back (its caller gives it back, through the same
        receipt, if the interrupt came before this could)."""
        channel = None
        try:
            busy_poll = 0.0 if blocking else self.state.busy_poll
            channel = Channel(self.labels, self._factories, busy_poll)
            with self._mutex:
                pool.append(channel)
            self._opened()
        except BaseException:  # never a channel outside the pool with a slot
            if channel is not None:
                with self._mutex:
                    if channel in pool:
                        pool.remove(channel)
                channel.close()
            self.budget.give(self._every, blocking=blocking, receipt=taken)
            raise
        return channel

    def abandon_blocking(self, channel: Channel) -> None:
        """An interrupt came between :meth:`blocking_channel` and :meth:`run_blocking_with`'s own
        clean-up: close ``channel`` and give its slot back, unless that clean-up ran (it is
        pooled, or closed and forgotten already)."""
        with self._mutex:
            stranded = channel in self._blocking_all and channel not in self._blocking_free
            if stranded:
                self._blocking_all.remove(channel)
        if stranded:
            channel.close()
            self.budget.give(self._every, blocking=True)

    def run_blocking_with(
        self, driver: Callable[[J, Channel], tuple[T, list[Any]]], job: J, channel: Channel
    ) -> tuple[T, list[Any]]:
        """Run ``driver(job, channel)`` (the piped wait's lane, see :mod:`..piped_lane`),
        whose first call blocks, on a channel of its own; returns its result and the replies
        of the commands sent ahead of that call. A channel given up mid-call, or with replies
        still due, is closed, not reused: whatever was written before the close runs in full
        or not at all (the server drops a blocked client's unread commands), so the plan's
        own give-back stays behind its attempt."""
        reusable = False
        try:
            with channel.mutex:
                result, ahead = driver(job, channel)
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
        if self.state.closed:  # closed by a settings change, and used again
            self.reopen()
        if pinned is not None and isinstance(pinned, Channel) and pinned in self._all:
            with pinned.mutex:
                if pinned in self._all:  # not closed as idle meanwhile
                    return driver(job, pinned), pinned
        # pool checkout inline (no context manager): this is the hot path of every call.
        # A signal handler's exception lands after a call returns: the channel is taken
        # from the pool and put back with subscripts and appends only, so an interrupt
        # never leaves it out of the pool for good (its slot spent for the process).
        channel: Channel | None = None
        if self._down_pooled:  # an idle channel has a connection down: start reconnecting it
            self._down_pooled = reconnect_down(list(self._free))
        try:
            with self._mutex:
                if self._free:
                    index = pick(self._free)
                    channel = self._free[index]
                    del self._free[index]
            if channel is None:
                channel = self._checkout(until)
            with channel.mutex:
                return driver(job, channel), channel
        finally:
            if channel is not None and channel.idle_since >= 0:  # not a stand-in
                # inline, pooled first: an interrupt after any call here leaves it pooled
                with self._mutex:
                    self._free.append(channel)
                    channel.idle_since = time.monotonic()
                    surrender = self.budget.should_surrender(self)
                    if surrender:
                        del self._free[-1]
                        self._all.remove(channel)
                    elif self._sync_waiters:
                        self._sync_waiters[0].set()  # dropped next: an interrupt between
                        del self._sync_waiters[0]  # leaves the wake-up to the next return
                if surrender:  # a caller of another kind holds none: its turn
                    channel.close()
                    self.budget.give(self._every)
                elif not all_up(channel):
                    self._down_pooled = True

    def _checkout(self, until: float) -> Channel:
        """No channel free: open one if the budget allows, else wait for one to come back
        (or for the budget) until ``until``; past it, a stand-in whose nodes are all down."""
        urgent = until == SPARE  # a release or an extend: served before waiting attempts
        if urgent:
            until = time.monotonic() + SPARE_WAIT
        wake = Doorbell()
        got: Channel | None = None  # a pooled channel that came back
        taken: list[bool] = []  # a slot for a new one (the budget's receipt)
        spent = False  # past ``until``: a stand-in
        try:
            while True:
                with self._mutex:
                    if self._free:  # no call between taking it and deleting it
                        index = pick(self._free)
                        got = self._free[index]
                        del self._free[index]
                        break
                    wake.clear()
                    fed = bool(self._all)
                    if self.budget.take(
                        self._every, listener=wake, wake=wake.set, kind=self, receipt=taken
                    ):
                        break
                    if wake not in self._sync_waiters:
                        line_up(self._sync_waiters, wake, urgent=urgent)
                if not fed:  # nothing of ours will come back: ask the others for one
                    self.budget.starve(wake, self)
                remaining = until - time.monotonic()
                if remaining <= 0:
                    spent = True
                    break
                wake.wait(remaining)
            self._leave(wake)
        except BaseException:  # an interrupt (even on the way out of a with): give it back
            self._undo_checkout(got, taken, wake)
            raise
        if spent:
            return self._stand_in()
        if got is not None:
            return got
        try:
            return self._open_into(self._all, taken, blocking=False)
        except BaseException:  # an interrupt before the slot has a channel: it goes back
            self.budget.give(self._every, receipt=taken)
            raise

    def _undo_checkout(self, got: Channel | None, taken: list[bool], wake: Doorbell) -> None:
        """An interrupted checkout: the channel it got goes back to the pool, or the slot it
        took to the budget; it stops waiting."""
        try:
            if got is not None:
                with self._mutex:
                    self._free.append(got)
            else:
                self.budget.give(self._every, receipt=taken)
        finally:
            self._leave(wake)

    def _leave(self, wake: Doorbell) -> None:
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
                try:
                    channel = self._aside = Channel(
                        self.labels, self._factories, self.state.busy_poll
                    )
                except BaseException:  # an interrupt: the slot goes back
                    self.budget.give(self._every)
                    raise
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

    def _reap_aside(self, idle_before: float) -> float | None:
        """Close the give-backs' channel if idle since before ``idle_before`` (``math.inf``:
        if idle at all); returns its ``idle_since`` while it stays open."""
        if not self._aside_mutex.acquire(blocking=False):
            return None  # in use right now
        try:
            channel = self._aside
            if channel is None:
                return None
            if channel.idle_since < idle_before:
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
        if not self._reaping:
            starter.call_soon(self._start_reaper)

    def _start_reaper(self) -> None:
        with self._mutex:
            if self._reaping:
                return
            self._reaping = True
        try:
            threading.Thread(target=self._reap_loop, name="redlock-idle", daemon=True).start()
        except BaseException:
            self._reaping = False
            raise

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

    def _reap(
        self, idle_before: float, *, one: bool = False, keep_owed: bool = False
    ) -> float | None:
        """Close idle channels idle since before ``idle_before`` (``one``: only the oldest of
        them, ``math.inf`` for the oldest idle one however recent; ``keep_owed``: not one a
        node still owes a reply on, such as a paused node's acquire, whose lease's release
        must follow it on that connection); returns the oldest ``idle_since`` left idle."""
        closed: list[tuple[Channel, bool]] = []
        oldest: float | None = None
        with self._mutex:
            for pool, every, blocking in (
                (self._free, self._all, False),
                (self._blocking_free, self._blocking_all, True),
            ):
                for channel in sorted(pool, key=lambda c: c.idle_since):
                    owed = keep_owed and channel.pending()
                    if channel.idle_since < idle_before and not (one and closed) and not owed:
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
        aside = self._reap_aside(idle_before)
        if one and had_aside and self._aside is None:  # the one closed
            return oldest
        waiting = self.waiter.reap(idle_before, one=one)
        left = [t for t in (oldest, waiting, aside) if t is not None]
        return min(left) if left else None

    def _evict_one(self, idle_before: float) -> None:
        """The budget wants room: close one sync connection idle since before
        ``idle_before``, if any (for a starving pool, ``math.inf``: any idle one; else not
        one a node still owes a reply on)."""
        self._reap(idle_before, one=True, keep_owed=idle_before != math.inf)

    def reopen(self) -> None:
        """Take calls again after :meth:`close`: a manager kept across a settings change
        (``locks.reset()``) still locks with the engine it was made with, and its releases'
        background give-backs and its budget's evictions work again."""
        with self._mutex:
            if not self.state.closed:
                return
            self.state.closed = False
        self.budget.add_evictor(self, self._evict_one)

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
        self._reap_aside(math.inf)
        self._reaper_wake.set()
