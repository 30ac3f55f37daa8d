"""``limits``/``alimits`` (docs/primitives.md) on real nodes: one permit of each semaphore, all
or nothing, no deadlock between overlapping sets in any order, the same semaphores as
``semaphore()``, release and renewal of the whole set."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import pytest
from django.conf import settings

from django_redlock import locks
from django_redlock.exceptions import LockError, LockLost, LockNotAcquired
from django_redlock.testing import RedisNodes
from tests.support import engine_workers as workers
from tests.support.bursts import at_one_moment
from tests.support.processes import PROCESSES
from tests.support.waiting import backing_off, until_waiting


def _keys_of(alias: str, nodes: RedisNodes, *names: str) -> list[bytes]:
    """Every key of ``names`` (the marker, slots, waiter sets...) on the alias's nodes."""
    prefix = settings.REDLOCK[alias]["KEY_PREFIX"]
    count = len(settings.REDLOCK[alias]["NODES"])
    found = []
    for node in nodes[:count]:
        for key in node.client().scan_iter(f"{prefix}*"):
            if any(key.endswith(f":{name}".encode()) or key == f"{prefix}{name}".encode()
                   for name in names):  # fmt: skip
                found.append(key)
    return found


@pytest.mark.parametrize("alias", ["default", "multi"])
def test_a_permit_of_each_semaphore_each_with_its_own_token(alias: str, unique_name: str) -> None:
    """The set holds one permit of each semaphore, a token each, and those permits count
    against ``semaphore()`` of the same name and permits."""
    manager = locks[alias]
    glob, tenant = f"{unique_name}:global", f"{unique_name}:tenant"
    with manager.limits({glob: 2, tenant: 1}, ttl=5) as held:
        assert list(held.leases) == [glob, tenant]
        assert all(lease.kind == "permit" for lease in held.leases.values())
        tokens = held.tokens
        assert tokens[tenant] == tokens[glob] + 1
        with pytest.raises(LockNotAcquired):  # the tenant's only permit is the set's
            manager.acquire(tenant, timeout=0, permits=1)
        other = manager.acquire(glob, timeout=0, permits=2)  # the global one has one left
        with pytest.raises(LockNotAcquired):
            manager.acquire(glob, timeout=0, permits=2)
        other.release()
    leases = [
        manager.acquire(name, timeout=0, permits=n)
        for name, n in ((glob, 2), (glob, 2), (tenant, 1))
    ]
    assert min(lease.token for lease in leases) > max(tokens.values())
    for lease in leases:
        lease.release()


@pytest.mark.parametrize("nodes", [3, 5])
def test_sets_of_free_semaphores_taken_at_one_moment_are_all_granted(
    nodes: int, redis_node_factory: Any, redlock_alias: Any
) -> None:
    """Twelve threads each take a set of two semaphores of their own, free, with timeout=0,
    at the same moment, ten rounds: every set is granted, each permit with its own token.
    Their grants draw tokens from the nodes' shared counters at once, so a lagging node's
    counter may pass a set's tokens by the strict write-back, though nobody holds those
    semaphores: such a set is tried again at once, as a single permit is."""
    manager = redlock_alias(redis_node_factory(nodes), TTL=2.0)
    refused: list[str] = []
    tokens: list[int] = []

    def take(round_: int, i: int) -> None:
        try:
            held = manager.acquire_limits({f"a{round_}-{i}": 3, f"b{round_}-{i}": 2}, timeout=0)
        except LockNotAcquired as exc:
            refused.append(str(exc))
        else:
            tokens.extend(held.tokens.values())
            held.release()

    at_one_moment(take, threads=12, rounds=10)
    assert refused == []
    assert len(set(tokens)) == len(tokens) == 240


@pytest.mark.parametrize("alias", ["default", "multi"])
def test_all_or_nothing(alias: str, unique_name: str, session_nodes: RedisNodes) -> None:
    """One semaphore of the set is full: the attempt fails, names it, and leaves no permit
    (nor any other key) of the other semaphores on any node."""
    manager = locks[alias]
    a, b, c = (f"{unique_name}:{x}" for x in "abc")
    full = manager.acquire(b, ttl=5, timeout=0, permits=1)
    with pytest.raises(LockNotAcquired) as busy:
        manager.acquire_limits({a: 1, b: 1, c: 3}, timeout=0)
    assert busy.value.name == b
    assert _keys_of(alias, session_nodes, a, c) == []
    full.release()


def test_threads_asking_in_opposite_orders_all_finish_within_the_permits(
    unique_name: str,
) -> None:
    """Eight threads take permits of x (1 permit) and y (2) in opposite orders, each with a
    timeout: none times out (no deadlock: nested semaphore() blocks in these orders do), and
    the holders counted inside never exceed the permits."""
    manager = locks["multi"]
    x, y = f"{unique_name}:x", f"{unique_name}:y"
    sizes = {x: 1, y: 2}
    inside = {x: 0, y: 0}
    most = {x: 0, y: 0}
    mutex = threading.Lock()
    errors: list[BaseException] = []

    def run(i: int) -> None:
        order = [x, y] if i % 2 else [y, x]
        try:
            for _ in range(5):
                with manager.limits({name: sizes[name] for name in order}, ttl=5, timeout=20):
                    with mutex:
                        for name in order:
                            inside[name] += 1
                            most[name] = max(most[name], inside[name])
                    time.sleep(0.002)
                    with mutex:
                        for name in order:
                            inside[name] -= 1
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert errors == []
    assert most[x] == 1 and 1 <= most[y] <= 2


@pytest.mark.parametrize("alias", ["default", "multi"])
def test_overlapping_sets_in_random_orders_from_six_processes(
    alias: str, session_nodes: RedisNodes, unique_name: str
) -> None:
    """6 processes x 15 sections, each a permit of 2-3 of 3 semaphores in random order: all
    finish (no deadlock), never more holders of a semaphore than its permits."""
    url = session_nodes[0].url
    with PROCESSES.Pool(6) as pool:
        done = pool.starmap(
            workers.random_sets_under_limits,
            [(settings.REDLOCK, alias, unique_name, url, 15, seed) for seed in range(6)],
        )
    assert done == [15] * 6
    client = session_nodes[0].client()
    for i, permits in enumerate((2, 1, 2)):
        seen = [int(n) for n in client.lrange(f"{unique_name}:{i}:seen", 0, -1)]
        assert seen and max(seen) <= permits


def test_alimits_in_opposite_orders(unique_name: str) -> None:
    """The asyncio twin: tasks asking in opposite orders all finish, within the permits."""
    manager = locks["multi"]
    x, y = f"{unique_name}:x", f"{unique_name}:y"
    inside = {x: 0, y: 0}
    most = {x: 0, y: 0}

    async def one(i: int) -> None:
        order = {x: 1, y: 1} if i % 2 else {y: 1, x: 1}
        for _ in range(3):
            async with manager.alimits(order, ttl=5, timeout=20) as held:
                assert set(held.leases) == {x, y}
                for name in order:
                    inside[name] += 1
                    most[name] = max(most[name], inside[name])
                await asyncio.sleep(0.002)
                for name in order:
                    inside[name] -= 1

    async def main() -> None:
        await asyncio.gather(*(one(i) for i in range(6)))

    asyncio.run(main())
    assert most == {x: 1, y: 1}


def test_releasing_the_set_frees_every_permit_and_wakes_a_waiter(unique_name: str) -> None:
    """One release of the set frees every permit, and a caller waiting for one of its full
    semaphores is woken by it."""
    manager = locks["multi"]
    a, b = f"{unique_name}:a", f"{unique_name}:b"
    held = manager.acquire_limits({a: 1, b: 1}, ttl=30, timeout=0)
    got: list[Any] = []

    def wait() -> None:
        with manager.semaphore(b, 1, ttl=5, timeout=30) as lease:
            got.append(lease)

    with backing_off(manager):
        thread = threading.Thread(target=wait)
        thread.start()
        until_waiting(manager, b)
        assert held.release() is True
        thread.join(30)
    assert got and got[0].token > held.leases[b].token
    assert held.release() is True  # again: nothing left, nothing lost
    manager.acquire(a, timeout=0, permits=1).release()


def test_a_set_waits_for_the_full_semaphore_and_gets_it(unique_name: str) -> None:
    """A set finding one semaphore full waits for it (holding nothing meanwhile) and wins when
    the holder releases."""
    manager = locks["multi"]
    a, b = f"{unique_name}:a", f"{unique_name}:b"
    full = manager.acquire(b, ttl=30, timeout=0, permits=1)
    got: list[Any] = []

    def wait() -> None:
        with manager.limits({a: 1, b: 1}, ttl=5, timeout=30) as held:
            got.append(held)

    with backing_off(manager):
        thread = threading.Thread(target=wait)
        thread.start()
        until_waiting(manager, b)
        other = manager.acquire(a, timeout=0, permits=1)  # nothing of the set held meanwhile
        other.release()
        full.release()
        thread.join(30)
    assert got and set(got[0].leases) == {a, b}


@pytest.mark.parametrize("alias", ["default", "multi"])
def test_an_auto_extended_set_outlives_its_ttl(alias: str, unique_name: str) -> None:
    """TTL 1 s, held 2.5 s with auto_extend: every permit is still valid and still counts."""
    manager = locks[alias]
    a, b = f"{unique_name}:a", f"{unique_name}:b"
    with manager.limits({a: 1, b: 1}, ttl=1.0, auto_extend=True) as held:
        time.sleep(2.5)
        assert all(lease.validity > 0 and not lease.lost for lease in held.leases.values())
        with pytest.raises(LockNotAcquired):
            manager.acquire(b, timeout=0, permits=1)
    manager.acquire(b, timeout=0, permits=1).release()


def test_losing_one_permit_raises_lock_lost_at_exit(
    unique_name: str, session_nodes: RedisNodes
) -> None:
    """A permit of the set whose slot disappears from every node (evicted, force-released) is
    found lost by its renewal; leaving the block raises LockLost naming it."""
    manager = locks["multi"]
    a, b = f"{unique_name}:a", f"{unique_name}:b"
    with (
        pytest.raises(LockLost) as lost,
        manager.limits({a: 1, b: 2}, ttl=1.0, auto_extend=True) as held,
    ):
        slot = held.leases[b].record.key
        for node in session_nodes[:3]:
            node.client().delete(slot)
        time.sleep(1.2)
        assert held.leases[b].lost and not held.leases[a].lost
    assert lost.value.name == b
    assert "limits block" in str(lost.value)


@pytest.mark.parametrize("alias", ["default", "multi"])
def test_other_permits_or_kinds_are_a_lock_error(alias: str, unique_name: str) -> None:
    """A semaphore of the set held with another number of permits, or a name held as a lock:
    the same LockError as semaphore() gives, naming it, and nothing taken."""
    manager = locks[alias]
    a, b = f"{unique_name}:a", f"{unique_name}:b"
    other = manager.acquire(b, ttl=5, timeout=0, permits=3)
    with pytest.raises(LockError, match=rf"{b!r}.*another kind than a semaphore of 2 permits"):
        manager.acquire_limits({a: 1, b: 2}, timeout=1)
    with pytest.raises(LockError, match="another kind"):
        manager.acquire(b, timeout=0, permits=2)  # semaphore() says the same
    other.release()  # (its marker outlives it: the name stays a 3-permit semaphore a while)
    c = f"{unique_name}:c"
    lock = manager.acquire(c, ttl=5, timeout=0)
    with pytest.raises(LockError, match="another kind"):
        manager.acquire_limits({a: 1, c: 2}, timeout=0)
    lock.release()
    manager.acquire(a, timeout=0, permits=1).release()  # a was not left taken


def test_a_name_this_thread_holds_as_a_lock_is_refused_at_once(unique_name: str) -> None:
    manager = locks["default"]
    with (
        manager.lock(unique_name),
        pytest.raises(LockError, match="wait for itself"),
        manager.limits({f"{unique_name}:x": 1, unique_name: 1}, timeout=5),
    ):
        pass


@pytest.mark.parametrize(
    ("limits", "error", "message"),
    [
        ({}, ValueError, "at least one semaphore"),
        (["a"], TypeError, r"\(name, permits\) pairs"),
        ("abc", TypeError, "dict of semaphore names"),
        ({"a": 0}, ValueError, r"limits\(\) of 'a': permits must be from 1"),
        ({"a": True}, TypeError, "permits must be an int"),
        ({"a": 1.5}, TypeError, "permits must be an int"),
        ({"a": 1, 2: 1}, TypeError, "must be a str"),
        ({"a": 1, "__x": 1}, ValueError, "reserved"),
        ([("a", 1), ("a", 2)], ValueError, "names 'a' twice"),
        ({f"n{i}": 1 for i in range(101)}, ValueError, "at most 100 semaphores"),
        ({f"n{i}": 1000 for i in range(5)}, ValueError, "at most 4096 permits"),
    ],
)
def test_bad_input_fails_before_any_network_call(
    limits: Any, error: type[Exception], message: str, redlock_alias: Any
) -> None:
    manager = redlock_alias(["redis://127.0.0.1:1/0"])  # nothing listens there
    with pytest.raises(error, match=message):
        manager.limits(limits)
    with pytest.raises(error, match=message):
        manager.acquire_limits(limits)
    with pytest.raises(error, match=message):
        asyncio.run(manager.aacquire_limits(limits))


def test_bad_input_leaves_no_key(unique_name: str, session_nodes: RedisNodes) -> None:
    """On real nodes: a bad permit count next to good names writes nothing anywhere."""
    manager = locks["multi"]
    good = f"{unique_name}:good"
    with pytest.raises(ValueError, match="permits must be from 1"):
        manager.acquire_limits({good: 2, f"{unique_name}:bad": 0})
    assert _keys_of("multi", session_nodes, good) == []


def test_bad_options_fail_before_any_network_call(redlock_alias: Any) -> None:
    manager = redlock_alias(["redis://127.0.0.1:1/0"])
    with pytest.raises(ValueError, match="ttl"):
        manager.limits({"a": 1}, ttl=0)
    with pytest.raises(TypeError, match=r"Unexpected keyword argument .reentrant."):
        manager.limits({"a": 1}, reentrant=True)  # type: ignore[call-arg]


def test_limits_as_a_decorator(unique_name: str) -> None:
    """A decorated function (sync and async) runs holding a permit of each semaphore."""
    manager = locks["default"]
    a, b = f"{unique_name}:a", f"{unique_name}:b"

    @manager.limits({a: 1, b: 1}, timeout=0)
    def work() -> None:
        with pytest.raises(LockNotAcquired):
            manager.acquire(a, timeout=0, permits=1)

    @manager.alimits({a: 1, b: 1}, timeout=0)
    async def awork() -> None:
        with pytest.raises(LockNotAcquired):
            await manager.aacquire(b, timeout=0, permits=1)

    work()
    asyncio.run(awork())
    manager.acquire(a, timeout=0, permits=1).release()


def test_one_semaphore_is_a_plain_permit(unique_name: str) -> None:
    """A set of one semaphore is semaphore()'s permit, in a HeldLocks like the others."""
    with locks["multi"].limits({unique_name: 2}, timeout=0) as held:
        assert held.leases[unique_name].kind == "permit"
    locks["multi"].acquire(unique_name, timeout=0, permits=2).release()


def test_a_decorated_generator_holds_the_permits_while_it_runs(unique_name: str) -> None:
    """A decorated generator (sync and async) holds the permits from its first iteration
    until it ends, as ``@lock`` does, not only while the generator object is made."""
    manager = locks["default"]
    a, b = f"{unique_name}:a", f"{unique_name}:b"

    @manager.limits({a: 1, b: 1}, timeout=0)
    def items() -> Any:
        yield 1
        with pytest.raises(LockNotAcquired):
            manager.acquire(a, timeout=0, permits=1)
        yield 2

    @manager.alimits({a: 1, b: 1}, timeout=0)
    async def aitems() -> Any:
        yield 1
        with pytest.raises(LockNotAcquired):
            await manager.aacquire(b, timeout=0, permits=1)
        yield 2

    async def collect() -> list[int]:
        return [item async for item in aitems()]

    assert list(items()) == [1, 2]
    assert asyncio.run(collect()) == [1, 2]
    manager.acquire(a, timeout=0, permits=1).release()
