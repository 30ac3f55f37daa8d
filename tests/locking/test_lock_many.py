"""``lock_many``/``alock_many`` (docs/primitives.md) on real nodes: all or nothing, a token per
name, no
deadlock between overlapping sets taken in any order, no partial hold left behind."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import pytest
from django.conf import settings

from django_redlock import locks
from django_redlock.exceptions import LockError, LockNotAcquired
from django_redlock.testing import RedisNodes
from tests.support import engine_workers as workers
from tests.support.processes import PROCESSES
from tests.support.waiting import assert_woken, backing_off, until_waiting


@pytest.mark.parametrize("alias", ["default", "five"])
def test_every_name_held_each_with_its_own_token(alias: str, unique_name: str) -> None:
    manager = locks[alias]
    names = [f"{unique_name}:{i}" for i in range(3)]
    with manager.lock_many(names, ttl=5) as held:
        assert list(held.leases) == names
        tokens = [held.leases[name].token for name in names]
        assert len(set(tokens)) == 3
        for name in names:
            with pytest.raises(LockNotAcquired):
                manager.acquire(name, timeout=0)
    for name in names:  # all released
        lease = manager.acquire(name, timeout=0)
        assert lease.token > max(tokens)
        lease.release()


@pytest.mark.parametrize("alias", ["default", "five"])
def test_all_or_nothing(alias: str, unique_name: str) -> None:
    """One name of the set is busy: the attempt fails and holds none of the others."""
    manager = locks[alias]
    a, b, c = (f"{unique_name}:{x}" for x in "abc")
    other = manager.acquire(b, ttl=5, timeout=0)
    with pytest.raises(LockNotAcquired) as busy:
        manager.acquire_many([a, b, c], timeout=0)
    assert busy.value.name == b
    for name in (a, c):
        manager.acquire(name, timeout=0).release()  # free: nothing half-held
    other.release()


def test_waits_for_the_busy_name_and_is_woken(unique_name: str) -> None:
    """A set with a busy name waits for that name and is woken by its release (see
    tests/support/waiting.py: not let in by a backoff step)."""
    manager = locks["five"]
    a, b = f"{unique_name}:a", f"{unique_name}:b"
    other = manager.acquire(b, ttl=30, timeout=0)
    took: list[Any] = []

    def wait() -> None:
        with manager.lock_many([a, b], ttl=5, timeout=30) as held:
            took.append(held.leases[b])

    with backing_off(manager):
        thread = threading.Thread(target=wait)
        thread.start()
        until_waiting(manager, b)
        assert other.release() is True
        thread.join(30)
    assert took and took[0].token > other.token
    assert_woken(manager, b, other, took)


# the 1-node case is in the long profile: the 5-node one runs the same processes
@pytest.mark.parametrize("alias", [pytest.param("default", marks=pytest.mark.slow), "five"])
def test_overlapping_sets_in_random_orders_from_eight_processes(
    alias: str, session_nodes: RedisNodes, unique_name: str
) -> None:
    """8 processes x 20 sections, each taking 2-4 of 6 names in random order: all finish (no
    deadlock), never two holders of one name, no lost update."""
    url = session_nodes[0].url
    with PROCESSES.Pool(8) as pool:
        done = pool.starmap(
            workers.random_sets_under_lock_many,
            [(settings.REDLOCK, alias, unique_name, url, 20, seed) for seed in range(8)],
        )
    assert done == [20] * 8
    client = session_nodes[0].client()
    seen = [int(n) for n in client.lrange(f"{unique_name}:seen", 0, -1)]
    assert seen and max(seen) == 1
    for i in range(6):
        name = f"{unique_name}:{i}"
        assert client.get(f"{name}:value") == client.get(f"{name}:expected")


def test_a_semaphore_in_the_set_is_a_lock_error(unique_name: str) -> None:
    manager = locks["five"]
    permit = manager.acquire(unique_name, ttl=5, timeout=0, permits=2)
    with pytest.raises(LockError, match="another kind"):
        manager.acquire_many([f"{unique_name}:x", unique_name], timeout=0)
    permit.release()


@pytest.mark.parametrize(
    ("names", "error", "message"),
    [
        ([], ValueError, "at least one name"),
        ("abc", TypeError, "iterable of lock names"),
        (["a", 1], TypeError, "must be a str"),
        (["a", "__x"], ValueError, "reserved"),
        ([f"n{i}" for i in range(1001)], ValueError, "at most 1000 names"),
    ],
)
def test_bad_names_fail_before_any_network_call(
    names: Any, error: type[Exception], message: str, redlock_alias: Any
) -> None:
    manager = redlock_alias(["redis://127.0.0.1:1/0"])  # nothing listens there
    with pytest.raises(error, match=message):
        manager.lock_many(names)
    with pytest.raises(error, match=message):
        manager.acquire_many(names)


def test_alock_many(unique_name: str) -> None:
    manager = locks["five"]
    names = [f"{unique_name}:{i}" for i in range(3)]

    async def main() -> list[int]:
        order: list[int] = []

        async def one(i: int) -> None:
            async with manager.alock_many(list(reversed(names)) if i % 2 else names, timeout=10):
                order.append(i)
                await asyncio.sleep(0.02)

        await asyncio.gather(*(one(i) for i in range(4)))
        return order

    assert sorted(asyncio.run(main())) == [0, 1, 2, 3]


def test_releasing_a_set_frees_every_name_and_wakes_their_waiters(unique_name: str) -> None:
    """One release of the set (one call per node) frees every name, and a caller waiting for
    one of them is woken by it (not let in by a backoff step)."""
    manager = locks["five"]
    names = [f"{unique_name}:{i}" for i in range(4)]
    held = manager.acquire_many(names, ttl=30, timeout=0)
    got: list[Any] = []

    def wait() -> None:
        with manager.lock(names[2], ttl=5, timeout=30) as lease:
            got.append(lease)

    with backing_off(manager):
        thread = threading.Thread(target=wait)
        thread.start()
        until_waiting(manager, names[2])
        assert held.release() is True
        thread.join(30)
    assert got and got[0].token > held.leases[names[2]].token
    assert_woken(manager, names[2], held.leases[names[2]], got)
    assert held.release() is True  # again: nothing left to release, nothing lost
    for name in names:
        manager.acquire(name, timeout=0).release()


def _renewal_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("redlock-renew")]


@pytest.mark.parametrize("alias", ["default", "five"])
def test_an_auto_extended_set_is_renewed_by_one_thread(alias: str, unique_name: str) -> None:
    """20 names, TTL 1 s, held for 2.5 TTLs: every name is renewed, by one thread for the set
    (one per name before: a set of a thousand names started a thousand threads); the thread
    ends with the release."""
    names = [f"{unique_name}:{i}" for i in range(20)]
    before = len(_renewal_threads())
    with locks[alias].lock_many(names, ttl=1.0, auto_extend=True) as held:
        assert len(_renewal_threads()) == before + 1
        time.sleep(2.5)
        assert all(lease.validity > 0 and not lease.lost for lease in held.leases.values())
        with pytest.raises(LockNotAcquired):
            locks[alias].acquire(names[-1], timeout=0)
    assert len(_renewal_threads()) == before
    locks[alias].acquire(names[-1], timeout=0).release()


def test_a_set_renewal_finds_one_lost_name_and_keeps_the_others(unique_name: str) -> None:
    """One name of an auto-extended set is force-released: its lease is found lost by its next
    renewal (lock_lost for it alone), the other names go on being renewed."""
    from django_redlock import signals

    names = [f"{unique_name}:{i}" for i in range(3)]
    lost: list[str] = []

    def on_lost(sender: Any, name: str, **kwargs: Any) -> None:
        lost.append(name)

    signals.lock_lost.connect(on_lost)
    try:
        held = locks["five"].acquire_many(names, ttl=1.0, auto_extend=True)
        assert locks["five"].force_release(names[1]) == 5
        time.sleep(1.6)
        assert lost == [names[1]]
        assert held.leases[names[1]].lost
        assert all(held.leases[n].validity > 0 for n in (names[0], names[2]))
        assert held.release() is False  # one of them was lost
        assert held.release() is False  # again: the same answer (it used to say True)
    finally:
        signals.lock_lost.disconnect(on_lost)
    assert not _renewal_threads() or all(not t.is_alive() for t in _renewal_threads())


@pytest.mark.django_db(transaction=True)
def test_a_set_kept_until_commit_is_renewed_by_one_thread(unique_name: str) -> None:
    """Inside a transaction the set is released after the commit and renewed meanwhile (TTL
    1 s, 2.5 s in the transaction), by one thread for the set."""
    from django.db import transaction

    names = [f"{unique_name}:{i}" for i in range(10)]
    before = len(_renewal_threads())
    with transaction.atomic():
        with locks["default"].lock_many(names, ttl=1.0) as held:
            pass
        assert len(_renewal_threads()) == before + 1
        time.sleep(2.5)
        assert all(lease.validity > 0 for lease in held.leases.values())
    deadline = time.monotonic() + 5
    while any(not lease.released for lease in held.leases.values()):
        assert time.monotonic() < deadline, "the set was not released after the commit"
        time.sleep(0.01)
    locks["default"].acquire(names[0], timeout=0).release()
