"""The ``locks`` registry: ``locks["default"]`` like ``django.core.cache.caches``.

One :class:`~django_redlock.locking.manager.LockManager` per alias and process (its connections are
pooled per thread inside the engine); reset when ``REDLOCK``, ``REDLOCK_BUSY_POLL`` or
``CACHES`` change, so ``override_settings(REDLOCK=...)`` works in tests; a change of
``REDLOCK_CHECK_ORDER`` (or ``DEBUG``, its default) turns the lock-order checker on or off in
the managers already made.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Unpack

from django.core.exceptions import ImproperlyConfigured
from django.core.signals import setting_changed
from django.dispatch import receiver

from ..conf import (
    AliasConfig,
    alias_config,
    busy_poll_setting,
    check_order_setting,
    redlock_settings,
)
from ..engine import AliasState, Budget, Engine
from ..nodes import connections
from ..validation import UNSET
from .block import BlockKeywords, LockBlock, block_options
from .manager import LockManager

#: Gives the engines to lock with instead of a manager's real ones, or None to leave it alone
#: (a simulation: ``django_redlock.testing.simulate``).
StandIn = Callable[[LockManager], Sequence[Engine] | None]


class LockManagers:
    """Mapping-like access to the configured aliases."""

    def __init__(self) -> None:
        self._managers: dict[str, LockManager] = {}
        # every manager still referenced, also those a reset dropped from the registry but
        # kept in a global (``manager = locks["default"]``): they follow REDLOCK_CHECK_ORDER too
        self._made: weakref.WeakSet[LockManager] = weakref.WeakSet()
        self._mutex = threading.Lock()
        #: the stand-ins in effect, innermost last (empty: nothing to do, the common case)
        self._stand_ins: list[StandIn] = []

    def __getitem__(self, alias: str) -> LockManager:
        manager = self._managers.get(alias)
        if manager is not None:
            return manager
        with self._mutex:
            manager = self._managers.get(alias)
            if manager is None:
                manager = self._create(alias)
                if self._stand_ins:
                    self._apply(manager)
                self._managers[alias] = manager
                self._made.add(manager)
            return manager

    def stand_in(self, engines_for: StandIn) -> Callable[[], None]:
        """Lock with the engines ``engines_for(manager)`` gives (where not None), for the
        managers there are and those created later, until the call returned is made. The
        innermost stand-in wins; undoing it restores what was in effect before."""
        with self._mutex:
            self._stand_ins.append(engines_for)
            for manager in self._managers.values():
                self._apply(manager)

        def undo() -> None:
            with self._mutex:
                if engines_for in self._stand_ins:
                    self._stand_ins.remove(engines_for)
                for manager in self._managers.values():
                    self._apply(manager)

        return undo

    def _apply(self, manager: LockManager) -> None:
        """Give ``manager`` the innermost stand-in's engines, or its real ones."""
        for engines_for in reversed(self._stand_ins):
            engines = engines_for(manager)
            if engines is not None:
                manager.use_engines(engines)
                return
        manager.use_engines(None)

    def __iter__(self) -> Iterator[str]:
        return iter(redlock_settings())

    def __contains__(self, alias: object) -> bool:
        return alias in redlock_settings()

    def all(self) -> list[LockManager]:
        return [self[alias] for alias in self]

    @staticmethod
    def _create(alias: str) -> LockManager:
        config = alias_config(alias)
        # one budget per alias: its shards' engines share each node's connections
        budget = Budget(len(config.nodes), config.max_connections, config.idle_timeout)
        engines = [_engine(shard, budget) for shard in config.shard_configs]
        return LockManager(config, engines[0], engines)

    def check_order_changed(self) -> None:
        """Turn the lock-order checker on or off in every manager made so far (a bad value
        drops them from the registry, so the next ``locks[alias]`` raises the setting's error
        before any network call, and turns the checker off in those kept elsewhere)."""
        try:
            on = check_order_setting()
        except ImproperlyConfigured:
            on = False
            self.reset()
        for manager in list(self._made):
            manager.check_order = on

    def reset(self) -> None:
        """Close the managers' engines and forget the managers. A manager kept elsewhere (a
        module's ``locks["default"]``) still works: its engine opens again on its next call.
        A later reset leaves it open: it is no longer the registry's, and closing an engine
        while its calls run makes them fail ("closed") and its waiters miss their wake-ups."""
        with self._mutex:
            managers, self._managers = self._managers, {}
        for manager in managers.values():
            for engine in manager.real_shards:
                engine.close()
        connections.reset_pools()


def _engine(config: AliasConfig, budget: Budget) -> Engine:
    """The engine of one alias (or of one shard of a spread cluster alias)."""
    state = AliasState(
        prefix=config.key_prefix,
        node_timeout=config.node_timeout,
        drift_factor=config.drift_factor,
        ttl=config.ttl,
        retry_delay=config.retry_delay,
        busy_poll=busy_poll_setting(),
        quorum_first=config.fan_out == "quorum",
    )
    return Engine(
        state,
        [node.label for node in config.nodes],
        [connections.sync_factory(node, config) for node in config.nodes],
        [connections.async_factory(node, config) for node in config.nodes],
        budget,
    )


locks = LockManagers()


@receiver(setting_changed)
def _reset_on_setting_changed(*, setting: str, **kwargs: Any) -> None:
    if setting in ("REDLOCK", "REDLOCK_BUSY_POLL", "CACHES"):
        locks.reset()
    elif setting in ("REDLOCK_CHECK_ORDER", "DEBUG"):
        locks.check_order_changed()


def lock(
    name: str,
    using: str = "default",
    ttl: float | None = None,
    timeout: float | None = UNSET,
    **options: Unpack[BlockKeywords],
) -> LockBlock:
    """Hold ``name`` on alias ``using`` for a ``with`` block, or decorate a function with it.

    As a decorator the name is a template filled from the call's arguments (by position or by
    parameter name), ``on_busy="skip"`` returns None without running a busy job, and
    ``min_hold`` keeps the name taken after a run, so duplicates sent for it are skipped::

        @lock("report:{day}", ttl=60, on_busy="skip", min_hold=600)
        def build_report(day): ...
    """
    wanted = block_options("lock", ttl, timeout, options, aio=False)
    return LockBlock(lambda: locks[using], name, wanted)
