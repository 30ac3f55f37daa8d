"""The engine of one alias: pools of channels to its nodes, and the drivers that run the plans
and policies on them, blocking or asyncio."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import time
from collections.abc import Generator, Sequence
from typing import Any, TypeVar

from . import forks, giveback
from .acquire_loop import LoopRequest, Pipe, Try, Wait, acquire_loop
from .afan_lane import afan_acquire, afan_release
from .alane import alane_acquire, alane_release
from .drive import PlanMaker
from .fan_lane import fan_acquire, fan_release
from .lane import lane_acquire, lane_release
from .plans import (
    extend_plan,
    force_release_plan,
    release_plan,
    release_set_plan,
    withdraw_plan,
)
from .plans.notes import NoteReplies, note_plan
from .plans.order_edges import order_plan
from .plans.records import RecordRead, read_record_plan, store_record_plan
from .policy import AcquireStep, acquire_policy
from .pools.budget import SPARE, Budget
from .pools.channels import ChannelPools
from .reservations import Reservations
from .state import (
    AcquireFailure,
    AliasState,
    LeaseRecord,
    Renewal,
)
from .targets import Target, WaiterCount, Waiting, deadline_of
from .transport import cancels
from .transport.aio import AsyncConnectionFactory
from .transport.link import ConnectionFactory
from .waits import ReleaseWaits

T = TypeVar("T")
Outcome = LeaseRecord | AcquireFailure


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
        #: the connections: sync channels, each event loop's, blocking waits'
        self.pools = ChannelPools(
            state, self.labels, self._factories, self._async_factories, self.budget,
            self._check_fork,
        )  # fmt: skip
        #: waits for a release's wake-up, piped with the next attempt where they can be
        self.waits = ReleaseWaits(state, self.pools, len(self.labels))
        #: a lease on one name takes a lane: the single-node one (:mod:`.lane`) on a one-node
        #: alias, else the lane for a set of nodes (:mod:`.fan_lane`), where the plans would
        #: ask every node at once (not with ``FAN_OUT = "quorum"``)
        self._lane = len(self.labels) == 1
        #: whether a lease's first attempt and its release take a lane (set once: FAN_OUT is
        #: the alias's, fixed when its engine is made)
        self._laned = self._lane or not state.quorum_first
        self._lane_acquire = lane_acquire if self._lane else fan_acquire
        self._lane_release = functools.partial(
            lane_release if self._lane else fan_release, state=state
        )
        #: the asyncio twins (:mod:`.alane`, :mod:`.afan_lane`)
        self._alane_acquire = alane_acquire if self._lane else afan_acquire
        self._alane_release = functools.partial(
            alane_release if self._lane else afan_release, state=state
        )
        self._start_afresh()

    def _start_afresh(self) -> None:
        """New pools and bookkeeping: at creation, and in a child process after a fork (the
        parent's connections are dropped unused; closing their file descriptors here sends
        nothing and leaves the parent's connections working)."""
        self.state.pid = os.getpid()
        self.pools.start_afresh()
        #: the names a release here just reserved for a woken waiter
        self.reservations = Reservations()
        #: the acquire calls of this process waiting for a busy name now (for metrics)
        self.waiters = WaiterCount()
        self.waits.piping = True  # a node may refuse BLPOP again (see .waits)

    def close(self) -> None:
        """Close every blocking connection (asyncio ones are closed with their event loop)
        and stop the background give-backs (the keys they would release expire by TTL)."""
        self.pools.close()

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
        target = Target(self.state, (name,), ttl, permits, rw)
        result: Outcome = self._acquire(target, timeout)
        return result

    def acquire_many(
        self, names: Sequence[str], ttl: float, timeout: float | None
    ) -> list[LeaseRecord] | AcquireFailure:
        """Every name of ``names`` or none (see :mod:`.plans.many`), attempted as
        :meth:`acquire` does; a waiting caller waits for the name its last attempt found busy."""
        result: LeaseRecord | list[LeaseRecord] | AcquireFailure = self._acquire(
            Target(self.state, tuple(names), ttl, 0), timeout
        )
        return [result] if isinstance(result, LeaseRecord) else result  # one name: one lock

    def acquire_limits(
        self, names: Sequence[str], permits: Sequence[int], ttl: float, timeout: float | None
    ) -> list[LeaseRecord] | AcquireFailure:
        """A permit of each semaphore ``names[i]`` of ``permits[i]`` permits, all or none (see
        :mod:`.plans.limits`), attempted as :meth:`acquire` does; a waiting caller waits for
        the semaphore its last attempt found full."""
        result: LeaseRecord | list[LeaseRecord] | AcquireFailure = self._acquire(
            self._limits_target(names, permits, ttl), timeout
        )
        return [result] if isinstance(result, LeaseRecord) else result  # one name: a permit

    def _limits_target(self, names: Sequence[str], permits: Sequence[int], ttl: float) -> Target:
        if len(names) == 1:  # one semaphore: semaphore()'s own attempt
            return Target(self.state, tuple(names), ttl, permits[0])
        return Target(self.state, tuple(names), ttl, 0, limits=tuple(permits))

    def _acquire(self, target: Target, timeout: float | None) -> Any:
        try:
            return self._acquire_target(target, timeout)
        finally:
            if self.state.owed:  # give-backs whose connection broke: sent in the background
                giveback.settle_owed(self.state, self.pools.run_aside)

    def _acquire_target(self, target: Target, timeout: float | None) -> Any:
        if self.pools.generation != forks.current:  # a forked child: start afresh
            self._start_afresh()
        started = target.started
        queue_first = timeout != 0 and self._queue_first(target, timeout)
        waiting = None if timeout == 0 else Waiting.of(started, timeout)
        first = None
        if not queue_first:  # the common case: one attempt, no policy needed if it wins
            until = SPARE if waiting is None else deadline_of(waiting)
            first = target.seen(*self._run_attempt(target, waiting, False, until))
            if type(first) is not AcquireFailure or (timeout == 0 and not first.raced):
                return first
        loop = acquire_loop(target, waiting, self._policy(timeout, queue_first, first, started))
        with self.waiters:
            try:
                request = next(loop)
                while True:
                    request = loop.send(self._carry_out(request, target, waiting))
            except StopIteration as done:
                return done.value
            except BaseException:  # an interrupt (KeyboardInterrupt, a worker timeout)
                self._withdraw(target, waiting)
                raise

    def _carry_out(self, request: LoopRequest, target: Target, waiting: Waiting | None) -> Any:
        """One request of :func:`.acquire_loop.acquire_loop`, blocking."""
        if isinstance(request, Try):
            return self._run_attempt(target, waiting, request.woken, request.until)
        if isinstance(request, Pipe):
            return self.waits.piped(target, waiting, request.step)
        if isinstance(request, Wait):
            return self.wait_release(request.name, request.seconds, mark=request.mark)
        time.sleep(request.seconds)
        return None

    def _run_attempt(
        self, target: Target, waiting: Waiting | None, woken: bool, until: float
    ) -> tuple[Any, Any]:
        """One attempt (what ``ChannelPools.run`` returns): on one name a lane, else the plan."""
        if target.lane and self._laned:
            attempt = target.lane_attempt(waiting, woken)
            return self.pools.run_with(self._lane_acquire, attempt, None, until)
        return self.pools.run(target.attempt(waiting, woken), None, until)

    async def _arun_attempt(
        self, target: Target, waiting: Waiting | None, woken: bool, until: float
    ) -> tuple[Any, Any]:
        """Asyncio twin of :meth:`_run_attempt`."""
        if target.lane and self._laned:
            attempt = target.lane_attempt(waiting, woken)
            return await self.pools.loops.arun_with(self._alane_acquire, attempt, None, until)
        return await self.pools.loops.arun(target.attempt(waiting, woken), None, until)

    def _withdraw(self, target: Target, waiting: Waiting | None) -> None:
        """A waiting call was interrupted: it stops counting as a waiter of its names on
        every node at once (fire and forget, on a pooled channel: the channel it blocked on,
        if any, is closed with its ``BLPOP`` due, which drops whatever follows on it)."""
        if waiting is not None:
            with contextlib.suppress(Exception):  # else its registration lapses (<= 1 s)
                self.pools.run(self._withdraw_plan(target, waiting))

    def _withdraw_plan(self, target: Target, waiting: Waiting) -> PlanMaker[None]:
        state, names, waiter = self.state, target.names, waiting.waiter
        return lambda nodes: withdraw_plan(state, nodes, names, waiter)

    def extend(self, lease: LeaseRecord, ttl: float) -> Renewal:
        """Renew ``lease`` to ``ttl`` (renewed, lost, or unconfirmed: see ``extend_plan``)."""
        return self.pools.run(
            lambda nodes: extend_plan(self.state, nodes, lease, ttl), lease.pinned
        )[0]

    def release(self, lease: LeaseRecord) -> bool:
        """Release ``lease``; True if it was still held and a quorum confirmed the release
        (else it is sent again: see :mod:`.giveback`)."""
        if self._laned:
            held = self.pools.run_with(self._lane_release, lease, lease.pinned)[0]
        else:
            held = self.pools.run(
                lambda nodes: release_plan(self.state, nodes, lease), lease.pinned
            )[0]
        held = self._released(lease, held)
        if self.state.owed:
            giveback.settle_owed(self.state, self.pools.run_aside)
        return giveback.confirm(self.state, lease, held, self._run_first, self.pools.run_aside)

    def release_unfinished(self, lease: LeaseRecord) -> None:
        """A release an interrupt stopped (a signal handler that raised before or while it
        was sent): it still goes out, from a background give-back, to every node it may not
        have reached, until a quorum confirms it or the lease's validity ends."""
        if lease.settled or (lease.released and not lease.unsure and lease.confirmed):
            return  # a quorum confirmed it (stragglers are sent to already)
        lease.released = True
        if not lease.unsure:
            lease.unsure = tuple(i for i in range(len(self.labels)) if lease.may_hold(i))
        if lease.unsure and id(lease) not in giveback.GiveBack.running:
            giveback.GiveBack(self.state, lease, self.pools.run_aside, quiet=True).begin()

    def _run_first(self, plan: PlanMaker[Any]) -> Any:
        return self.pools.run(plan)[0]

    async def _arun_first(self, plan: PlanMaker[Any]) -> Any:
        return (await self.pools.loops.arun(plan))[0]

    def release_many(self, leases: Sequence[LeaseRecord]) -> list[bool]:
        """Release the leases of one ``lock_many`` set in one call per node; per lease, True
        if it was still held."""
        pinned = leases[0].pinned if leases else None
        plan = lambda nodes: release_set_plan(self.state, nodes, leases)  # noqa: E731
        held = self.pools.run(plan, pinned)[0]
        return [
            giveback.confirm(
                self.state, lease, self._released(lease, ok), self._run_first, self.pools.run_aside
            )
            for lease, ok in zip(leases, held, strict=True)
        ]

    def force_release(self, name: str, expected: str = "", key: str = "") -> int:
        """Delete ``name`` on every node (only a value equal to ``expected``, if given),
        advancing the fence counter; returns how many nodes deleted it."""
        plan = lambda nodes: force_release_plan(self.state, nodes, name, expected, key)  # noqa: E731
        return self.pools.run(plan)[0]

    def store_record(
        self, lease: LeaseRecord, fields: Sequence[tuple[str, bytes | str]], ttl: float
    ) -> int:
        """Keep a fenced record beside ``lease``'s lock for ``ttl`` seconds (see
        ``scripts/records.py``): on each node the lease reached, only while it holds the lock
        there and no newer token's record is there. Returns on how many nodes it was written.
        Runs on the lease's channel, after its own calls."""
        plan = lambda nodes: store_record_plan(self.state, nodes, lease, fields, ttl)  # noqa: E731
        return self.pools.run(plan, lease.pinned)[0]

    def read_record(self, name: str, fields: Sequence[str], pinned: Any = None) -> RecordRead:
        """The fenced record of ``name`` from every node: the highest token's ``fields``."""
        plan = lambda nodes: read_record_plan(self.state, nodes, name, fields)  # noqa: E731
        return self.pools.run(plan, pinned)[0]

    def note(
        self, name: str, op: str, expected: str = "", value: str = "", ttl: float = 0.0
    ) -> NoteReplies:
        """One note operation (``get``, ``set``, ``replace``, ``delete``: see
        :mod:`.notes`) on every node."""
        return NoteReplies.of(
            self.labels, self.pools.run(note_plan(self.state, name, op, expected, value, ttl))[0]
        )

    def order(self, *args: str | int) -> NoteReplies:
        """One operation on the lock-order checker's records (see :mod:`.order_edges`) on
        every node: each node's reply (None where it gave none) and the errors by label."""
        return NoteReplies.of(self.labels, self.pools.run(order_plan(self.state, args))[0])

    async def aorder(self, *args: str | int) -> NoteReplies:
        """Asyncio twin of :meth:`order` (an event loop is not blocked while it runs)."""
        return NoteReplies.of(
            self.labels, (await self.pools.loops.arun(order_plan(self.state, args)))[0]
        )

    # -- the facade: asyncio -------------------------------------------------------------
    async def aacquire(
        self, name: str, ttl: float, timeout: float | None, permits: int = 0, rw: str = ""
    ) -> Outcome:
        """Asyncio twin of :meth:`acquire`."""
        target = Target(self.state, (name,), ttl, permits, rw)
        result: Outcome = await self._aacquire(target, timeout)
        return result

    async def aacquire_many(
        self, names: Sequence[str], ttl: float, timeout: float | None
    ) -> list[LeaseRecord] | AcquireFailure:
        """Asyncio twin of :meth:`acquire_many`."""
        target = Target(self.state, tuple(names), ttl, 0)
        result: LeaseRecord | list[LeaseRecord] | AcquireFailure = await self._aacquire(
            target, timeout
        )
        return [result] if isinstance(result, LeaseRecord) else result  # one name: one lock

    async def aacquire_limits(
        self, names: Sequence[str], permits: Sequence[int], ttl: float, timeout: float | None
    ) -> list[LeaseRecord] | AcquireFailure:
        """Asyncio twin of :meth:`acquire_limits`."""
        result: LeaseRecord | list[LeaseRecord] | AcquireFailure = await self._aacquire(
            self._limits_target(names, permits, ttl), timeout
        )
        return [result] if isinstance(result, LeaseRecord) else result

    async def _aacquire(self, target: Target, timeout: float | None) -> Any:
        try:
            return await self._aacquire_target(target, timeout)
        finally:
            if self.state.owed:  # give-backs whose connection broke: sent in the background
                giveback.settle_owed(self.state, self.pools.run_aside)

    async def _aacquire_target(self, target: Target, timeout: float | None) -> Any:
        self._check_fork()
        counted = cancels.counted()  # see the loop below
        started, queue_first = target.started, self._queue_first(target, timeout)
        waiting = Waiting.of(started, timeout)
        first = None
        if not queue_first:
            ran = await self._arun_attempt(target, waiting, False, deadline_of(waiting))
            first = target.seen(*ran)
            if not isinstance(first, AcquireFailure) or (timeout == 0 and not first.raced):
                return first
        loop = acquire_loop(target, waiting, self._policy(timeout, queue_first, first, started))
        with self.waiters:
            try:
                request = next(loop)
                while True:
                    # a cancel that a layer below caught and dropped (the task still counts
                    # it): honoured before the next step, never after a grant
                    cancels.raise_dropped(counted)
                    request = loop.send(await self._acarry_out(request, target, waiting))
            except StopIteration as done:
                return done.value
            except asyncio.CancelledError:  # task.cancel(), wait_for, asyncio.timeout
                await self._awithdraw(target, waiting)
                raise

    async def _acarry_out(
        self, request: LoopRequest, target: Target, waiting: Waiting | None
    ) -> Any:
        """Asyncio twin of :meth:`_carry_out`."""
        if isinstance(request, Try):
            return await self._arun_attempt(target, waiting, request.woken, request.until)
        if isinstance(request, Pipe):
            return await self.waits.apiped(target, waiting, request.step)
        if isinstance(request, Wait):
            return await self.await_release(request.name, request.seconds, mark=request.mark)
        await asyncio.sleep(request.seconds)
        return None

    async def _awithdraw(self, target: Target, waiting: Waiting | None) -> None:
        """Asyncio twin of :meth:`_withdraw`, for a cancelled waiting call: written at once on
        an idle pooled channel of this loop (no await then), else on a new one."""
        if waiting is not None:
            with contextlib.suppress(Exception):
                await self.pools.loops.arun(self._withdraw_plan(target, waiting))

    async def aextend(self, lease: LeaseRecord, ttl: float) -> Renewal:
        """Asyncio twin of :meth:`extend`."""
        plan = lambda nodes: extend_plan(self.state, nodes, lease, ttl)  # noqa: E731
        return (await self.pools.loops.arun(plan, lease.pinned))[0]

    async def arelease(self, lease: LeaseRecord) -> bool:
        """Asyncio twin of :meth:`release`."""
        if self._laned:
            ran = await self.pools.loops.arun_with(self._alane_release, lease, lease.pinned)
        else:
            plan = lambda nodes: release_plan(self.state, nodes, lease)  # noqa: E731
            ran = await self.pools.loops.arun(plan, lease.pinned)
        held = self._released(lease, ran[0])
        return await giveback.aconfirm(
            self.state, lease, held, self._arun_first, self.pools.run_aside
        )

    async def arelease_many(self, leases: Sequence[LeaseRecord]) -> list[bool]:
        """Asyncio twin of :meth:`release_many`."""
        pinned = leases[0].pinned if leases else None
        plan = lambda nodes: release_set_plan(self.state, nodes, leases)  # noqa: E731
        held = (await self.pools.loops.arun(plan, pinned))[0]
        return [
            await giveback.aconfirm(
                self.state, lease, self._released(lease, ok), self._arun_first, self.pools.run_aside
            )
            for lease, ok in zip(leases, held, strict=True)
        ]

    async def aforce_release(self, name: str, expected: str = "", key: str = "") -> int:
        """Asyncio twin of :meth:`force_release`."""
        plan = lambda nodes: force_release_plan(self.state, nodes, name, expected, key)  # noqa: E731
        return (await self.pools.loops.arun(plan))[0]

    async def astore_record(
        self, lease: LeaseRecord, fields: Sequence[tuple[str, bytes | str]], ttl: float
    ) -> int:
        """Asyncio twin of :meth:`store_record`."""
        plan = lambda nodes: store_record_plan(self.state, nodes, lease, fields, ttl)  # noqa: E731
        return (await self.pools.loops.arun(plan, lease.pinned))[0]

    async def aread_record(
        self, name: str, fields: Sequence[str], pinned: Any = None
    ) -> RecordRead:
        """Asyncio twin of :meth:`read_record`."""
        plan = lambda nodes: read_record_plan(self.state, nodes, name, fields)  # noqa: E731
        return (await self.pools.loops.arun(plan, pinned))[0]

    def _check_fork(self) -> None:
        if self.pools.generation != forks.current:
            self._start_afresh()

    def owns(self, lease: LeaseRecord) -> bool:
        """False for a lease this process's parent acquired before a fork."""
        return lease.generation == forks.current

    # -- policy helpers ------------------------------------------------------------------
    def _queue_first(self, target: Target, timeout: float | None) -> bool:
        """Queue at once, without a first attempt, behind a waiter a release here just woke."""
        return timeout != 0 and not target.many and self.reservations.reserved(target.name)

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
            self.reservations.note(lease)
        return held

    def wait_release(self, name: str, seconds: float, *, mark: Waiting | None = None) -> bool:
        """Wait up to ``seconds`` for a release of ``name`` to wake this thread (True if so);
        ``mark``: first register this waiter (when no failed attempt did)."""
        return self.waits.wait(name, seconds, mark)

    async def await_release(
        self, name: str, seconds: float, *, mark: Waiting | None = None
    ) -> bool:
        """Asyncio twin of :meth:`wait_release`."""
        return await self.waits.await_release(name, seconds, mark)
