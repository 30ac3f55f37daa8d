"""What ``manage.py redlock`` does under a simulation (docs/testing.md, "Without real nodes").

The command loads this module only when a simulation may be in play (``REDLOCK_SIMULATE`` is
set, or ``django_redlock.testing`` was imported), so production code never imports the test
helpers."""

from __future__ import annotations

import contextlib

from django.core.exceptions import ImproperlyConfigured

from ..locking.registry import locks
from .simulated_engine import SimulatedEngine
from .simulation import Simulation, simulation_from_environment


def from_environment() -> Simulation | None:
    """The simulation ``REDLOCK_SIMULATE`` asks for, or None; ``ValueError`` for a bad value."""
    return simulation_from_environment()


def simulated_aliases() -> list[str]:
    """The aliases whose locks are simulated now (bad settings: none, the command says so)."""
    found: list[str] = []
    with contextlib.suppress(ImproperlyConfigured):
        for alias in locks:
            if isinstance(locks[alias].engine, SimulatedEngine):
                found.append(alias)
    return found


def held_lines(aliases: list[str]) -> list[str]:
    """``redlock list``'s lines for the leases the simulations of ``aliases`` hold."""
    lines: list[str] = []
    seen: set[int] = set()
    for alias in aliases:
        engine = locks[alias].engine
        assert isinstance(engine, SimulatedEngine)
        if id(engine.locks) in seen:
            continue
        seen.add(id(engine.locks))
        for name, hold in engine.locks.held():
            kind = hold.kind or "lock"
            lines.append(f"{alias}\t{name}\t{kind}\ttoken={hold.token}\t(simulated)")
    return lines
