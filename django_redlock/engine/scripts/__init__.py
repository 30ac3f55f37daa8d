"""Lua scripts run on every node, as commented module constants.

The keys they touch are named in :mod:`.keyspace`. Each script's reply codes are named
constants right after it; the plans compare replies with those names, never bare numbers.

* ``<prefix>__waiters__:<name>`` is a sorted set of the callers waiting for the name: each
  failed attempt of a caller that will wait adds (or refreshes) its waiter id, scored with the
  moment its registration lapses (``TIME`` of that node + at most 1 s); a caller that wins
  removes itself. A release wakes one waiter only while a registration is still ahead, so a
  waiter that won, gave up or died stops counting (at once, at its deadline, within 1 s).
* ``<prefix>__wake__:<name>`` is a one-element list pushed by that release on the node the
  name's waiters block on; a waiter blocked in ``BLPOP`` on it wakes (exactly one per release).
* ``<prefix>__handoff__:<name>`` is set by that release for a few milliseconds: only a woken
  waiter may take the name meanwhile, so the lock changes hands instead of going straight
  back to the releaser.
* ``<prefix>__fence__`` is never deleted by release, clear or force-release, so Redis memory
  stays flat however many names are locked.

A node whose ``run_id`` field differs from the ``run_id`` the client read from ``INFO`` on
connect has restarted (or is new): it votes for nothing until :data:`REJOIN` marks it again.

Modules: :mod:`.lock` (the lock's scripts and reply codes), :mod:`.waits` (waiter sets),
:mod:`.primitives` (semaphores, ``lock_many`` sets, read-write locks), :mod:`.limits`
(``limits()``: a permit of several semaphores at once), :mod:`.fragments` (Lua
they share). The lock's and the waiters' names are re-exported here.
"""

from __future__ import annotations

from . import limits, primitives
from .lock import (
    ACQUIRE,
    BUSY,
    DELETED,
    EXTEND,
    FORCE_RELEASE,
    GRANTED,
    HANDED_OFF,
    NOT_HELD,
    OTHER_KIND,
    PROBE,
    RAISE,
    REJOIN,
    RELEASE,
    RELEASED,
    RENEWED,
    STILL_HELD,
    UNTRUSTED,
    passed_counter,
)
from .script import Script
from .waits import REGISTER, WAITING, WITHDRAW

#: Every script a lock connection loads on connect (``WAITING`` is sent as EVAL, by inspection
#: only).
ALL_SCRIPTS = (
    ACQUIRE,
    RELEASE,
    EXTEND,
    RAISE,
    REJOIN,
    PROBE,
    FORCE_RELEASE,
    WITHDRAW,
    REGISTER,
    primitives.PERMIT,
    primitives.RELEASE_PERMIT,
    primitives.ACQUIRE_MANY,
    primitives.READ,
    primitives.WRITE,
    primitives.READ_RELEASE,
    primitives.READ_EXTEND,
    primitives.RELEASE_MANY,
    limits.ACQUIRE_LIMITS,
    limits.RELEASE_PERMITS,
)

__all__ = [
    "ACQUIRE",
    "ALL_SCRIPTS",
    "BUSY",
    "DELETED",
    "EXTEND",
    "FORCE_RELEASE",
    "GRANTED",
    "HANDED_OFF",
    "NOT_HELD",
    "OTHER_KIND",
    "PROBE",
    "RAISE",
    "REGISTER",
    "REJOIN",
    "RELEASE",
    "RELEASED",
    "RENEWED",
    "STILL_HELD",
    "UNTRUSTED",
    "WAITING",
    "WITHDRAW",
    "Script",
    "passed_counter",
]
