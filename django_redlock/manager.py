"""The public lock API of one alias: ``acquire``/``lock`` and their asyncio twins, and leases."""

from __future__ import annotations

import asyncio
import functools
import inspect
import logging
import threading
import time
from collections.abc import Callable
from types import TracebackType
from typing import Any, TypeVar, cast

from . import context, signals
from .conf import AliasConfig
from .engine.alinks import AsyncChannel
from .engine.core import Engine
from .engine.links import Channel
from .engine.plans import (
    HANDOFF_MS,
    AcquireFailure,
    LeaseState,
    acquire_plan,
    extend_plan,
    force_release_plan,
    release_plan,
)
from .engine.waiting import backoff_delay
from .exceptions import LockLost, LockNotAcquired, NodesUnavailable
from .validation import check_max_hold, check_name, check_timeout, check_ttl

logger = logging.getLogger("django_redlock")

F = TypeVar("F", bound=Callable[..., Any])


class _Unset:
    def __repr__(self) -> str:
        return "UNSET"


UNSET: Any = _Unset()


class Lease:
    """A held lock. ``token`` is its fencing token; ``validity`` the seconds it has left."""

    def __init__(
        self, manager: LockManager, state: LeaseState, channel: Channel | AsyncChannel
    ) -> None:
        self._manager = manager
        self._state = state
        self._channel = channel
        self._lost_sent = False
        self._signal_guard = threading.Lock()
        self._renewer: _Renewer | None = None
        self._arenewer: asyncio.Task[None] | None = None

    @property
    def name(self) -> str:
        return self._state.name

    @property
    def token(self) -> int:
        return self._state.token

    @property
    def alias(self) -> str:
        return self._manager.alias

    @property
    def ttl(self) -> float:
        return self._state.ttl

    @property
    def validity(self) -> float:
        """Seconds of validity left on a monotonic clock; 0 once lost, expired or released."""
        return self._state.validity()

    @property
    def lost(self) -> bool:
        """True once the lease expired or a node said someone else owns it."""
        return self._state.lost or (not self._state.released and self._state.validity() <= 0)

    @property
    def released(self) -> bool:
        return self._state.released

    def __repr__(self) -> str:  # the owner value is secret and never shown
        return (
            f"<Lease alias={self.alias!r} name={self.name!r} token={self.token} "
            f"validity={self.validity:.3f}>"
        )

    # -- losing ----------------------------------------------------------------------------
    def _mark_lost(self, reason: str) -> None:
        self._state.lost = True
        with self._signal_guard:
            if self._lost_sent:
                return
            self._lost_sent = True
        logger.warning("Lock %r (alias %r) lost: %s", self.name, self.alias, reason)
        signals.lock_lost.send(sender=self._manager, alias=self.alias, name=self.name, lease=self)

    def _ttl_for(self, ttl: float | None) -> float:
        return self._state.ttl if ttl is None else check_ttl(ttl)

    # -- sync ------------------------------------------------------------------------------
    def extend(self, ttl: float | None = None) -> None:
        """Renew the lease to ``ttl`` seconds (default: its TTL); raises ``LockLost``."""
        ttl = self._ttl_for(ttl)
        engine = self._manager.engine
        pinned = self._channel if isinstance(self._channel, Channel) else None
        renewed, _ = engine.run(
            lambda nodes: extend_plan(engine.state, nodes, self._state, ttl), pinned
        )
        if not renewed:
            self._mark_lost("extend() found it no longer held")
            raise LockLost(self.name, "it was no longer held when extend() ran")

    def release(self) -> bool:
        """Release the lock. True the first time if it was still held; never deletes a key
        that someone else owns."""
        self.stop_auto_extend()
        if self._state.released:
            return False
        engine = self._manager.engine
        pinned = self._channel if isinstance(self._channel, Channel) else None
        held, _ = engine.run(lambda nodes: release_plan(engine.state, nodes, self._state), pinned)
        return self._after_release(bool(held))

    def _after_release(self, held: bool) -> bool:
        if self._state.handed_off:
            self._manager._handed_off(self.name)
        if not held:
            self._mark_lost("it had expired or was taken when it was released")
        signals.lock_released.send(
            sender=self._manager, alias=self.alias, name=self.name, lease=self
        )
        return held

    def start_auto_extend(self, max_hold: float | None) -> None:
        """Renew from a daemon thread every third of the TTL until release or ``max_hold``."""
        self._renewer = _Renewer(self, max_hold)
        self._renewer.start()

    def stop_auto_extend(self) -> None:
        renewer, self._renewer = self._renewer, None
        if renewer is not None:
            renewer.stop()
        task, self._arenewer = self._arenewer, None
        if task is not None:
            task.cancel()

    # -- async -----------------------------------------------------------------------------
    async def aextend(self, ttl: float | None = None) -> None:
        """Asyncio twin of :meth:`extend`."""
        ttl = self._ttl_for(ttl)
        engine = self._manager.engine
        pinned = self._channel if isinstance(self._channel, AsyncChannel) else None
        renewed, _ = await engine.arun(
            lambda nodes: extend_plan(engine.state, nodes, self._state, ttl), pinned
        )
        if not renewed:
            self._mark_lost("aextend() found it no longer held")
            raise LockLost(self.name, "it was no longer held when aextend() ran")

    async def arelease(self) -> bool:
        """Asyncio twin of :meth:`release`."""
        self.stop_auto_extend()
        if self._state.released:
            return False
        engine = self._manager.engine
        pinned = self._channel if isinstance(self._channel, AsyncChannel) else None
        held, _ = await engine.arun(
            lambda nodes: release_plan(engine.state, nodes, self._state), pinned
        )
        return self._after_release(bool(held))

    def astart_auto_extend(self, max_hold: float | None) -> None:
        self._arenewer = asyncio.get_running_loop().create_task(self._arenew(max_hold))

    async def _arenew(self, max_hold: float | None) -> None:
        started = time.monotonic()
        while True:
            await asyncio.sleep(self._state.ttl / 3)
            if max_hold is not None and time.monotonic() - started >= max_hold:
                await asyncio.sleep(self.validity)
                if not self._state.released:
                    self._mark_lost("max_hold reached; the lease ran out")
                return
            try:
                await self.aextend()
            except LockLost:
                return


class _Renewer(threading.Thread):
    """Keeps one lease alive until stopped, its renewal fails, or ``max_hold`` passes."""

    def __init__(self, lease: Lease, max_hold: float | None) -> None:
        super().__init__(name=f"redlock-renew {lease.name}", daemon=True)
        self._lease = lease
        self._max_hold = max_hold
        self._stop_event = threading.Event()

    def stop(self) -> None:
        self._stop_event.set()
        if self is not threading.current_thread():
            self.join()

    def run(self) -> None:
        lease = self._lease
        started = time.monotonic()
        while not self._stop_event.wait(lease.ttl / 3):
            if self._max_hold is not None and time.monotonic() - started >= self._max_hold:
                if not self._stop_event.wait(lease.validity) and not lease.released:
                    lease._mark_lost("max_hold reached; the lease ran out")
                return
            try:
                lease.extend()
            except LockLost:
                return


#: A woken waiter that still finds the name busy (the release has not reached every node yet)
#: retries this often, this many times, while the name is reserved for it, before waiting again.
HANDOFF_RETRY = 0.0005
HANDOFF_RETRIES = 10
#: At most this many recent hand-offs are remembered per alias (then forgotten at once).
HANDOFFS_KEPT = 1024


class _Patience:
    """When to try again: after a release wakes us, or at most a jittered exponential backoff,
    the holder's remaining TTL and what is left of ``timeout``; a woken waiter first retries
    quickly while the hand-off is reserved for it."""

    def __init__(self, retry_delay: float, timeout: float | None) -> None:
        self._retry_delay = retry_delay
        self._deadline = None if timeout is None else time.monotonic() + timeout
        self._attempt = 0
        self._quick = 0

    def _backoff(self) -> float:
        delay = backoff_delay(self._retry_delay, self._attempt)
        self._attempt += 1
        return delay

    def first_wait(self) -> float:
        """How long to wait in line before the first attempt (see :meth:`LockManager._skip`)."""
        delay = self._backoff()
        return delay if self._deadline is None else min(delay, self._deadline - time.monotonic())

    def next_wait(self, failure: AcquireFailure, woken: bool) -> tuple[float, bool] | None:
        """``(seconds, block)`` before the next attempt, or None when the timeout is used up.

        ``block`` True: wait for a release; False: just sleep (the caller stays woken)."""
        remaining = None if self._deadline is None else self._deadline - time.monotonic()
        if remaining is not None and remaining <= 0:
            return None
        if woken and self._quick < HANDOFF_RETRIES:
            self._quick += 1
            return HANDOFF_RETRY if remaining is None else min(HANDOFF_RETRY, remaining), False
        self._quick = 0
        delay = self._backoff()
        if failure.retry_after is not None:
            delay = min(delay, failure.retry_after + 0.001)
        return (delay if remaining is None else min(delay, remaining)), True


class LockManager:
    """The locks of one ``REDLOCK`` alias (``locks["default"]``)."""

    def __init__(self, config: AliasConfig, engine: Engine) -> None:
        self.config = config
        self.engine = engine
        #: name -> until when (monotonic) a release here reserved it for a woken waiter
        self._handoffs: dict[str, float] = {}

    @property
    def alias(self) -> str:
        return self.config.alias

    def __repr__(self) -> str:
        return f"<LockManager alias={self.alias!r} nodes={len(self.config.nodes)}>"

    # -- arguments -------------------------------------------------------------------------
    def _arguments(
        self, name: Any, ttl: Any, timeout: Any, max_hold: Any = None
    ) -> tuple[str, float, float | None, float | None]:
        return (
            check_name(name),
            check_ttl(self.config.ttl if ttl is None else ttl),
            check_timeout(self.config.timeout if timeout is UNSET else timeout),
            check_max_hold(max_hold),
        )

    def _handed_off(self, name: str) -> None:
        if len(self._handoffs) >= HANDOFFS_KEPT:
            self._handoffs.clear()
        self._handoffs[name] = time.monotonic() + HANDOFF_MS / 1000

    def _skip(self, name: str, timeout: float | None) -> bool:
        """True when a first attempt is bound to fail: this process has just released ``name``
        to a waiter, and the name is reserved for it. Such a caller (typically the releaser
        looping round) goes straight to the back of the line: it marks the name as wanted in
        the same write as its ``BLPOP``, which saves a doomed acquire round trip per hand-off.
        If the wake-up never comes, its wait (one backoff step) ends and it tries normally."""
        if timeout == 0:
            return False
        until = self._handoffs.pop(name, None)
        return until is not None and until > time.monotonic()

    def _won(self, state: LeaseState, channel: Channel | AsyncChannel) -> Lease:
        lease = Lease(self, state, channel)
        signals.lock_acquired.send(sender=self, alias=self.alias, name=state.name, lease=lease)
        return lease

    def _failed(self, name: str, failure: AcquireFailure, timeout: float | None) -> Exception:
        quorum = self.config.quorum
        logger.debug(
            "Lock %r (alias %r) not acquired: %s, %d/%d votes",
            name,
            self.alias,
            failure.reason,
            failure.votes,
            quorum,
        )
        if failure.reason == "unavailable":
            reason = "unavailable"
            exc: Exception = NodesUnavailable(
                name,
                answered=failure.answered,
                quorum=quorum,
                total=len(self.config.nodes),
                errors=failure.errors,
                retry_after=failure.retry_after,
            )
        else:
            reason = "busy" if not timeout else "timeout"
            exc = LockNotAcquired(
                name,
                timeout=timeout,
                votes=failure.votes,
                quorum=quorum,
                errors=failure.errors,
                retry_after=failure.retry_after,
            )
        signals.lock_failed.send(sender=self, alias=self.alias, name=name, reason=reason)
        return exc

    def _attempt_plan(
        self, name: str, ttl: float, timeout: float | None, woken: bool = False
    ) -> Callable[[Any], Any]:
        state, will_wait = self.engine.state, timeout != 0
        return lambda nodes: acquire_plan(state, nodes, name, ttl, will_wait=will_wait, woken=woken)

    # -- sync ------------------------------------------------------------------------------
    def acquire(
        self,
        name: str,
        ttl: float | None = None,
        timeout: float | None = UNSET,
        *,
        auto_extend: bool = False,
        max_hold: float | None = None,
    ) -> Lease:
        """Acquire ``name``, waiting up to ``timeout`` seconds (0: one attempt; None: forever).

        Raises ``LockNotAcquired`` when busy and ``NodesUnavailable`` without a quorum.
        """
        name, ttl, timeout, max_hold = self._arguments(name, ttl, timeout, max_hold)
        patience, woken = _Patience(self.config.retry_delay, timeout), False
        if self._skip(name, timeout):
            woken = self.engine.wait_release(name, patience.first_wait(), mark=True)
        result, channel = self.engine.run(self._attempt_plan(name, ttl, timeout, woken))
        if isinstance(result, AcquireFailure) and timeout != 0:
            while isinstance(result, AcquireFailure):
                step = patience.next_wait(result, woken)
                if step is None:
                    break
                seconds, block = step
                if block:
                    woken = self.engine.wait_release(name, seconds)
                else:
                    time.sleep(seconds)
                result, channel = self.engine.run(self._attempt_plan(name, ttl, timeout, woken))
        if isinstance(result, AcquireFailure):
            raise self._failed(name, result, timeout)
        lease = self._won(result, channel)
        if auto_extend:
            lease.start_auto_extend(max_hold)
        return lease

    def lock(
        self,
        name: str,
        ttl: float | None = None,
        timeout: float | None = UNSET,
        *,
        auto_extend: bool = False,
        max_hold: float | None = None,
    ) -> LockBlock:
        """A context manager (sync or async) and decorator holding ``name`` while it runs."""
        return LockBlock(lambda: self, name, ttl, timeout, auto_extend, max_hold)

    def force_release(self, name: str, expected_value: str = "") -> int:
        """Delete ``name`` on every node whoever holds it and advance the fence counter.

        Returns the number of nodes that deleted it. For the admin and ``manage.py redlock``.
        """
        name = check_name(name)
        deleted, _ = self.engine.run(
            lambda nodes: force_release_plan(self.engine.state, nodes, name, expected_value)
        )
        return int(deleted)

    # -- async -----------------------------------------------------------------------------
    async def aacquire(
        self,
        name: str,
        ttl: float | None = None,
        timeout: float | None = UNSET,
        *,
        auto_extend: bool = False,
        max_hold: float | None = None,
    ) -> Lease:
        """Asyncio twin of :meth:`acquire`."""
        name, ttl, timeout, max_hold = self._arguments(name, ttl, timeout, max_hold)
        patience, woken = _Patience(self.config.retry_delay, timeout), False
        if self._skip(name, timeout):
            woken = await self.engine.await_release(name, patience.first_wait(), mark=True)
        result, channel = await self.engine.arun(self._attempt_plan(name, ttl, timeout, woken))
        if isinstance(result, AcquireFailure) and timeout != 0:
            while isinstance(result, AcquireFailure):
                step = patience.next_wait(result, woken)
                if step is None:
                    break
                seconds, block = step
                if block:
                    woken = await self.engine.await_release(name, seconds)
                else:
                    await asyncio.sleep(seconds)
                result, channel = await self.engine.arun(
                    self._attempt_plan(name, ttl, timeout, woken)
                )
        if isinstance(result, AcquireFailure):
            raise self._failed(name, result, timeout)
        lease = self._won(result, channel)
        if auto_extend:
            lease.astart_auto_extend(max_hold)
        return lease

    def alock(
        self,
        name: str,
        ttl: float | None = None,
        timeout: float | None = UNSET,
        *,
        auto_extend: bool = False,
        max_hold: float | None = None,
    ) -> LockBlock:
        """Asyncio twin of :meth:`lock` (``async with``; decorates coroutine functions)."""
        return LockBlock(lambda: self, name, ttl, timeout, auto_extend, max_hold)


class LockBlock:
    """``with``/``async with`` block and decorator around one lock.

    As a decorator, ``name`` is a template formatted with the call's arguments
    (``"report:{0}"``, ``"user:{user_id}"``).
    """

    def __init__(
        self,
        get_manager: Callable[[], LockManager],
        name: str,
        ttl: float | None,
        timeout: float | None,
        auto_extend: bool,
        max_hold: float | None,
    ) -> None:
        if not isinstance(name, str):
            raise TypeError(f"Lock name must be a str, not {type(name).__name__}.")
        self._get_manager = get_manager
        self._name = name
        self._options = (ttl, timeout, auto_extend, max_hold)
        self._leases: list[tuple[Lease, Any]] = []

    def _acquire_kwargs(self) -> dict[str, Any]:
        ttl, timeout, auto_extend, max_hold = self._options
        return {"ttl": ttl, "timeout": timeout, "auto_extend": auto_extend, "max_hold": max_hold}

    # -- sync ------------------------------------------------------------------------------
    def __enter__(self) -> Lease:
        lease = self._get_manager().acquire(self._name, **self._acquire_kwargs())
        self._leases.append((lease, context.push(lease)))
        return lease

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        lease, token = self._leases.pop()
        context.pop(token)
        held = lease.release()
        if exc_type is None and not held:
            raise LockLost(lease.name, "its lease ran out or was taken while the block ran")

    # -- async -----------------------------------------------------------------------------
    async def __aenter__(self) -> Lease:
        lease = await self._get_manager().aacquire(self._name, **self._acquire_kwargs())
        self._leases.append((lease, context.push(lease)))
        return lease

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        lease, token = self._leases.pop()
        context.pop(token)
        held = await lease.arelease()
        if exc_type is None and not held:
            raise LockLost(lease.name, "its lease ran out or was taken while the block ran")

    # -- decorator -------------------------------------------------------------------------
    def _for_call(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> LockBlock:
        try:
            name = self._name.format(*args, **kwargs)
        except (IndexError, KeyError, AttributeError) as exc:
            raise ValueError(
                f"Lock name template {self._name!r} cannot be filled from the call's "
                f"arguments: {exc!r}."
            ) from exc
        ttl, timeout, auto_extend, max_hold = self._options
        return LockBlock(self._get_manager, name, ttl, timeout, auto_extend, max_hold)

    def __call__(self, func: F) -> F:
        if inspect.iscoroutinefunction(func):

            @functools.wraps(func)
            async def async_wrapper(*args: Any, **kwargs: Any) -> Any:
                async with self._for_call(args, kwargs):
                    return await func(*args, **kwargs)

            return cast(F, async_wrapper)

        @functools.wraps(func)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            with self._for_call(args, kwargs):
                return func(*args, **kwargs)

        return cast(F, wrapper)
