"""``simulate()``: this process's locks without Redis, for users' unit tests.

Under ``with simulate(...)`` (or ``async with``) the lock managers of the covered aliases lock
with :class:`~.simulated_engine.SimulatedEngine` objects instead of their real engines (the
registry swaps them, for managers created meanwhile too), so every path that locks through a
manager (``lock``, ``@lock``, request locks and idempotency records, ``LockedTask``, unique
jobs, ``redlock run``, semaphores, read-write locks, ``lock_many``, the cache fill) acts in
memory and nothing reaches Redis. Outside a simulation nothing is checked: no cost.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Sequence
from types import TracebackType
from typing import Any

from ..engine import Engine
from ..locking.manager import LockManager
from ..locking.registry import locks
from .simulated_engine import SimulatedEngine
from .simulated_state import Faults, Hold, SimulatedLocks

#: ``manage.py redlock`` runs under ``simulate(**json.loads(...))`` when this is set (JSON
#: object of ``simulate``'s arguments): a subprocess started by a test can be simulated too.
ENVIRONMENT_VARIABLE = "REDLOCK_SIMULATE"


class Simulation:
    """What ``simulate()`` returns: a context manager (``with`` and ``async with``). Entering
    it twice at once is an error; it can be entered again after it ended."""

    def __init__(
        self,
        busy: Iterable[str] = (),
        unavailable: bool = False,
        lost_after: float | None = None,
        using: str | None = None,
    ) -> None:
        if using is not None and not isinstance(using, str):
            raise TypeError(f"using must be an alias (a string) or None, not {using!r}.")
        self.faults = Faults.of(busy, unavailable, lost_after)
        self.using = using
        #: the leases held in memory (shared by every alias the simulation covers)
        self.locks = SimulatedLocks(self.faults)
        self._engines: dict[int, list[SimulatedEngine]] = {}
        self._undo: Any = None

    def __repr__(self) -> str:
        return f"<Simulation using={self.using!r} {self.faults}>"

    def _engines_for(self, manager: LockManager) -> Sequence[Engine] | None:
        """The simulated engines of ``manager`` (one per real shard), or None when this
        simulation does not cover its alias."""
        if self.using is not None and manager.alias != self.using:
            return None
        engines = self._engines.get(id(manager))
        if engines is None or engines[0].real is not manager.real_shards[0]:
            engines = [SimulatedEngine(self.locks, real) for real in manager.real_shards]
            self._engines[id(manager)] = engines
        return engines

    def start(self) -> Simulation:
        if self._undo is not None:
            raise RuntimeError("This simulation is already active.")
        if self.using is not None and self.using not in locks:
            raise ValueError(
                f"simulate(using={self.using!r}): no such alias in settings.REDLOCK "
                f"(aliases: {', '.join(locks) or 'none'})."
            )
        self._undo = locks.stand_in(self._engines_for)
        return self

    def stop(self) -> None:
        undo, self._undo = self._undo, None
        if undo is not None:
            undo()
        self._engines.clear()

    def held(self) -> list[tuple[str, Hold]]:
        """The leases held in memory now: (name, hold) pairs."""
        return self.locks.held()

    def __enter__(self) -> Simulation:
        return self.start()

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    async def __aenter__(self) -> Simulation:
        return self.start()

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()


def simulate(
    busy: Iterable[str] = (),
    unavailable: bool = False,
    lost_after: float | None = None,
    using: str | None = None,
) -> Simulation:
    """This process's locks on alias ``using`` (None: every alias) without Redis while the
    returned context manager is active (``with`` or ``async with``).

    - names matching a ``busy`` glob (Redis ``MATCH`` syntax: ``*``, ``?``, ``[...]``, ``\\``)
      are held elsewhere: acquiring one fails as busy at once, whatever the timeout;
    - ``unavailable=True``: no quorum answers (``NodesUnavailable``, 503), at once;
    - ``lost_after=N``: every lease taken under it is lost N seconds after it was taken.

    Other names are held in memory, with real exclusion between this process's threads and
    tasks, and fencing tokens above any this process or an earlier run handed out."""
    return Simulation(busy, unavailable, lost_after, using)


def simulation_from_environment() -> Simulation | None:
    """The simulation that :data:`ENVIRONMENT_VARIABLE` asks for, or None when it is unset."""
    raw = os.environ.get(ENVIRONMENT_VARIABLE, "").strip()
    if not raw:
        return None
    try:
        arguments = json.loads(raw)
    except ValueError as exc:
        raise ValueError(f"{ENVIRONMENT_VARIABLE} must be a JSON object: {exc}") from exc
    if not isinstance(arguments, dict) or not set(arguments) <= {
        "busy",
        "unavailable",
        "lost_after",
        "using",
    }:
        raise ValueError(
            f"{ENVIRONMENT_VARIABLE} must be a JSON object with keys among busy, unavailable, "
            f"lost_after and using, not {raw!r}."
        )
    using = arguments.get("using")
    if using is not None and isinstance(using, str) and using not in locks:
        raise ValueError(
            f"{ENVIRONMENT_VARIABLE}: using={using!r} is not an alias of settings.REDLOCK "
            f"(aliases: {', '.join(locks) or 'none'})."
        )
    try:
        return simulate(**arguments)
    except (TypeError, ValueError) as exc:  # a wrong value in the JSON: one line naming it
        raise ValueError(f"{ENVIRONMENT_VARIABLE}: {exc}") from exc
