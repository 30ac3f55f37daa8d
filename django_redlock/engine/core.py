"""The engine of one alias: pools of channels to its nodes, and the drivers that run the plans
and policies on them, blocking or asyncio."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import math
import os
import threading
import time
import weakref
from collections import deque
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Generator, Sequence
from typing import Any, TypeVar

from . import forks
from .budget import SPARE_WAIT, Budget
from .keyspace import new_waiter
from .lease_plans import release_many_plan
from .loop_pools import LoopPools
from .many_plans import acquire_many_plan
from .plans import (
    acquire_plan,
    extend_plan,
    force_release_plan,
    register_plan,
    release_plan,
    waited_reply,
    withdraw_plan,
)
from .policy import AcquireStep, Attempt, AwaitRelease, Stepper, acquire_policy, registration_ms
from .replies import NodeFailure, Request
from .state import (
    HANDOFF_MS,
    WAIT_MARK_MS,
    Abandoned,
    AcquireFailure,
    AliasState,
    LeaseRecord,
    NodeView,
    Plan,
    Renewal,
)
from .transport.aio import AsyncChannel, AsyncConnectionFactory
from .transport.blpop import MIN_BLOCK, SLACK, ReleaseWaiter, blpop_command
from .transport.sync import Channel, ConnectionFactory

T = TypeVar("T")
PlanMaker = Callable[[Sequence[NodeView]], Plan[T]]
Outcome = LeaseRecord | AcquireFailure

#: At most this many recent hand-offs are remembered per alias (then forgotten at once).
HANDOFFS_KEPT = 1024
#: How late (seconds) a piped wait's attempt may run and still register only within the
#: caller's timeout (see :meth:`Engine._piped_wait`).
PIPE_MARGIN = 0.25
#: ``until`` of a call that is not an acquire attempt with a deadline: it waits up to
#: :data:`~.budget.SPARE_WAIT` for a connection.
SPARE = -1.0


class Engine:
    """Acquires, renews and releases the locks of one alias. Thread-safe; knows no Django."""

    def __init__(
        self,
        state: AliasState,
        labels: Sequence[str],
        factories: Sequence[ConnectionFactory],
        async_factories: Sequence[AsyncConnectionFactory],
        budget: Budget | None = None,
    ) -> None:
        self.state = state
        self.labels = list(labels)
        self._factories = list(factories)
        self._async_factories = list(async_factories)
        #: this alias's connections per node (shared by its shards' engines)
        self.budget = budget or Budget(len(self.labels))
        self._every = tuple(range(len(self.labels)))
        self._start_afresh()

    def _start_afresh(self) -> None:
        """New pools and bookkeeping: at creation, and in a child process after a fork (the
        parent's connections are dropped unused; closing their file descriptors here sends
        nothing and leaves the parent's connections working)."""
        self.generation = forks.generation()
        self.state.pid = os.getpid()
        self._free: list[Channel] = []
        self._all: list[Channel] = []
        self._mutex = threading.Lock()
        #: threads waiting for a channel (each woken by a channel going back to the pool)
        self._sync_waiters: deque[threading.Event] = deque()
        #: wakes the idle reaper thread early (engine closed); True while it runs
        self._reaper_wake = threading.Event()
        self._reaping = False
        self._loops: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, LoopPools] = (
            weakref.WeakKeyDictionary()
        )
        self._closers: weakref.WeakKeyDictionary[
            asyncio.AbstractEventLoop, AsyncGenerator[None, None]
        ] = weakref.WeakKeyDictionary()
        self.waiter = ReleaseWaiter(
            self._factories,
            self._async_factories,
            self.budget,
            self._opened,
        )
        self.budget.add_evictor(self, self._evict_one)
        #: name -> until when (monotonic) a release here reserved it for a woken waiter
        self._handoffs: dict[str, float] = {}
        #: the acquire calls of this process waiting for a busy name now (for metrics)
        self.waiters = WaiterCount()
        #: channels for waits piped with the next attempt (see :meth:`_piped_wait`); never
        #: pinned by a lease, so a wait never delays another lease's renewal
        self._blocking_free: list[Channel] = []
        self._blocking_all: list[Channel] = []
        #: False once a node refused a piped ``BLPOP`` (an ACL without it): wait the old way
        self._piping = True

    @property
    def node_count(self) -> int:
        return len(self.labels)

    # -- the facade: blocking ------------------------------------------------------------
    def acquire(
        self, name: str, ttl: float, timeout: float | None, permits: int = 0, rw: str = ""
    ) -> Outcome:
        """Attempts until one wins or ``timeout`` runs out (0: one attempt; None: forever);
        ``permits`` > 0: one permit of the semaphore ``name`` instead of the lock; ``rw``:
        ``"read"`` or ``"write"``, a lease of the read-write lock ``name``."""
        target = _Target(self.state, (name,), ttl, permits, rw)
        result: Outcome = self._acquire(target, timeout)
        return result

    def acquire_many(
        self, names: Sequence[str], ttl: float, timeout: float | None
    ) -> list[LeaseRecord] | AcquireFailure:
        """Every name of ``names`` or none (see :mod:`.many_plans`), attempted as
        :meth:`acquire` does; a waiting caller waits for the name its last attempt found busy."""
        result: LeaseRecord | list[LeaseRecord] | AcquireFailure = self._acquire(
            _Target(self.state, tuple(names), ttl, 0), timeout
        )
        return [result] if isinstance(result, LeaseRecord) else result  # one name: one lock

    def _acquire(self, target: _Target, timeout: float | None) -> Any:
        self._check_fork()
        started, queue_first = target.started, self._queue_first(target, timeout)
        waiting = _Waiting.of(started, timeout)
        first = None
        if not queue_first:  # the common case: one attempt, no policy needed if it wins
            first = target.seen(*self._run(target.attempt(waiting, False), None, _until(waiting)))
            if not isinstance(first, AcquireFailure) or timeout == 0:
                return first
        run = Stepper(self._policy(timeout, queue_first, first, started))
        with self.waiters:
            try:
                while run.step is not None:
                    if isinstance(run.step, Attempt):
                        attempt = target.attempt(waiting, run.step.woken)
                        run.send(target.seen(*self._run(attempt, None, _until(waiting))))
                    elif isinstance(run.step, AwaitRelease):
                        piped = self._piped_wait(target, waiting, run.step)
                        if piped is None:
                            mark = waiting if run.step.mark or target.many else None
                            run.send(self.wait_release(target.name, run.step.seconds, mark=mark))
                        else:
                            _answer_piped(run, *piped)
                    else:
                        time.sleep(run.step.seconds)
                        run.send(None)
            except BaseException:  # an interrupt (KeyboardInterrupt, a worker timeout)
                self._withdraw(target, waiting)
                raise
        return run.result

    def _withdraw(self, target: _Target, waiting: _Waiting | None) -> None:
        """A waiting call was interrupted: it stops counting as a waiter of its names on
        every node at once (fire and forget, on a pooled channel: the channel it blocked on,
        if any, is closed with its ``BLPOP`` due, which drops whatever follows on it)."""
        if waiting is not None:
            with contextlib.suppress(Exception):  # else its registration lapses (<= 1 s)
                self._run(self._withdraw_plan(target, waiting))

    def _withdraw_plan(self, target: _Target, waiting: _Waiting) -> PlanMaker[None]:
        state, names, waiter = self.state, target.names, waiting.waiter
        return lambda nodes: withdraw_plan(state, nodes, names, waiter)

    def _piped_wait(
        self, target: _Target, waiting: _Waiting | None, step: AwaitRelease
    ) -> tuple[bool, Outcome] | None:
        """On a single node: block in ``BLPOP`` and make the next attempt in one write, so the
        server runs the attempt the moment a release wakes us (a hand-off then costs no round
        trip after the wake-up). Returns (woken, the attempt's outcome), or None where this
        does not apply (several nodes, ``lock_many``, a short wait, a node that refused)."""
        plan = self._piped_plan(target, waiting, step)
        channel = None if plan is None else self._blocking_channel()
        if plan is None or channel is None:  # no blocking connection to be had: wait by polling
            return None
        return self._piped_outcome(target, *self._run_blocking(plan, channel))

    async def _apiped_wait(
        self, target: _Target, waiting: _Waiting | None, step: AwaitRelease
    ) -> tuple[bool, Outcome] | None:
        """Asyncio twin of :meth:`_piped_wait`."""
        plan = self._piped_plan(target, waiting, step)
        if plan is None:
            return None
        pools = await self._loop_pools()
        channel = pools.blocking.pop() if pools.blocking else None
        if channel is None:
            if not self.budget.take(self._every, blocking=True):
                return None  # no blocking connection to be had: wait by polling
            pools.opened()
        return self._piped_outcome(target, *await self._arun_blocking(plan, pools, channel))

    def _piped_plan(
        self, target: _Target, waiting: _Waiting | None, step: AwaitRelease
    ) -> PlanMaker[Any] | None:
        """The attempt to pipe behind ``step``'s wait, or None where piping does not apply."""
        if not (self._piping and waiting is not None and self.node_count == 1):
            return None
        if target.many or step.seconds < MIN_BLOCK:
            return None
        # The piped attempt's registration is sized before the wait, and a BLPOP can return
        # late on a loaded server: near the caller's deadline it could outlive the caller, so
        # the last stretch of a finite timeout waits the usual way.
        if waiting.deadline is not None and (
            waiting.deadline - time.monotonic() - step.seconds < PIPE_MARGIN + WAIT_MARK_MS / 1000
        ):
            return None
        name = target.name
        before: tuple[tuple[str | int, ...], ...] = ()
        mark_ms = registration_ms(waiting.deadline) if step.mark else 0
        if mark_ms > 0:
            before = (self.state.mark_command(name, waiting.waiter, mark_ms),)
        before += (blpop_command(self.state.keys.wake(name), step.seconds),)
        return target.attempt(waiting, True, before, step.seconds)

    def _piped_outcome(
        self, target: _Target, outcome: Any, ahead: list[Any]
    ) -> tuple[bool, Outcome]:
        popped = waited_reply(ahead)
        if any(_refused(reply) for reply in (popped, *ahead[:1], *ahead[-1:])):
            # e.g. NOPERM: BLPOP (or TIME) is refused, so the attempt did not wait (or its
            # validity counted from the write): wait the old way from now on
            self._piping = False
        return isinstance(popped, list), target.seen(outcome, None)

    def _blocking_channel(self) -> Channel | None:
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

    def _run_blocking(self, make_plan: PlanMaker[T], channel: Channel) -> tuple[T, list[Any]]:
        """Run a plan whose first call blocks, on a channel of its own; returns its result
        and the replies of the commands sent ahead of that call. A channel given up
        mid-call, or with replies still due, is closed, not reused: whatever was written
        before the close runs in full or not at all (the server drops a blocked client's
        unread commands), so the plan's own give-back stays behind its attempt."""
        reusable = False
        try:
            with channel.mutex:
                channel.ahead = []
                result = _drive(make_plan, channel)
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

    def extend(self, lease: LeaseRecord, ttl: float) -> Renewal:
        """Renew ``lease`` to ``ttl`` (renewed, lost, or unconfirmed: see ``extend_plan``)."""
        return self._run(lambda nodes: extend_plan(self.state, nodes, lease, ttl), lease.pinned)[0]

    def release(self, lease: LeaseRecord) -> bool:
        """Release ``lease``; True if it was still held."""
        held = self._run(lambda nodes: release_plan(self.state, nodes, lease), lease.pinned)[0]
        return self._released(lease, held)

    def release_many(self, leases: Sequence[LeaseRecord]) -> list[bool]:
        """Release the leases of one ``lock_many`` set in one call per node; per lease, True
        if it was still held."""
        pinned = leases[0].pinned if leases else None
        held = self._run(lambda nodes: release_many_plan(self.state, nodes, leases), pinned)[0]
        return [self._released(lease, ok) for lease, ok in zip(leases, held, strict=True)]

    def force_release(self, name: str, expected: str = "", key: str = "") -> int:
        """Delete ``name`` on every node (only a value equal to ``expected``, if given),
        advancing the fence counter; returns how many nodes deleted it."""
        plan = lambda nodes: force_release_plan(self.state, nodes, name, expected, key)  # noqa: E731
        return self._run(plan)[0]

    # -- the facade: asyncio -------------------------------------------------------------
    async def aacquire(
        self, name: str, ttl: float, timeout: float | None, permits: int = 0, rw: str = ""
    ) -> Outcome:
        """Asyncio twin of :meth:`acquire`."""
        target = _Target(self.state, (name,), ttl, permits, rw)
        result: Outcome = await self._aacquire(target, timeout)
        return result

    async def aacquire_many(
        self, names: Sequence[str], ttl: float, timeout: float | None
    ) -> list[LeaseRecord] | AcquireFailure:
        """Asyncio twin of :meth:`acquire_many`."""
        target = _Target(self.state, tuple(names), ttl, 0)
        result: LeaseRecord | list[LeaseRecord] | AcquireFailure = await self._aacquire(
            target, timeout
        )
        return [result] if isinstance(result, LeaseRecord) else result  # one name: one lock

    async def _aacquire(self, target: _Target, timeout: float | None) -> Any:
        self._check_fork()
        started, queue_first = target.started, self._queue_first(target, timeout)
        waiting = _Waiting.of(started, timeout)
        first = None
        if not queue_first:
            attempt = target.attempt(waiting, False)
            first = target.seen(*await self._arun(attempt, None, _until(waiting)))
            if not isinstance(first, AcquireFailure) or timeout == 0:
                return first
        run = Stepper(self._policy(timeout, queue_first, first, started))
        with self.waiters:
            try:
                while run.step is not None:
                    if isinstance(run.step, Attempt):
                        attempt = target.attempt(waiting, run.step.woken)
                        run.send(target.seen(*await self._arun(attempt, None, _until(waiting))))
                    elif isinstance(run.step, AwaitRelease):
                        piped = await self._apiped_wait(target, waiting, run.step)
                        if piped is None:
                            mark = waiting if run.step.mark or target.many else None
                            seconds = run.step.seconds
                            run.send(await self.await_release(target.name, seconds, mark=mark))
                        else:
                            _answer_piped(run, *piped)
                    else:
                        await asyncio.sleep(run.step.seconds)
                        run.send(None)
            except asyncio.CancelledError:  # task.cancel(), wait_for, asyncio.timeout
                await self._awithdraw(target, waiting)
                raise
        return run.result

    async def _awithdraw(self, target: _Target, waiting: _Waiting | None) -> None:
        """Asyncio twin of :meth:`_withdraw`, for a cancelled waiting call: written at once on
        an idle pooled channel of this loop (no await then), else on a new one."""
        if waiting is not None:
            with contextlib.suppress(Exception):
                await self._arun(self._withdraw_plan(target, waiting))

    async def aextend(self, lease: LeaseRecord, ttl: float) -> Renewal:
        """Asyncio twin of :meth:`extend`."""
        plan = lambda nodes: extend_plan(self.state, nodes, lease, ttl)  # noqa: E731
        return (await self._arun(plan, lease.pinned))[0]

    async def arelease(self, lease: LeaseRecord) -> bool:
        """Asyncio twin of :meth:`release`."""
        plan = lambda nodes: release_plan(self.state, nodes, lease)  # noqa: E731
        return self._released(lease, (await self._arun(plan, lease.pinned))[0])

    async def arelease_many(self, leases: Sequence[LeaseRecord]) -> list[bool]:
        """Asyncio twin of :meth:`release_many`."""
        pinned = leases[0].pinned if leases else None
        plan = lambda nodes: release_many_plan(self.state, nodes, leases)  # noqa: E731
        held = (await self._arun(plan, pinned))[0]
        return [self._released(lease, ok) for lease, ok in zip(leases, held, strict=True)]

    async def aforce_release(self, name: str, expected: str = "", key: str = "") -> int:
        """Asyncio twin of :meth:`force_release`."""
        plan = lambda nodes: force_release_plan(self.state, nodes, name, expected, key)  # noqa: E731
        return (await self._arun(plan))[0]

    def _check_fork(self) -> None:
        if self.generation != forks.generation():
            self._start_afresh()

    def owns(self, lease: LeaseRecord) -> bool:
        """False for a lease this process's parent acquired before a fork."""
        return lease.generation == forks.generation()

    # -- policy helpers ------------------------------------------------------------------
    def _queue_first(self, target: _Target, timeout: float | None) -> bool:
        return timeout != 0 and not target.many and self._handed_off_here(target.name)

    def _policy(
        self,
        timeout: float | None,
        queue_first: bool,
        first: Outcome | None,
        started: float,
    ) -> Generator[AcquireStep, Any, Outcome]:
        failure = first if isinstance(first, AcquireFailure) else None
        return acquire_policy(
            self.state.retry_delay, timeout, queue_first=queue_first, first=failure, started=started
        )

    def _released(self, lease: LeaseRecord, held: bool) -> bool:
        if lease.handed_off:
            if len(self._handoffs) >= HANDOFFS_KEPT:
                self._handoffs.clear()
            self._handoffs[lease.name] = time.monotonic() + HANDOFF_MS / 1000
        return held

    def _handed_off_here(self, name: str) -> bool:
        """True while a release in this process has just reserved ``name`` for a woken
        waiter: a first attempt would fail, so the caller queues at once instead."""
        until = self._handoffs.pop(name, None)
        return until is not None and until > time.monotonic()

    # -- blocking driver -----------------------------------------------------------------
    def _run(
        self, make_plan: PlanMaker[T], pinned: Any = None, until: float = SPARE
    ) -> tuple[T, Channel]:
        """Run a plan to its end on one channel (``pinned`` if it is a blocking one); with
        none free and the budget spent, wait for one until ``until`` (``time.monotonic()``;
        :data:`SPARE`: :data:`~.budget.SPARE_WAIT` from now), then fail as if the nodes
        were down."""
        self._check_fork()
        if isinstance(pinned, Channel) and pinned in self._all:
            with pinned.mutex:
                if pinned in self._all:  # not closed as idle meanwhile
                    return _drive(make_plan, pinned), pinned
        # pool checkout inline (no context manager): this is the hot path of every call
        with self._mutex:
            channel = self._free.pop() if self._free else None
        if channel is None:
            channel = self._checkout(until)
        try:
            with channel.mutex:
                return _drive(make_plan, channel), channel
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
        reason = f"no free connection in time (MAX_CONNECTIONS={self.budget.limit} in use)"
        channel = Channel(self.labels, self._factories, unavailable=reason)
        channel.idle_since = -1.0
        return channel

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
                if oldest is None and not (self._all or self._blocking_all or self.waiter.open):
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
        waiting = self.waiter.reap(idle_before, one=one)
        return waiting if oldest is None else min(oldest, waiting or oldest)

    def _evict_one(self) -> None:
        """Another pool starves: close one idle sync connection, if any."""
        self._reap(0.0, one=True)

    def wait_release(self, name: str, seconds: float, *, mark: _Waiting | None = None) -> bool:
        """Wait up to ``seconds`` for a release of ``name`` to wake this thread (True if so);
        ``mark``: first register this waiter (when no failed attempt did)."""
        mark_ms = 0 if mark is None else registration_ms(mark.deadline)
        before = None
        if mark is not None and mark_ms > 0:
            if self.node_count > 1:
                self._run(self._register_elsewhere(name, mark.waiter, mark_ms))
            before = self.state.mark_command(name, mark.waiter, mark_ms)
        return self.waiter.wait(self.state.keys.wake(name), name, seconds, before)

    def _register_elsewhere(self, name: str, waiter: str, mark_ms: int) -> PlanMaker[None]:
        """Register ``waiter`` on the nodes other than the wake-up node (fire-and-forget); the
        wake-up node gets it with the ``BLPOP``."""
        state = self.state
        return lambda nodes: register_plan(state, nodes, name, waiter, mark_ms)

    # -- asyncio driver ------------------------------------------------------------------
    async def _loop_pools(self) -> LoopPools:
        """This event loop's pools, made (with their closer) on first use."""
        loop = asyncio.get_running_loop()
        pools = self._loops.get(loop)
        if pools is None:
            pools = self._loops[loop] = LoopPools(loop, self.budget, self.node_count)
            closer = _close_at_loop_shutdown(pools)
            await closer.asend(None)
            self._closers[loop] = closer
        return pools

    @contextlib.asynccontextmanager
    async def achannel(
        self, pinned: Any = None, until: float = SPARE
    ) -> AsyncIterator[AsyncChannel]:
        """A channel of this event loop (``pinned`` if it is one); see :meth:`_run`."""
        pools = self._loops.get(asyncio.get_running_loop()) or await self._loop_pools()
        if isinstance(pinned, AsyncChannel) and pinned in pools.channels:
            async with pinned.mutex:
                still = pinned in pools.channels  # not closed as idle meanwhile
                if still:
                    yield pinned
            if still:
                return
        channel = next((c for c in reversed(pools.channels) if not c.mutex.locked()), None)
        if channel is None:
            channel = await self._acheckout(pools, until)
            if channel is None:  # a new one: held while connecting so no other task uses it
                async with self._aopen(pools) as channel:
                    yield channel
                return
            if channel.idle_since < 0:  # a stand-in
                yield channel
                return
        try:
            async with channel.mutex:
                yield channel
        finally:
            self._areturn(pools, channel)

    def _areturn(self, pools: LoopPools, channel: AsyncChannel) -> None:
        """``channel`` is free again: pooled, or closed while another kind starves."""
        if self.budget.hungry and len(pools.channels) > 1 and channel in pools.channels:
            pools.channels.remove(channel)
            channel.close_now()
            pools.give_soon(self._every)
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
                reason = f"no free connection in time (MAX_CONNECTIONS={self.budget.limit} in use)"
                stand_in = AsyncChannel(
                    self.labels, self._async_factories, self.state.node_timeout, reason
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

    @contextlib.asynccontextmanager
    async def _aopen(self, pools: LoopPools) -> AsyncIterator[AsyncChannel]:
        """A new channel of this loop, on a slot the budget gave."""
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
                yield channel
            finally:
                channel.idle_since = time.monotonic()
        self._areturn(pools, channel)

    async def _arun(
        self, make_plan: PlanMaker[T], pinned: Any = None, until: float = SPARE
    ) -> tuple[T, AsyncChannel]:
        self._check_fork()
        async with self.achannel(pinned, until) as channel:
            return await _adrive(make_plan, channel), channel

    async def _arun_blocking(
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
            result = await _adrive(make_plan, channel)
            reusable = not channel.pending()
            return result, channel.ahead
        finally:
            if reusable and channel is not None:
                channel.idle_since = time.monotonic()
                pools.blocking.append(channel)
            else:  # given up mid-call (cancelled) or a reply still due: never reused
                if channel is not None:
                    channel.close_now()
                pools.give_soon(self._every, blocking=True)

    async def await_release(
        self, name: str, seconds: float, *, mark: _Waiting | None = None
    ) -> bool:
        """Asyncio twin of :meth:`wait_release`."""
        mark_ms = 0 if mark is None else registration_ms(mark.deadline)
        before = None
        if mark is not None and mark_ms > 0 and self.node_count > 1:
            await self._arun(self._register_elsewhere(name, mark.waiter, mark_ms))
        pools = await self._loop_pools()
        if mark is not None and mark_ms > 0:
            before = self.state.mark_command(name, mark.waiter, mark_ms)
        pools.opened()
        return await self.waiter.await_release(
            self.state.keys.wake(name), name, seconds, pools.waiting, before
        )

    def close(self) -> None:
        """Close every blocking connection (asyncio ones are closed with their event loop)."""
        self.budget.remove_evictor(self)
        self.waiter.close()
        with self._mutex:
            channels, self._all, self._free = self._all, [], []
            blocking, self._blocking_all, self._blocking_free = self._blocking_all, [], []
        for channel in channels + blocking:
            with channel.mutex:
                channel.close()
            self.budget.give(self._every, blocking=channel in blocking)
        self._reaper_wake.set()


class WaiterCount:
    """How many acquire calls are waiting now: ``with count:`` around one call's waiting.
    Entered only by a call whose first attempt failed, so a free name costs nothing."""

    __slots__ = ("_mutex", "value")

    def __init__(self) -> None:
        self._mutex = threading.Lock()
        self.value = 0

    def __enter__(self) -> None:
        with self._mutex:
            self.value += 1

    def __exit__(self, *exc_info: object) -> None:
        with self._mutex:
            self.value -= 1


class _Target:
    """What one acquire call asks for: a lock, one permit of a semaphore (``permits`` > 0)
    or a set of names (``lock_many``), and the name it waits for (for a set: the one its last
    attempt found busy)."""

    __slots__ = ("attempts", "many", "name", "names", "permits", "rw", "started", "state", "ttl")

    def __init__(
        self, state: AliasState, names: tuple[str, ...], ttl: float, permits: int, rw: str = ""
    ) -> None:
        self.state, self.names, self.ttl, self.permits, self.rw = state, names, ttl, permits, rw
        self.name = names[0]
        self.many = len(names) > 1
        self.started = time.monotonic()
        self.attempts = 0

    def attempt(
        self,
        waiting: _Waiting | None,
        woken: bool,
        before: tuple[tuple[str | int, ...], ...] = (),
        wait: float = 0.0,
    ) -> PlanMaker[Any]:
        """The attempt's plan; ``before`` (a single lock, semaphore or read-write lease):
        commands sent ahead of it that block up to ``wait`` seconds (a ``BLPOP``)."""
        state, ttl = self.state, self.ttl
        waiter, mark_ms = "", 0
        if waiting is not None:  # None: timeout=0, never registers as a waiter
            # an attempt piped behind a wait registers when it runs: after the wait, at worst
            waiter, mark_ms = waiting.waiter, registration_ms(waiting.deadline, wait)
        wait += SLACK if wait else 0.0
        if self.many:
            names = self.names
            return lambda nodes: acquire_many_plan(
                state, nodes, names, ttl, waiter=waiter, mark_ms=mark_ms, woken=woken
            )
        name, permits, rw = self.name, self.permits, self.rw
        return lambda nodes: acquire_plan(
            state,
            nodes,
            name,
            ttl,
            waiter=waiter,
            mark_ms=mark_ms,
            woken=woken,
            permits=permits,
            rw=rw,
            before=before,
            wait=wait,
        )

    def seen(self, result: Any, channel: Channel | AsyncChannel | None) -> Any:
        """Count the attempt and stamp its outcome with the call's wait so far (what signals
        and metrics report); pin won leases to ``channel`` (None: to none); after a failed
        set, wait for its busy name."""
        self.attempts += 1
        now = time.monotonic()
        if isinstance(result, AcquireFailure):
            result.waited, result.attempts = now - self.started, self.attempts
            if result.busy_name is not None:
                self.name = result.busy_name
            return result
        for record in result if isinstance(result, list) else (result,):
            _pin(record, channel)
            record.waited, record.attempts, record.acquired_at = (
                now - self.started,
                self.attempts,
                now,
            )
        return result


class _Waiting:
    """One ``acquire()`` call that waits: its waiter id (one per call, registered on the nodes
    by its failed attempts) and its deadline (``time.monotonic()``; None: no timeout)."""

    __slots__ = ("deadline", "waiter")

    def __init__(self, waiter: str, deadline: float | None) -> None:
        self.waiter = waiter
        self.deadline = deadline

    @classmethod
    def of(cls, started: float, timeout: float | None) -> _Waiting | None:
        """None for ``timeout=0`` (one attempt, never registered)."""
        if timeout == 0:
            return None
        return cls(new_waiter(), None if timeout is None else started + timeout)


def _answer_piped(run: Stepper[Any], woken: bool, outcome: Outcome) -> None:
    """Answer a policy's wait, and the attempt it asks next, with a piped wait's outcome."""
    run.send(woken)
    assert isinstance(run.step, Attempt)  # the attempt that was piped with the wait
    run.send(outcome)


def _refused(reply: Any) -> bool:
    """True for a reply saying the node refuses the command (an ACL without it)."""
    return isinstance(reply, NodeFailure) and reply.reason.startswith("ResponseError")


def _pin(result: Outcome, channel: Channel | AsyncChannel | None) -> Outcome:
    """Remember the channel a won lease was acquired on (its renewals and release follow it)
    and the process generation it belongs to."""
    if isinstance(result, LeaseRecord):
        result.pinned = channel
        result.generation = forks.generation()
    return result


def _drive(make_plan: PlanMaker[T], channel: Channel) -> T:
    # the generator protocol by hand, not a Stepper: this loop runs for every lock call
    channel.prepare()
    plan = make_plan(channel.links)
    try:
        request = next(plan)
        while True:
            try:
                replies = channel.execute(request)
            except BaseException:  # an interrupt (KeyboardInterrupt, a worker timeout) mid-call
                _abandon(plan, channel.execute)
                raise
            request = plan.send(replies)
    except StopIteration as done:
        return done.value  # type: ignore[no-any-return]


def _abandon(plan: Plan[Any], send_now: Callable[[Request], Any]) -> None:
    """The caller gave up while a request was in flight: let the plan undo what it may have
    done (fire-and-forget requests, sent at once), whatever it was."""
    try:
        request = plan.throw(Abandoned())
        while True:
            send_now(request)
            request = plan.send([None] * len(request.calls))
    except (Abandoned, StopIteration):
        pass


async def _adrive(make_plan: PlanMaker[T], channel: AsyncChannel) -> T:
    """Asyncio twin of :func:`_drive`."""
    await channel.prepare()
    plan = make_plan(channel.links)
    try:
        request = next(plan)
        while True:
            try:
                replies = await channel.execute(request)
            except BaseException:  # cancelled (task.cancel, wait_for, timeout) mid-call
                _abandon(plan, channel.send_now)
                raise
            request = plan.send(replies)
    except StopIteration as done:
        return done.value  # type: ignore[no-any-return]


async def _close_at_loop_shutdown(pools: LoopPools) -> AsyncGenerator[None, None]:
    """Suspended once per event loop; ``loop.shutdown_asyncgens()`` (run by ``asyncio.run``)
    closes it, which closes that loop's connections before the loop goes away."""
    try:
        yield
        await asyncio.Event().wait()  # never resumed on purpose
    finally:
        await pools.close()


def _until(waiting: _Waiting | None) -> float:
    """How long an attempt may wait for a connection: until the acquire's deadline (forever
    without one); a ``timeout=0`` attempt: :data:`SPARE`."""
    if waiting is None:
        return SPARE
    return math.inf if waiting.deadline is None else waiting.deadline


def _finish(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)
