"""The Redlock algorithm as I/O-free plans, run by the sync and the asyncio driver alike.

A plan is a generator: it yields a :class:`~.replies.Request` (one call per node, a deadline
and an optional "settled" test) and receives the per-node replies, so one algorithm serves
both ``lock()`` and ``alock()``. ``tests/engine/test_plans.py`` drives each plan with scripted
replies, without Redis.

Modules: :mod:`.acquire` (one attempt of a lock, permit or read-write lease), :mod:`.many`
(``lock_many``), :mod:`.limits` (``limits()``: a permit of several semaphores),
:mod:`.rounds` (what every attempt shares), :mod:`.lease` (release, extend, force-release),
:mod:`.waiters` (waiter-set bookkeeping); the restart quarantine's plan is :mod:`..trust`.
The plans are re-exported here.
"""

from __future__ import annotations

from .acquire import QUARANTINED, acquire_plan, failure_of
from .lease import (
    counted_release,
    extend_plan,
    force_release_plan,
    note_unsure,
    release_again_plan,
    release_many_plan,
    release_plan,
)
from .limits import acquire_limits_plan, release_permits_plan, release_set_plan
from .many import acquire_many_plan
from .rounds import CLOCK, attempt_round, bracketed, quorum_first, waited_reply
from .tokens import own_tokens
from .waiters import register_plan, withdraw_plan

__all__ = [
    "CLOCK",
    "QUARANTINED",
    "acquire_limits_plan",
    "acquire_many_plan",
    "acquire_plan",
    "attempt_round",
    "bracketed",
    "counted_release",
    "extend_plan",
    "failure_of",
    "force_release_plan",
    "note_unsure",
    "own_tokens",
    "quorum_first",
    "register_plan",
    "release_again_plan",
    "release_many_plan",
    "release_permits_plan",
    "release_plan",
    "release_set_plan",
    "waited_reply",
    "withdraw_plan",
]
