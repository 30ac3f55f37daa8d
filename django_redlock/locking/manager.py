"""The lock API of one alias (``locks["default"]``): acquire, lock blocks, force-release.

Arguments are checked here, before any network call; the engine does the rest, and this
module turns its outcomes into leases, exceptions, signals and log lines.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, TypedDict, Unpack, cast

from .. import signals
from ..conf import AliasConfig, check_order_setting
from ..engine import (
    AcquireFailure,
    Engine,
    LeaseRecord,
    Outcome,
)
from ..exceptions import LockError
from ..nodes.cluster import shard_of
from ..validation import (
    UNSET,
    check_keywords,
    check_name,
    check_ttl,
)
from . import context, interrupted, ordering
from .block import (
    AsyncBlockKeywords,
    AsyncLockBlock,
    BlockKeywords,
    LockBlock,
    block_options,
)
from .kind_blocks import HoldOptions, KindBlocks
from .leader import Hook, Leadership
from .lease import Lease, start_renewals
from .limits import LimitsBlock, check_limits
from .many import HeldLocks, LockManyBlock, check_names
from .outcomes import Wanted, failure_exception, want

__all__ = ["UNSET", "Lease", "LockBlock", "LockManager"]

# docs/index.md: one logger name (records carry .module)
logger = logging.getLogger("django_redlock")


class RenewOptions(TypedDict, total=False):
    """Whether and how long a lease is renewed (as for ``acquire()``)."""

    auto_extend: bool
    max_hold: float | None


class LockManager(KindBlocks):
    """The locks of one ``REDLOCK`` alias (``locks["default"]``)."""

    def __init__(self, config: AliasConfig, engine: Engine, shards: Sequence[Engine] = ()) -> None:
        self.config = config
        #: the alias's engine (a spread cluster alias: its first shard's)
        self.engine = engine
        #: a spread cluster alias: one engine per shard (see :mod:`.cluster`); else [engine]
        self.shards: list[Engine] = list(shards) or [engine]
        #: ``REDLOCK_CHECK_ORDER``: the one check the acquire path makes when it is off
        #: (kept current by the registry's ``setting_changed`` receiver)
        self.check_order = check_order_setting()
        #: the engines built from the settings (``shards`` differ only while a simulation,
        #: ``django_redlock.testing.simulate``, stands in for them)
        self.real_shards: list[Engine] = self.shards

    def use_engines(self, engines: Sequence[Engine] | None) -> None:
        """Lock with ``engines`` (one per shard) from now on; None: the real ones again.
        Leases already taken keep the engine that took them."""
        chosen = self.real_shards if engines is None else list(engines)
        if len(chosen) != len(self.real_shards):
            raise ValueError(f"{len(self.real_shards)} engines needed, {len(chosen)} given.")
        self.engine, self.shards = chosen[0], chosen

    @property
    def simulated(self) -> bool:
        """True while a simulation (``django_redlock.testing.simulate``) stands in for the
        real engines: nothing may reach this alias's nodes."""
        return self.shards is not self.real_shards

    def shard_index(self, name: str) -> int:
        """Which of :attr:`shards` holds ``name`` (0 for an alias that is not spread)."""
        return 0 if len(self.shards) == 1 else shard_of(name, len(self.shards))

    def engine_for(self, name: str) -> Engine:
        """The engine that holds ``name``: its shard's on a spread cluster alias."""
        return self.engine if len(self.shards) == 1 else self.shards[self.shard_index(name)]

    @property
    def alias(self) -> str:
        return self.config.alias

    def __repr__(self) -> str:
        return f"<LockManager alias={self.alias!r} nodes={len(self.config.nodes)}>"

    # -- leases ----------------------------------------------------------------------------
    def acquire(
        self,
        name: str,
        ttl: float | None = None,
        timeout: float | None = UNSET,
        *,
        auto_extend: bool = False,
        max_hold: float | None = None,
        permits: int | None = None,
        rw: str | None = None,
    ) -> Lease:
        """Acquire ``name``, waiting up to ``timeout`` seconds (0: one attempt; None: forever).

        ``permits``: take one of that many permits of the semaphore ``name`` instead (see
        :meth:`semaphore`); ``rw``: ``"read"`` or ``"write"``, a lease of the read-write lock
        ``name`` (see :meth:`read_lock`). Raises ``LockNotAcquired`` when busy,
        ``NodesUnavailable`` without a quorum and ``LockError`` when ``name`` is taken as
        another kind (a lock, or a semaphore with another number of permits).
        """
        wanted = want(self.config, name, ttl, timeout, max_hold, permits, rw)
        shapes = ordering.taking(self, (wanted.name,)) if self.check_order else None
        engine = self.engine if len(self.shards) == 1 else self.engine_for(wanted.name)

        def take() -> Lease | AcquireFailure:
            outcome = engine.acquire(
                wanted.name, wanted.ttl, wanted.timeout, wanted.permits, wanted.rw
            )
            if type(outcome) is not LeaseRecord:
                return cast(AcquireFailure, outcome)
            lease = self._won(outcome, engine)
            if shapes is not None:
                ordering.mark(lease, shapes[0])
            if auto_extend:
                lease.start_auto_extend(wanted.max_hold)
            return lease

        # an interrupt before we return gives the grant back
        taken = interrupted.handed(take, self.engine_for)
        if isinstance(taken, AcquireFailure):
            raise failure_exception(self, wanted, taken)
        return taken

    async def aacquire(
        self,
        name: str,
        ttl: float | None = None,
        timeout: float | None = UNSET,
        *,
        auto_extend: bool = False,
        max_hold: float | None = None,
        permits: int | None = None,
        rw: str | None = None,
    ) -> Lease:
        """Asyncio twin of :meth:`acquire` (auto-extended from an asyncio task)."""
        wanted = want(self.config, name, ttl, timeout, max_hold, permits, rw)
        shapes = await ordering.ataking(self, (wanted.name,)) if self.check_order else None

        async def take() -> Lease:
            outcome = await self.engine_for(wanted.name).aacquire(
                wanted.name, wanted.ttl, wanted.timeout, wanted.permits, wanted.rw
            )
            lease = self._lease(wanted, outcome)
            if shapes is not None:
                ordering.mark(lease, shapes[0])
            if auto_extend:
                lease.astart_auto_extend(wanted.max_hold)
            return lease

        # an interrupt before we return gives the grant back
        return await interrupted.ahanded(take, self.engine_for)

    # -- blocks ----------------------------------------------------------------------------
    def lock(
        self,
        name: str,
        ttl: float | None = None,
        timeout: float | None = UNSET,
        **options: Unpack[BlockKeywords],
    ) -> LockBlock:
        """A context manager (``with``; also ``async with``) and decorator holding ``name``.

        ``reentrant``: inside an active lease of ``name`` in this thread or task, reuse it.
        ``until_commit``: ending inside a transaction, release after the commit.
        ``on_busy="skip"`` (decorators): a busy name returns None without calling.
        ``min_hold``: after a run without error, the name stays taken until that many seconds
        after it started (duplicates of one scheduled run are skipped, not run again).
        ``auto_extend``, ``max_hold``: renew the lease while the block runs, up to
        ``max_hold`` seconds (see :class:`~.block.BlockOptions`)."""
        return LockBlock(
            lambda: self, name, block_options("lock", ttl, timeout, options, aio=False)
        )

    def alock(
        self,
        name: str,
        ttl: float | None = None,
        timeout: float | None = UNSET,
        **options: Unpack[AsyncBlockKeywords],
    ) -> AsyncLockBlock:
        """Asyncio twin of :meth:`lock` (``async with`` and coroutine functions only);
        ``on_lost="cancel"`` (with ``auto_extend``) cancels the block's task when the lease
        is lost, and leaving the block then raises ``LockLost``."""
        wanted = block_options("alock", ttl, timeout, options, aio=True)
        return AsyncLockBlock(lambda: self, name, wanted)

    def leader(
        self,
        name: str,
        *,
        ttl: float | None = None,
        on_elected: Hook | None = None,
        on_demoted: Hook | None = None,
    ) -> Leadership:
        """Campaign for the leadership ``name`` (``with``): waits until elected, renews it
        while the block runs; ``.is_leader``, ``.term`` (the fencing token); ``on_demoted``
        runs at once when it is lost (docs/leaders.md)."""
        return self._leadership(name, ttl, on_elected, on_demoted, is_async=False)

    def aleader(
        self,
        name: str,
        *,
        ttl: float | None = None,
        on_elected: Hook | None = None,
        on_demoted: Hook | None = None,
    ) -> Leadership:
        """Asyncio twin of :meth:`leader` (``async with``; renewed from an asyncio task)."""
        return self._leadership(name, ttl, on_elected, on_demoted, is_async=True)

    def _leadership(
        self,
        name: str,
        ttl: float | None,
        on_elected: Hook | None,
        on_demoted: Hook | None,
        *,
        is_async: bool,
    ) -> Leadership:
        """A leadership, its name and TTL checked before any campaign."""
        check_name(name)
        if ttl is not None:
            check_ttl(ttl, self.config.drift_factor)
        return Leadership(
            self, name, ttl=ttl, on_elected=on_elected, on_demoted=on_demoted, is_async=is_async
        )

    # -- several names at once ---------------------------------------------------------------
    def acquire_many(
        self,
        names: Iterable[str],
        ttl: float | None = None,
        timeout: float | None = UNSET,
        **options: Unpack[RenewOptions],
    ) -> HeldLocks:
        """Every name of ``names`` or none, waiting up to ``timeout`` (see :meth:`lock_many`);
        ``auto_extend``/``max_hold`` as for :meth:`acquire`."""
        checked, wanted, auto_extend = self._many(names, ttl, timeout, options)
        shapes = ordering.taking(self, checked) if self.check_order else None

        def take() -> HeldLocks:
            engine = self.engine_for(checked[0])
            outcome = engine.acquire_many(checked, wanted.ttl, wanted.timeout)
            return self._held_many(
                checked, wanted, outcome, auto_extend, shapes, asyncio_task=False
            )

        return interrupted.handed(take, self.engine_for)

    async def aacquire_many(
        self,
        names: Iterable[str],
        ttl: float | None = None,
        timeout: float | None = UNSET,
        **options: Unpack[RenewOptions],
    ) -> HeldLocks:
        """Asyncio twin of :meth:`acquire_many`."""
        checked, wanted, auto_extend = self._many(names, ttl, timeout, options)
        shapes = await ordering.ataking(self, checked) if self.check_order else None

        async def take() -> HeldLocks:
            engine = self.engine_for(checked[0])
            outcome = await engine.aacquire_many(checked, wanted.ttl, wanted.timeout)
            return self._held_many(checked, wanted, outcome, auto_extend, shapes, asyncio_task=True)

        return await interrupted.ahanded(take, self.engine_for)

    def lock_many(
        self,
        names: Iterable[str],
        ttl: float | None = None,
        timeout: float | None = UNSET,
        **options: Unpack[HoldOptions],
    ) -> LockManyBlock:
        """A context manager (``with``; also ``async with``: ``alock_many`` is the same)
        holding every name of ``names``, all or nothing, whatever their order: callers asking
        for overlapping sets never deadlock, and a failed attempt leaves no name held. Yields
        a :class:`HeldLocks` whose ``leases`` maps each name to its lease (each with its own
        token). ``auto_extend``, ``max_hold`` and ``until_commit`` as for :meth:`lock`."""
        held = dict(options)
        until_commit = bool(held.pop("until_commit", True))
        checked, _, _ = self._many(names, ttl, timeout, cast("RenewOptions", held))
        kwargs = {"ttl": ttl, "timeout": timeout, **held}
        return LockManyBlock(self, checked, kwargs, until_commit)

    alock_many = lock_many

    # -- a permit of several semaphores at once ----------------------------------------------
    def acquire_limits(
        self,
        limits: Mapping[str, int],
        ttl: float | None = None,
        timeout: float | None = UNSET,
        **options: Unpack[RenewOptions],
    ) -> HeldLocks:
        """A permit of each semaphore of ``limits`` (name -> permits) or none, waiting up to
        ``timeout`` (see :meth:`limits`); ``auto_extend``/``max_hold`` as for :meth:`acquire`."""
        names, permits = check_limits(limits)
        _, wanted, auto_extend = self._many(names, ttl, timeout, options, "limits")
        shapes = ordering.taking(self, names) if self.check_order else None
        held = dict(zip(names, permits, strict=True))

        def take() -> HeldLocks:
            engine = self.engine_for(names[0])
            outcome = engine.acquire_limits(names, permits, wanted.ttl, wanted.timeout)
            return self._held_many(
                names, wanted, outcome, auto_extend, shapes, asyncio_task=False, permits=held
            )

        return interrupted.handed(take, self.engine_for)

    async def aacquire_limits(
        self,
        limits: Mapping[str, int],
        ttl: float | None = None,
        timeout: float | None = UNSET,
        **options: Unpack[RenewOptions],
    ) -> HeldLocks:
        """Asyncio twin of :meth:`acquire_limits`."""
        names, permits = check_limits(limits)
        _, wanted, auto_extend = self._many(names, ttl, timeout, options, "limits")
        shapes = await ordering.ataking(self, names) if self.check_order else None
        held = dict(zip(names, permits, strict=True))

        async def take() -> HeldLocks:
            engine = self.engine_for(names[0])
            outcome = await engine.aacquire_limits(names, permits, wanted.ttl, wanted.timeout)
            return self._held_many(
                names, wanted, outcome, auto_extend, shapes, asyncio_task=True, permits=held
            )

        return await interrupted.ahanded(take, self.engine_for)

    def limits(
        self,
        limits: Mapping[str, int],
        ttl: float | None = None,
        timeout: float | None = UNSET,
        **options: Unpack[HoldOptions],
    ) -> LimitsBlock:
        """A context manager (``with``; also ``async with``: ``alimits`` is the same) and
        decorator holding one permit of each semaphore of ``limits`` (name -> its permits),
        all or nothing: no permit is held while another is waited for, so callers asking for
        overlapping sets in any order never deadlock. Each semaphore is the one
        ``semaphore(name, permits)`` takes. Yields a :class:`HeldLocks` whose ``leases`` maps
        each name to its permit's lease (each with its own token). ``auto_extend``,
        ``max_hold`` and ``until_commit`` as for :meth:`lock`."""
        held = dict(options)
        until_commit = bool(held.pop("until_commit", True))
        names, permits = check_limits(limits)
        self._many(names, ttl, timeout, cast("RenewOptions", held), "limits")
        kwargs = {"ttl": ttl, "timeout": timeout, **held}
        return LimitsBlock(self, dict(zip(names, permits, strict=True)), kwargs, until_commit)

    alimits = limits

    def _many(
        self, names: Any, ttl: Any, timeout: Any, options: RenewOptions, what: str = "lock_many"
    ) -> tuple[tuple[str, ...], Wanted, bool]:
        """The checked names and arguments of a ``lock_many`` (or ``limits``) call, before
        any network call."""
        check_keywords(options, RenewOptions.__annotations__)
        checked = check_names(names)
        if len(self.shards) > 1 and len({self.shard_index(name) for name in checked}) > 1:
            raise LockError(
                f"{what} on alias {self.alias!r} needs names of one shard: its locks are "
                "spread over a cluster's masters, and one call holds names of one hash slot "
                "group. Give the names a common hash tag (e.g. '{cart:7}book', "
                "'{cart:7}pen'), or keep the alias in one slot with a tagged KEY_PREFIX "
                "('{lock}:')."
            )
        wanted = want(self.config, "-", ttl, timeout, options.get("max_hold"))
        return checked, wanted, bool(options.get("auto_extend", False))

    def _held_many(
        self,
        names: tuple[str, ...],
        wanted: Wanted,
        outcome: list[LeaseRecord] | AcquireFailure,
        auto_extend: bool,
        shapes: list[str] | None,
        *,
        asyncio_task: bool,
        permits: Mapping[str, int] | None = None,
    ) -> HeldLocks:
        if isinstance(outcome, AcquireFailure):
            wanted.name = outcome.busy_name or names[0]
            wanted.permits = 0 if permits is None else permits[wanted.name]
            raise failure_exception(self, wanted, outcome)
        leases = {record.name: Lease(self, record) for record in outcome}
        if shapes is not None:  # the lock-order checker: each lease's shape
            for name, shape in zip(names, shapes, strict=True):
                if name in leases:
                    ordering.mark(leases[name], shape)
        context.activate_all(list(leases.values()))  # guard FencedModel writes (docs/production.md)
        if signals.wanted(signals.lock_acquired):
            for lease in leases.values():
                self._send_acquired(lease)
        if auto_extend and asyncio_task:
            for lease in leases.values():
                lease.astart_auto_extend(wanted.max_hold)
        elif auto_extend:
            start_renewals(list(leases.values()), wanted.max_hold)  # one thread for the set
        return HeldLocks(leases)

    # -- operators -------------------------------------------------------------------------
    def force_release(self, name: str, expected_value: str = "") -> int:
        """Delete ``name`` on every node whoever holds it and advance the fence counter.

        Returns the number of nodes that deleted it. For the admin and ``manage.py redlock``.
        Raises ``ValueError`` for a semaphore's name (its permits are keys of their own:
        :func:`django_redlock.inspection.force_release` releases them, then the name).
        """
        name = check_name(name)
        return self.engine_for(name).force_release(name, expected_value)

    def release_owned(self, name: str, owner: str) -> bool:
        """Release ``name`` only if the lease whose owner value is ``owner`` holds it (one
        taken elsewhere and known by its owner value: a Celery enqueue marker released by
        the worker that runs its message). A compare-and-delete: True if it deleted it."""
        name = check_name(name)
        engine = self.engine_for(name)
        record = LeaseRecord(name, engine.state.keys.lock(name), owner, deadline=time.monotonic())
        return engine.release(record)

    # -- outcomes --------------------------------------------------------------------------
    def _lease(self, wanted: Wanted, outcome: Outcome) -> Lease:
        if isinstance(outcome, AcquireFailure):
            raise failure_exception(self, wanted, outcome)
        return self._won(outcome)

    def _won(self, record: LeaseRecord, engine: Engine | None = None) -> Lease:
        lease = Lease(self, record, engine)
        # guards FencedModel writes here until released (docs/production.md)
        context.activate(lease, (self.config.alias, record.name))
        if signals.wanted(signals.lock_acquired):  # the common case: nothing to build
            self._send_acquired(lease)
        return lease

    def _send_acquired(self, lease: Lease) -> None:
        signals.emit(
            signals.lock_acquired,
            self,
            alias=self.alias,
            name=lease.name,
            lease=lease,
            waited=lease.waited,
            attempts=lease.attempts,
        )
