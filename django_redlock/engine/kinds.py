"""The kinds of lease in one table: what differs between a lock, a semaphore's permit and the
two leases of a read-write lock (scripts, keys, wake-ups, hand-offs, how messages name them).
The plans look a kind up here instead of branching on it."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from . import scripts
from .keyspace import Keyspace
from .scripts import primitives
from .scripts.script import Script

#: ``LeaseRecord.kind`` of each kind of lease.
LOCK, PERMIT, READ, WRITE = "", "permit", "read", "write"
#: After a release that woke a waiter, only a woken waiter may take the name for this long
#: (ms); if it never comes (it died, or its timeout ran out) anyone may take it afterwards.
HANDOFF_MS = 10
#: A semaphore's reservation counts the slots promised to woken waiters, each taken off when its
#: waiter wins: it lapses this long after the last release (a waiter that gave up or died
#: keeps its slot from callers that were not woken no longer than that).
PERMIT_HANDOFF_MS = 100

#: (keys, name, permits) -> the keys an attempt may take (in the order tried) and every key
#: its script touches.
AcquireKeys = Callable[[Keyspace, str, int], tuple[tuple[str, ...], tuple[str, ...]]]
#: (keys, name, held, slots, queue) -> the keys a release touches (see ``release_call``).
ReleaseKeys = Callable[
    [Keyspace, str, tuple[str, ...], tuple[str, ...], tuple[str, ...]], tuple[str, ...]
]


@dataclass(frozen=True, slots=True)
class LeaseKind:
    """One kind of lease."""

    #: how messages name a lease of this kind
    label: str
    acquire: Script
    extend: Script
    release: Script
    acquire_keys: AcquireKeys
    release_keys: ReleaseKeys
    #: how many waiters a release wakes (the release script's last argument): exactly one
    #: ("0"), one more per release ("1"), every waiter ("2": the readers a write lease kept
    #: out go in together)
    wakes: str = "0"
    #: how long a release's reservation for the woken waiters lasts, ms
    handoff_ms: int = HANDOFF_MS
    #: the name's lock key holds a marker shared by several leases (permits, read leases)
    marked: bool = False
    #: a node holds a value of this lease's own (a read lease only counts in a set)
    own_value: bool = True
    #: a release hands the name off only when a quorum of nodes did (a permit's releaser
    #: queues only when no free slot was left for it)
    handoff_needs_quorum: bool = False


def _lock_keys(keys: Keyspace, name: str, permits: int) -> tuple[tuple[str, ...], tuple[str, ...]]:
    lock = keys.lock(name)
    return (lock,), (lock, keys.fence, keys.waiters(name), keys.handoff(name))


def _permit_keys(
    keys: Keyspace, name: str, permits: int
) -> tuple[tuple[str, ...], tuple[str, ...]]:
    # Every caller tries the slots in the same order, so each node grants the lowest free
    # slot: callers racing for k free slots get the slot of their arrival rank on each node,
    # and a split (no slot on a quorum) needs ranks to differ across nodes. Random orders
    # split more often under contention (measured: 3.2x vs 0.6x the contended lock on 5 nodes).
    tried = tuple(keys.permit(name, k) for k in range(permits))
    touched = (keys.fence, keys.waiters(name), keys.handoff(name), keys.lock(name), *tried)
    return tried, touched


def _rw_touched(keys: Keyspace, name: str) -> tuple[str, ...]:
    queue = (keys.waiters(name), keys.handoff(name), keys.writers(name))
    return (keys.fence, keys.readers(name), keys.lock(name), *queue)


def _read_keys(keys: Keyspace, name: str, permits: int) -> tuple[tuple[str, ...], tuple[str, ...]]:
    return (keys.readers(name),), _rw_touched(keys, name)


def _write_keys(keys: Keyspace, name: str, permits: int) -> tuple[tuple[str, ...], tuple[str, ...]]:
    return (keys.lock(name),), _rw_touched(keys, name)


def _lock_release(
    keys: Keyspace, name: str, held: tuple[str, ...], slots: tuple[str, ...], queue: tuple[str, ...]
) -> tuple[str, ...]:
    return (held[0] if held else keys.lock(name), *queue)


def _permit_release(
    keys: Keyspace, name: str, held: tuple[str, ...], slots: tuple[str, ...], queue: tuple[str, ...]
) -> tuple[str, ...]:
    others = tuple(slot for slot in slots if slot not in held)
    return (*queue, *held, *others)


def _read_release(
    keys: Keyspace, name: str, held: tuple[str, ...], slots: tuple[str, ...], queue: tuple[str, ...]
) -> tuple[str, ...]:
    return (keys.readers(name), keys.lock(name), *queue)


#: Every kind of lease, by ``LeaseRecord.kind``.
KINDS: dict[str, LeaseKind] = {
    LOCK: LeaseKind(
        "lock", scripts.ACQUIRE, scripts.EXTEND, scripts.RELEASE, _lock_keys, _lock_release
    ),
    PERMIT: LeaseKind(
        "semaphore permit",
        primitives.PERMIT,
        scripts.EXTEND,
        primitives.RELEASE_PERMIT,
        _permit_keys,
        _permit_release,
        wakes="1",
        handoff_ms=PERMIT_HANDOFF_MS,
        marked=True,
        handoff_needs_quorum=True,
    ),
    READ: LeaseKind(
        "read lease",
        primitives.READ,
        primitives.READ_EXTEND,
        primitives.READ_RELEASE,
        _read_keys,
        _read_release,
        marked=True,
        own_value=False,
    ),
    WRITE: LeaseKind(
        "write lease",
        primitives.WRITE,
        scripts.EXTEND,
        scripts.RELEASE,
        _write_keys,
        _lock_release,
        wakes="2",
    ),
}
