"""A name taken as another kind (a lock, a semaphore of some size, a read-write lock) is a
conflict that no wait ends: the acquire raises ``LockError`` after one attempt, whatever its
timeout, from another thread and from asyncio alike. Real nodes (1 and 3)."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from django_redlock import locks
from django_redlock.exceptions import LockError, LockNotAcquired
from django_redlock.locking.manager import LockManager

#: The timeout every conflicting acquire is given; it must return long before.
TIMEOUT = 5.0
#: Well below TIMEOUT, well above one attempt on a loaded machine: it did not wait.
AT_ONCE = 2.0

#: How the name is held, and how another caller then asks for it, as another kind.
HOLD: dict[str, dict[str, Any]] = {
    "lock": {},
    "semaphore": {"permits": 2},
    "read": {"rw": "read"},
    "write": {"rw": "write"},
}
CONFLICTS = [
    ("semaphore", {}),  # a lock on a semaphore's name
    ("semaphore", {"permits": 3}),  # a semaphore of another size
    ("semaphore", {"rw": "read"}),
    ("semaphore", {"rw": "write"}),
    ("lock", {"permits": 2}),  # a semaphore on a lock's name
    ("write", {"permits": 2}),
    ("read", {"permits": 2}),
    ("semaphore", "many"),  # a lock_many set with a semaphore's name in it
]


@pytest.fixture
def held_elsewhere() -> Iterator[Callable[[LockManager, str, str], None]]:
    """``held_elsewhere(manager, kind, name)``: ``name`` held as ``kind`` by another thread
    (one attempt) until the test ends, so no lease of this thread is involved."""
    leases: list[Any] = []

    def hold(manager: LockManager, kind: str, name: str) -> None:
        thread = threading.Thread(
            target=lambda: leases.append(manager.acquire(name, ttl=30, timeout=0, **HOLD[kind]))
        )
        thread.start()
        thread.join(30)
        assert leases, "the holder did not get the name"

    yield hold
    for lease in leases:
        lease.release()


def _sync_attempt(manager: LockManager, name: str, wanted: Any) -> None:
    if wanted == "many":
        manager.acquire_many([f"{name}:other", name], ttl=5, timeout=TIMEOUT)
    else:
        manager.acquire(name, ttl=5, timeout=TIMEOUT, **wanted)


async def _async_attempt(manager: LockManager, name: str, wanted: Any) -> None:
    if wanted == "many":
        await manager.aacquire_many([f"{name}:other", name], ttl=5, timeout=TIMEOUT)
    else:
        await manager.aacquire(name, ttl=5, timeout=TIMEOUT, **wanted)


@pytest.mark.parametrize("alias", ["default", "multi"])
@pytest.mark.parametrize("how", ["sync", "asyncio"])
@pytest.mark.parametrize(("kind", "wanted"), CONFLICTS)
def test_a_kind_conflict_raises_at_once_whatever_the_timeout(
    alias: str,
    how: str,
    kind: str,
    wanted: Any,
    unique_name: str,
    held_elsewhere: Callable[[LockManager, str, str], None],
) -> None:
    """The name is held as another kind by another thread; an acquire with timeout=5 raises
    LockError (not LockNotAcquired) after one attempt, not at the end of its timeout."""
    manager = locks[alias]
    held_elsewhere(manager, kind, unique_name)
    started = time.monotonic()
    with pytest.raises(LockError) as raised:
        if how == "sync":
            _sync_attempt(manager, unique_name, wanted)
        else:
            asyncio.run(_async_attempt(manager, unique_name, wanted))
    elapsed = time.monotonic() - started
    assert not isinstance(raised.value, LockNotAcquired)
    assert elapsed < AT_ONCE, f"waited {elapsed:.2f} s for a conflict that no wait ends"
