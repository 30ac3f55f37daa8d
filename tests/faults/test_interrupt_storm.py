"""Signal storms (``tests/support/signal_storm.py``): blocking acquires each interrupted at a
random moment by a signal handler that raises, on the one-node alias (the lane) and on three
nodes. Whatever the moment (the write, the wait, the attempt after it, the steps after the
grant), no name is left locked by a lease nobody holds, and a completed acquire's release
frees its name. The counts are printed (``-s``); the long profile runs 2,500 calls per shape
(over 1,000 of them interrupted)."""

from __future__ import annotations

import asyncio
import os
import random
import threading
from collections.abc import Callable

import pytest

from django_redlock.locking.lease import Lease
from django_redlock.locking.manager import LockManager
from django_redlock.testing import RedisNodes
from tests.support.signal_storm import storm
from tests.support.waiting import until

Nodes = Callable[..., RedisNodes]
Alias = Callable[..., LockManager]
#: Calls per storm (``STORM_COUNT`` overrides): about 40 % of them are interrupted.
COUNT = int(os.environ.get("STORM_COUNT", "150"))
#: The long profile's storms: over 1,000 interrupted acquires per shape.
LONG_COUNT = 2500


def _locked(nodes: RedisNodes, prefix: str, pattern: str = "n:*") -> list[str]:
    """The lock keys of ``prefix`` (matching ``pattern``) still on a quorum of ``nodes``."""
    counts: dict[bytes, int] = {}
    for node in nodes:
        for key in node.client().scan_iter(match=f"{prefix}{pattern}", count=1000):
            counts[key] = counts.get(key, 0) + 1
    return sorted(k.decode() for k, c in counts.items() if c > len(nodes) // 2)


def _storm_acquires(nodes: RedisNodes, alias: Alias, count: int) -> None:
    """``count`` blocking acquires of names a holder keeps for 20-60 ms (then releases, from
    another thread), each interrupted at a random moment: half in its first 80 ms, half
    around the holder's release (when the woken waiter's attempt runs); then nothing may stay
    locked."""
    a = alias(nodes, TTL=10.0)
    holder = alias(nodes, TTL=10.0, KEY_PREFIX=a.config.key_prefix)
    freed_wrongly = 0
    with storm(seed=count) as s:
        for i in range(count):
            name = f"n:{i}"
            ttl = s.random.uniform(0.02, 0.06)
            releasing = threading.Timer(ttl, holder.acquire(name, timeout=0).release)
            releasing.start()
            at = s.random.uniform(0.0, 0.08) if i % 2 else s.random.uniform(ttl - 0.005, ttl + 0.01)
            lease: Lease | None = s.call(lambda: a.acquire(name, timeout=1.0), at)  # noqa: B023
            if lease is not None and lease.release():
                freed_wrongly += bool(_locked(nodes, a.config.key_prefix, name))
            releasing.join()
    print(f"\n{count} acquires: {s.interrupted} interrupted, {s.completed} completed")
    print("signals landed in:", s.landed.most_common(12))
    assert s.interrupted > count // 4 and s.completed > count // 10, "the storm missed"
    assert freed_wrongly == 0
    until(lambda: not _locked(nodes, a.config.key_prefix), 15.0, "no name left locked")


#: An interrupt inside redis-py's ``connect()``, between its socket's creation and its
#: return, leaves that socket to the garbage collector (redis-py closes it on ``OSError``
#: only): a ResourceWarning, not a name left locked or a connection kept.
SOCKET_LEFT_TO_GC = pytest.mark.filterwarnings(
    "ignore:Exception ignored in. <socket.socket:pytest.PytestUnraisableExceptionWarning"
)


@SOCKET_LEFT_TO_GC
@pytest.mark.parametrize("count", [1, 3])
def test_interrupted_blocking_acquires_leave_nothing_locked(
    redis_node_factory: Nodes, redlock_alias: Alias, count: int
) -> None:
    _storm_acquires(redis_node_factory(count), redlock_alias, COUNT)


@SOCKET_LEFT_TO_GC
@pytest.mark.slow
@pytest.mark.parametrize("count", [1, 3])
def test_over_a_thousand_interrupted_acquires_leave_nothing_locked(
    redis_node_factory: Nodes, redlock_alias: Alias, count: int
) -> None:
    _storm_acquires(redis_node_factory(count), redlock_alias, LONG_COUNT)


@pytest.mark.parametrize("count", [1, 3])
def test_cancelled_async_acquires_leave_nothing_locked(
    redis_node_factory: Nodes, redlock_alias: Alias, count: int
) -> None:
    """The asyncio twin: each ``aacquire`` is cancelled (``asyncio.wait_for``) at a random
    moment, half in its first 80 ms, half around the holder's release."""
    nodes = redis_node_factory(count)
    a = redlock_alias(nodes, TTL=10.0)
    holder = redlock_alias(nodes, TTL=10.0, KEY_PREFIX=a.config.key_prefix)
    rng = random.Random(count)
    cancelled = completed = freed_wrongly = 0

    async def main() -> None:
        nonlocal cancelled, completed, freed_wrongly
        for i in range(COUNT):
            name = f"n:{i}"
            ttl = rng.uniform(0.02, 0.06)
            held = await holder.aacquire(name, timeout=0)
            releasing = asyncio.get_running_loop().call_later(
                ttl, lambda h=held: asyncio.ensure_future(h.arelease())
            )
            at = rng.uniform(0.0, 0.08) if i % 2 else rng.uniform(ttl - 0.005, ttl + 0.01)
            try:
                lease = await asyncio.wait_for(a.aacquire(name, timeout=1.0), max(at, 0.0001))
            except TimeoutError:
                cancelled += 1
            else:
                completed += 1
                if await lease.arelease():
                    freed_wrongly += bool(_locked(nodes, a.config.key_prefix, name))
            await asyncio.sleep(max(0.0, ttl - at) + 0.005)
            releasing.cancel()
            await held.arelease()

    asyncio.run(main())
    print(f"\n{COUNT} async acquires: {cancelled} cancelled, {completed} completed")
    assert cancelled > COUNT // 4 and completed > COUNT // 10, "the cancellations missed"
    assert freed_wrongly == 0
    until(lambda: not _locked(nodes, a.config.key_prefix), 15.0, "no name left locked")
