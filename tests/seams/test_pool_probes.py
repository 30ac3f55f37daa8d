"""Probes of the connection budget (``MAX_CONNECTIONS``, ``IDLE_TIMEOUT``) where it meets the
other features, written from docs/index.md and docs/production.md ("Managed Redis") only.
Real redis-server nodes; connections counted with ``CLIENT LIST`` (the inspecting client is
named and left out)."""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.db import transaction

from django_redlock.conf import parse_alias
from django_redlock.exceptions import LockNotAcquired, NodesUnavailable
from django_redlock.locking.manager import LockManager
from django_redlock.testing import RedisNode, RedisNodes

Nodes = Callable[..., RedisNodes]
Alias = Callable[..., LockManager]
INSPECTOR = "probe-inspector"
URL = "redis://127.0.0.1:1/0"


def _ours(node: RedisNode) -> int:
    """This process's lock connections to ``node`` (every client but the inspector)."""
    client = node.client(client_name=INSPECTOR)
    try:
        return sum(1 for c in client.client_list() if c.get("name") != INSPECTOR)
    finally:
        client.close()


def _run_threads(targets: list[Callable[[], None]], seconds: float) -> list[BaseException]:
    """Run each target in a thread; return the errors; fail if one is still running."""
    errors: list[BaseException] = []

    def wrap(target: Callable[[], None]) -> Callable[[], None]:
        def run() -> None:
            try:
                target()
            except BaseException as exc:  # reported to the test
                errors.append(exc)

        return run

    threads = [threading.Thread(target=wrap(t), daemon=True) for t in targets]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + seconds
    for thread in threads:
        thread.join(max(0.0, deadline - time.monotonic()))
    assert not any(t.is_alive() for t in threads), "a thread hung"
    return errors


# -- bad values -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("MAX_CONNECTIONS", 0),
        ("MAX_CONNECTIONS", -1),
        ("MAX_CONNECTIONS", True),
        ("MAX_CONNECTIONS", False),
        ("MAX_CONNECTIONS", "5"),
        ("MAX_CONNECTIONS", 1.5),
        ("MAX_CONNECTIONS", 5.0),
        ("MAX_CONNECTIONS", math.nan),
        ("MAX_CONNECTIONS", math.inf),
        ("MAX_CONNECTIONS", None),
        ("IDLE_TIMEOUT", 0),
        ("IDLE_TIMEOUT", -1),
        ("IDLE_TIMEOUT", True),
        ("IDLE_TIMEOUT", "5"),
        ("IDLE_TIMEOUT", math.nan),
        ("IDLE_TIMEOUT", math.inf),
        ("IDLE_TIMEOUT", -math.inf),
        ("IDLE_TIMEOUT", 1e10),  # finite, but a thread wait this long overflows
        ("IDLE_TIMEOUT", 1e300),
        ("IDLE_TIMEOUT", None),
    ],
)
def test_bad_pool_values_are_improperly_configured(key: str, value: Any) -> None:
    with pytest.raises(ImproperlyConfigured, match=rf"REDLOCK\['bad'\]\['{key}'\]"):
        parse_alias("bad", {"NODES": [URL], key: value})


def test_longest_idle_timeout_keeps_the_idle_closer_alive(
    redis_node_factory: Nodes, redlock_alias: Alias
) -> None:
    """The longest IDLE_TIMEOUT accepted (30 days) works: sync and asyncio locks, and no
    background thread dies (a wait of 1e300 s killed the idle closer with OverflowError)."""
    nodes = redis_node_factory(1)
    manager = redlock_alias(nodes, IDLE_TIMEOUT=30 * 86400)
    dead: list[BaseException | None] = []
    old_hook = threading.excepthook
    threading.excepthook = lambda args: dead.append(args.exc_value)
    try:
        manager.acquire("a", timeout=0).release()
        time.sleep(0.2)

        async def main() -> None:
            lease = await manager.aacquire("b", timeout=0)
            await lease.arelease()
            await asyncio.sleep(0.05)

        asyncio.run(main())
    finally:
        threading.excepthook = old_hook
    assert dead == []
    assert _ours(nodes[0]) == 1  # the sync connection, kept while idle


# -- MAX_CONNECTIONS=1 ------------------------------------------------------------------


def test_max1_release_from_another_thread_reaches_a_blocked_waiter(
    redis_node_factory: Nodes, redlock_alias: Alias, unique_name: str
) -> None:
    """MAX_CONNECTIONS=1: a waiter blocks in acquire(); the holder (another thread) releases;
    the release must get through and the waiter must win, no deadlock."""
    nodes = redis_node_factory(3)
    manager = redlock_alias(nodes, MAX_CONNECTIONS=1, TTL=10)
    lease = manager.acquire(unique_name, timeout=0)
    got: list[Any] = []

    def waiter() -> None:
        got.append(manager.acquire(unique_name, timeout=5))

    thread = threading.Thread(target=waiter, daemon=True)
    thread.start()
    time.sleep(0.3)
    released: list[bool] = []
    releaser = threading.Thread(target=lambda: released.append(lease.release()), daemon=True)
    releaser.start()
    releaser.join(6)
    thread.join(6)
    assert released == [True]
    assert len(got) == 1 and got[0].release() is True
    assert max(_ours(n) for n in nodes) <= 1


def test_max1_lock_many_semaphore_rw_under_contention(
    redis_node_factory: Nodes, redlock_alias: Alias, unique_name: str
) -> None:
    """MAX_CONNECTIONS=1, 3 nodes, 6 threads each doing lock_many, a semaphore of 2 and
    read/write locks: everything is granted in time, never more than 1 connection a node."""
    nodes = redis_node_factory(3)
    manager = redlock_alias(nodes, MAX_CONNECTIONS=1, TTL=5, RETRY_DELAY=0.01)
    inside = {"sem": 0, "peak": 0, "writers": 0, "readers": 0, "bad": 0}
    guard = threading.Lock()

    def work(i: int) -> None:
        for _ in range(3):
            with manager.lock_many([f"{unique_name}:a", f"{unique_name}:b"], timeout=10):
                time.sleep(0.002)
            with manager.semaphore(f"{unique_name}:s", 2, timeout=10):
                with guard:
                    inside["sem"] += 1
                    inside["peak"] = max(inside["peak"], inside["sem"])
                time.sleep(0.005)
                with guard:
                    inside["sem"] -= 1
            if i % 3 == 0:
                with manager.write_lock(f"{unique_name}:rw", timeout=10):
                    with guard:
                        inside["writers"] += 1
                        inside["bad"] += inside["readers"] > 0 or inside["writers"] > 1
                    time.sleep(0.003)
                    with guard:
                        inside["writers"] -= 1
            else:
                with manager.read_lock(f"{unique_name}:rw", timeout=10):
                    with guard:
                        inside["readers"] += 1
                        inside["bad"] += inside["writers"] > 0
                    time.sleep(0.003)
                    with guard:
                        inside["readers"] -= 1

    errors = _run_threads([lambda i=i: work(i) for i in range(6)], 40)
    assert errors == []
    assert inside["peak"] <= 2 and inside["bad"] == 0
    assert max(_ours(n) for n in nodes) <= 1


def test_renewal_is_not_starved_by_waiters_holding_the_budget(
    redis_node_factory: Nodes, redlock_alias: Alias, unique_name: str
) -> None:
    """An auto-extended lease (TTL 0.6 s) held 2 s while 20 threads wait for the name with
    MAX_CONNECTIONS=2: every renewal gets a connection, the lease is never lost."""
    nodes = redis_node_factory(1)
    manager = redlock_alias(nodes, MAX_CONNECTIONS=2, TTL=0.6, RETRY_DELAY=0.005)
    stop = time.monotonic() + 2.2

    def waiter() -> None:
        while time.monotonic() < stop:
            # a waiter refused a connection within its timeout fails as if the node were
            # down (docs/production.md): NodesUnavailable
            with contextlib.suppress(LockNotAcquired, NodesUnavailable):
                manager.acquire(unique_name, timeout=0.3).release()

    threads = [threading.Thread(target=waiter, daemon=True) for _ in range(20)]
    with manager.lock(unique_name, auto_extend=True, timeout=0) as lease:
        for thread in threads:
            thread.start()
        time.sleep(2.0)
        assert not lease.lost
        lease.check()
    for thread in threads:
        thread.join(5)
    assert _ours(nodes[0]) <= 2


@pytest.mark.django_db(transaction=True)
def test_until_commit_releases_get_through_a_budget_of_one(
    redis_node_factory: Nodes, redlock_alias: Alias, unique_name: str
) -> None:
    """MAX_CONNECTIONS=1: five blocks end inside atomic() (kept until the commit and renewed),
    a thread waits for one of them; the commit releases all five and the waiter wins."""
    nodes = redis_node_factory(3)
    manager = redlock_alias(nodes, MAX_CONNECTIONS=1, TTL=0.9)
    names = [f"{unique_name}:{i}" for i in range(5)]
    got: list[Any] = []
    waiter = threading.Thread(
        target=lambda: got.append(manager.acquire(names[0], timeout=8)), daemon=True
    )
    with transaction.atomic():
        for name in names:
            with manager.lock(name, timeout=2):
                pass
        waiter.start()
        time.sleep(1.5)  # longer than the TTL: the kept leases must be renewed
        assert got == []
    waiter.join(8)
    assert len(got) == 1
    assert got[0].release() is True
    for name in names[1:]:
        manager.acquire(name, timeout=0).release()


# -- asyncio ----------------------------------------------------------------------------


def test_cancelled_tasks_waiting_for_a_connection_leak_nothing(
    redis_node_factory: Nodes, redlock_alias: Alias, unique_name: str
) -> None:
    """MAX_CONNECTIONS=1, a node paused so each call holds the only connection for
    NODE_TIMEOUT; 30 tasks queue for it and are cancelled. Afterwards the budget of one
    is still there: locks work, and one at a time."""
    nodes = redis_node_factory(3)
    manager = redlock_alias(nodes, MAX_CONNECTIONS=1, NODE_TIMEOUT=0.2, RETRY_DELAY=0.01)

    async def main() -> list[str]:
        await (await manager.aacquire(f"{unique_name}:warm", timeout=0)).arelease()
        nodes[0].pause()
        try:
            tasks = [
                asyncio.create_task(manager.aacquire(f"{unique_name}:{i}", timeout=3))
                for i in range(30)
            ]
            for delay in (0.01, 0.05, 0.1, 0.25):
                await asyncio.sleep(delay)
                for task in tasks[: len(tasks) // 2]:
                    task.cancel()
                tasks = tasks[len(tasks) // 2 :]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        finally:
            nodes[0].resume()
        await asyncio.sleep(0.3)
        done: list[str] = []
        for i in range(3):
            lease = await manager.aacquire(f"{unique_name}:after{i}", timeout=2)
            done.append("ok" if await lease.arelease() else "lost")
        return done

    assert asyncio.run(main()) == ["ok", "ok", "ok"]
    # and the sync side (another kind) shares the same budget: it gets a connection too
    manager.acquire(f"{unique_name}:sync", timeout=2).release()
    assert max(_ours(n) for n in nodes) <= 1


def test_cancelled_waiters_in_blpop_leave_the_full_budget(
    redis_node_factory: Nodes, redlock_alias: Alias, unique_name: str
) -> None:
    """MAX_CONNECTIONS=4: 20 tasks wait (BLPOP) for a held name and are cancelled; then 4
    tasks each hold a connection at once (a paused node makes every call last NODE_TIMEOUT)
    and all of them finish well before a budget of fewer would let them."""
    nodes = redis_node_factory(3)
    manager = redlock_alias(nodes, MAX_CONNECTIONS=4, NODE_TIMEOUT=0.3, TTL=5)

    async def main() -> int:
        held = await manager.aacquire(unique_name, timeout=0)
        tasks = [asyncio.create_task(manager.aacquire(unique_name, timeout=5)) for _ in range(20)]
        await asyncio.sleep(0.4)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        assert await held.arelease() is True
        await asyncio.sleep(0.2)
        counts = [_ours(n) for n in nodes]
        assert max(counts) <= 4, counts
        # the cancelled waiters stopped counting: timeout=0 gets the name
        await (await manager.aacquire(unique_name, timeout=0)).arelease()
        return max(counts)

    asyncio.run(main())
    manager.acquire(unique_name, timeout=0).release()


# -- fork -------------------------------------------------------------------------------


@pytest.mark.skipif(not hasattr(os, "fork"), reason="fork")
def test_forked_child_gets_a_fresh_budget_while_the_parents_is_spent(
    redis_node_factory: Nodes, redlock_alias: Alias, unique_name: str
) -> None:
    """MAX_CONNECTIONS=1 and four parent threads locking without pause, so the parent's only
    connection is busy (or its budget's lock held) at each fork: every child locks on its own
    budget; the parent goes on within its budget."""
    nodes = redis_node_factory(1)
    manager = redlock_alias(nodes, MAX_CONNECTIONS=1, NODE_TIMEOUT=1.0)
    manager.acquire(f"{unique_name}:warm", timeout=0).release()
    stop = threading.Event()

    def hammer() -> None:
        while not stop.is_set():
            with contextlib.suppress(LockNotAcquired):
                manager.acquire(f"{unique_name}:p", timeout=1).release()

    threads = [threading.Thread(target=hammer, daemon=True) for _ in range(4)]
    for thread in threads:
        thread.start()
    try:
        statuses = []
        for _ in range(5):
            time.sleep(0.05)
            pid = os.fork()
            if pid == 0:  # the child: must lock quickly, on its own connections
                code = 1
                try:
                    manager.acquire(f"{unique_name}:c{os.getpid()}", timeout=2).release()
                    code = 0
                finally:
                    os._exit(code)
            deadline = time.monotonic() + 10
            while True:
                done, status = os.waitpid(pid, os.WNOHANG)
                if done:
                    statuses.append(os.waitstatus_to_exitcode(status))
                    break
                if time.monotonic() > deadline:
                    os.kill(pid, 9)
                    os.waitpid(pid, 0)
                    statuses.append("hung")
                    break
                time.sleep(0.01)
    finally:
        stop.set()
        for thread in threads:
            thread.join(5)
    assert statuses == [0] * 5
    manager.acquire(f"{unique_name}:parent", timeout=1).release()
    assert _ours(nodes[0]) <= 1


# -- IDLE_TIMEOUT and paused nodes ------------------------------------------------------


def test_idle_timeout_shorter_than_a_held_lease(
    redis_node_factory: Nodes, redlock_alias: Alias, unique_name: str
) -> None:
    """IDLE_TIMEOUT=0.2: a lease held (not renewed) 0.8 s outlives its idle connections; its
    release still deletes the key, and an auto-extended one keeps being renewed."""
    nodes = redis_node_factory(3)
    manager = redlock_alias(nodes, IDLE_TIMEOUT=0.2, TTL=0.9)
    lease = manager.acquire(f"{unique_name}:plain", ttl=3, timeout=0)
    time.sleep(0.8)
    assert [_ours(n) for n in nodes] == [0, 0, 0]
    assert lease.release() is True
    with manager.lock(f"{unique_name}:renewed", auto_extend=True, timeout=0) as renewed:
        time.sleep(2.0)
        renewed.check()
    manager.acquire(f"{unique_name}:plain", timeout=0).release()


def test_paused_node_with_a_spent_budget_still_grants_and_recovers(
    redis_node_factory: Nodes, redlock_alias: Alias, unique_name: str
) -> None:
    """3 nodes, MAX_CONNECTIONS=2, node 0 paused: 8 threads lock (the quorum of the other
    two grants); after the resume node 0's budget serves again, within 2 connections."""
    nodes = redis_node_factory(3)
    manager = redlock_alias(nodes, MAX_CONNECTIONS=2, NODE_TIMEOUT=0.2, RETRY_DELAY=0.01)
    manager.acquire(f"{unique_name}:warm", timeout=0).release()
    nodes[0].pause()
    try:

        def work(i: int) -> None:
            for j in range(3):
                lease = manager.acquire(f"{unique_name}:{i}:{j}", timeout=5)
                assert lease.release() is True

        errors = _run_threads([lambda i=i: work(i) for i in range(8)], 40)
    finally:
        nodes[0].resume()
    assert errors == []
    time.sleep(0.3)
    nodes[1].pause()  # now node 0 must vote
    try:
        manager.acquire(f"{unique_name}:after", timeout=3).release()
    finally:
        nodes[1].resume()
    assert max(_ours(n) for n in nodes) <= 2


# -- kinds sharing a budget of one ------------------------------------------------------


@pytest.mark.parametrize("busy_side", ["threads", "loop"])
def test_budget_of_one_shared_by_a_busy_kind_and_a_starving_one(
    redis_node_factory: Nodes, redlock_alias: Alias, unique_name: str, busy_side: str
) -> None:
    """MAX_CONNECTIONS=1: one kind (sync threads, or an event loop) locks without pause; the
    other kind must still get the connection within its timeout, and both finish."""
    nodes = redis_node_factory(1)
    manager = redlock_alias(nodes, MAX_CONNECTIONS=1)
    stop = threading.Event()
    rounds = [0]

    def hammer_sync() -> None:
        while not stop.is_set():
            manager.acquire(f"{unique_name}:busy", timeout=2).release()
            rounds[0] += 1

    async def hammer_async() -> None:
        while not stop.is_set():
            lease = await manager.aacquire(f"{unique_name}:busy", timeout=2)
            await lease.arelease()
            rounds[0] += 1

    busy = threading.Thread(
        target=hammer_sync if busy_side == "threads" else lambda: asyncio.run(hammer_async()),
        daemon=True,
    )
    busy.start()
    try:
        time.sleep(0.2)
        for _ in range(5):
            if busy_side == "threads":

                async def once() -> bool:
                    lease = await manager.aacquire(f"{unique_name}:other", timeout=3)
                    return await lease.arelease()

                assert asyncio.run(once()) is True
            else:
                assert manager.acquire(f"{unique_name}:other", timeout=3).release() is True
    finally:
        stop.set()
        busy.join(10)
    assert not busy.is_alive() and rounds[0] > 0
    assert _ours(nodes[0]) <= 1


def test_async_renewal_is_not_starved_by_waiting_tasks(
    redis_node_factory: Nodes, redlock_alias: Alias, unique_name: str
) -> None:
    """alock(auto_extend=True), TTL 0.6 s, held 2 s while 30 tasks of the same loop wait for
    the name with MAX_CONNECTIONS=1: the renewals get through, the lease is never lost."""
    nodes = redis_node_factory(1)
    manager = redlock_alias(nodes, MAX_CONNECTIONS=1, TTL=0.6, RETRY_DELAY=0.005)

    async def main() -> None:
        stop = time.monotonic() + 2.2

        async def waiter() -> None:
            while time.monotonic() < stop:
                try:
                    lease = await manager.aacquire(unique_name, timeout=0.3)
                    await lease.arelease()
                except (LockNotAcquired, NodesUnavailable):
                    pass

        async with manager.alock(unique_name, auto_extend=True, timeout=0) as lease:
            tasks = [asyncio.create_task(waiter()) for _ in range(30)]
            await asyncio.sleep(2.0)
            assert not lease.lost
            lease.check()
        await asyncio.gather(*tasks)

    asyncio.run(main())
