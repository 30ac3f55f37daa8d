"""The lock engine: Redlock, fencing tokens and waiting, with no Django in it.

Layers, each importing only the ones below it::

    core.Engine          the facade: acquire / extend / release / force_release (+ asyncio)
    policy               when to try again and when to renew (I/O-free generators)
    plans, trust         the algorithm: one attempt, release, renewal, rejoining nodes
                         (I/O-free generators of requests; tests/engine/test_plans.py drives them)
    notes                short strings next to the locks (the markers of unique tasks)
    state, keyspace,     what plans know; key names, limits and the lock value format;
    kinds,               the kinds of lease in one table (lock, permit, read, write);
    scripts, replies     the Lua scripts with their reply codes; requests and replies
    handoff              grants on their way to their holder (given back when interrupted)
    transport/           pipelined calls to the nodes: sync, asyncio, BLPOP wake-ups, and the
                         one module that touches redis-py's internals

The Django layer (``django_redlock.locking.manager`` and the modules that use it) imports only what
this module exports.
"""

from __future__ import annotations

from . import forks, handoff
from .core import Engine, Outcome
from .giveback import unconfirmed as release_unconfirmed
from .giveback import why_unconfirmed
from .keyspace import (
    GLOB_CHARACTERS,
    MAX_NAME_LENGTH,
    RESERVED_MARK,
    SEMAPHORE_MARKER,
    TOKEN_LIMIT,
    Keyspace,
    LockValue,
    as_text,
    escape_glob,
    quorum,
)
from .kinds import KINDS
from .plans import order_edges
from .plans.lease import SemaphoreName
from .plans.notes import NoteHolder, NoteReplies, call_note, note_key
from .plans.order_edges import ORDER_TTL
from .plans.records import RecordRead
from .policy import Pause, Renew, RenewalBound, Stepper, renewal_policy
from .pools.budget import DEFAULT_IDLE_TIMEOUT, DEFAULT_MAX_CONNECTIONS, Budget
from .scripts import WAITING
from .starter import call_soon, start_thread
from .state import (
    DRIFT_ALLOWANCE,
    LOST,
    RENEWED,
    UNCONFIRMED,
    AcquireFailure,
    AliasState,
    LeaseRecord,
    Renewal,
    drift_allowance,
)
from .targets import WaiterCount
from .transport.aio import AsyncConnectionFactory
from .transport.base import describe, socket_timeout
from .transport.link import ConnectionFactory
from .transport.loop_time import wall_limit

__all__ = [
    "DEFAULT_IDLE_TIMEOUT",
    "DEFAULT_MAX_CONNECTIONS",
    "DRIFT_ALLOWANCE",
    "GLOB_CHARACTERS",
    "KINDS",
    "LOST",
    "MAX_NAME_LENGTH",
    "ORDER_TTL",
    "RENEWED",
    "RESERVED_MARK",
    "SEMAPHORE_MARKER",
    "TOKEN_LIMIT",
    "UNCONFIRMED",
    "WAITING",
    "AcquireFailure",
    "AliasState",
    "AsyncConnectionFactory",
    "Budget",
    "ConnectionFactory",
    "Engine",
    "Keyspace",
    "LeaseRecord",
    "LockValue",
    "NoteHolder",
    "NoteReplies",
    "Outcome",
    "Pause",
    "RecordRead",
    "Renew",
    "Renewal",
    "RenewalBound",
    "SemaphoreName",
    "Stepper",
    "WaiterCount",
    "as_text",
    "call_note",
    "call_soon",
    "describe",
    "drift_allowance",
    "escape_glob",
    "forks",
    "handoff",
    "note_key",
    "order_edges",
    "quorum",
    "release_unconfirmed",
    "renewal_policy",
    "socket_timeout",
    "start_thread",
    "wall_limit",
    "why_unconfirmed",
]
