"""``simulate()``: locks, semaphores, read-write locks and ``lock_many`` in memory, blocking,
on aliases whose nodes are traps (nothing may connect)."""

from __future__ import annotations

import threading
import time

import pytest

from django_redlock import locks
from django_redlock.exceptions import LockError, LockLost, LockNotAcquired, NodesUnavailable
from django_redlock.testing import Simulation, simulate
from tests.support.offline import Trap, connected

pytestmark = pytest.mark.usefixtures("traps")


def test_free_name_is_held_in_memory_and_exclusive() -> None:
    """A free name is won at once; a second acquire of it is busy until it is released."""
    with simulate() as simulation:
        manager = locks["default"]
        lease = manager.acquire("order:1", timeout=0)
        assert lease.validity > 0 and lease.token > 0
        assert [name for name, _ in simulation.held()] == ["order:1"]
        with pytest.raises(LockNotAcquired):
            manager.acquire("order:1", timeout=0)
        assert lease.release() is True
        manager.acquire("order:1", timeout=0).release()


def test_without_simulate_the_traps_are_reached(traps: list[Trap]) -> None:
    """The guard of this file: the same acquire without simulate connects to a node (and fails
    there: the trap never answers)."""
    with pytest.raises((NodesUnavailable, LockNotAcquired)):
        locks["default"].acquire("order:1", timeout=0)
    assert connected(traps) > 0
    for trap in traps:
        trap.connections = 0  # the fixture's teardown checks the others


def test_busy_globs_fail_at_once_whatever_the_timeout() -> None:
    """A name matching a busy glob is held elsewhere: busy at once, even with a long timeout;
    other names are free. Globs use Redis MATCH syntax (``*``, ``?``, ``[...]``, ``\\``)."""
    with simulate(busy=["order:*", "user:[12]", r"odd\*"]):
        manager = locks["default"]
        started = time.monotonic()
        with pytest.raises(LockNotAcquired, match="before its 30 s timeout") as busy:
            manager.acquire("order:7", timeout=30)
        assert time.monotonic() - started < 10  # not the 30 s timeout (no sleep)
        assert "within 30 s" not in str(busy.value)  # it said so, though it failed at once
        for name in ("user:1", "user:2", "odd*"):
            with pytest.raises(LockNotAcquired):
                manager.acquire(name, timeout=0)
        for name in ("user:3", "oddX", "orders"):
            manager.acquire(name, timeout=0).release()
        with pytest.raises(LockNotAcquired), manager.lock("order:9"):
            pass


def test_unavailable_is_nodes_unavailable() -> None:
    """``unavailable=True``: no quorum answers, NodesUnavailable (with each node's error)."""
    with simulate(unavailable=True):
        with pytest.raises(NodesUnavailable) as caught:
            locks["multi"].acquire("x", timeout=5)
        assert caught.value.answered == 0 and len(caught.value.errors) == 3


def test_lost_after_makes_blocks_raise_lock_lost() -> None:
    """``lost_after``: the lease is lost that long after it was taken; the block raises
    LockLost, ``check()`` and ``extend()`` report it, and the name is free again."""
    with simulate(lost_after=0.05):
        manager = locks["default"]
        with pytest.raises(LockLost), manager.lock("job", ttl=5):
            time.sleep(0.1)
        lease = manager.acquire("job", ttl=5)
        assert lease.validity <= 0.05
        time.sleep(0.1)
        assert lease.lost
        with pytest.raises(LockLost):
            lease.extend()
        manager.acquire("job", timeout=0).release()


def test_lost_after_is_seen_by_auto_extend() -> None:
    """The renewals of an auto-extended lease find it lost and send lock_lost."""
    from django_redlock.signals import lock_lost

    seen = threading.Event()

    def receiver(**kwargs: object) -> None:
        seen.set()

    lock_lost.connect(receiver, dispatch_uid="sim-lost")
    try:
        with simulate(lost_after=0.1):
            lease = locks["default"].acquire("renewed", ttl=0.3, auto_extend=True)
            assert seen.wait(5)
            assert lease.lost
            assert lease.release() is False
    finally:
        lock_lost.disconnect(dispatch_uid="sim-lost")


def test_threads_wait_for_each_other() -> None:
    """A second thread's acquire with a timeout waits until the first releases: in-memory
    exclusion between threads of this process."""
    inside: list[int] = []
    overlap: list[bool] = []

    def worker(n: int) -> None:
        with locks["default"].lock("shared", timeout=10):
            inside.append(n)
            overlap.append(len(inside) > 1)
            time.sleep(0.01)
            inside.remove(n)

    with simulate():
        threads = [threading.Thread(target=worker, args=(n,)) for n in range(5)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    assert overlap == [False] * 5


def test_semaphore_counts_permits() -> None:
    """A semaphore of 2 permits gives two, the third is busy; a lock on its name is refused
    as another kind."""
    with simulate():
        manager = locks["default"]
        first = manager.acquire("api", permits=2, timeout=0)
        second = manager.acquire("api", permits=2, timeout=0)
        with pytest.raises(LockNotAcquired):
            manager.acquire("api", permits=2, timeout=0)
        with pytest.raises(LockError):
            manager.acquire("api", timeout=0)
        first.release()
        with manager.semaphore("api", 2, timeout=0):
            pass
        second.release()


def test_read_write_locks() -> None:
    """Readers share a name, a writer excludes readers and writers (other threads ask)."""

    def other_thread(kind: str) -> str:
        result: list[str] = []

        def ask() -> None:
            block = getattr(locks["default"], f"{kind}_lock")("doc", timeout=0)
            try:
                with block:
                    result.append("won")
            except LockNotAcquired:
                result.append("busy")

        thread = threading.Thread(target=ask)
        thread.start()
        thread.join()
        return result[0]

    with simulate():
        manager = locks["default"]
        with manager.read_lock("doc", timeout=0):
            assert other_thread("read") == "won"
            assert other_thread("write") == "busy"
        with manager.write_lock("doc", timeout=0):
            assert other_thread("read") == "busy"
            assert other_thread("write") == "busy"
        assert other_thread("write") == "won"


def test_lock_many_is_all_or_nothing() -> None:
    """lock_many takes every name or none: one busy name leaves the others free."""
    with simulate(busy=["b"]) as simulation:
        manager = locks["multi"]
        with pytest.raises(LockNotAcquired) as caught, manager.lock_many(["a", "b", "c"]):
            pass
        assert caught.value.name == "b"
        assert simulation.held() == []
        with manager.lock_many(["a", "c"], timeout=0) as held:
            assert set(held.leases) == {"a", "c"}
            result: list[BaseException] = []

            def other() -> None:
                try:
                    manager.acquire_many(["c", "d"], timeout=0)
                except LockNotAcquired as exc:
                    result.append(exc)

            thread = threading.Thread(target=other)
            thread.start()
            thread.join()
            assert result and simulation.held()[-1][0] == "c"


def test_reentrancy_as_the_real_thing() -> None:
    """A block re-entered in one thread reuses its lease; reentrant=False is busy."""
    with simulate():
        manager = locks["default"]
        with manager.lock("r") as outer, manager.lock("r") as inner:
            assert inner is outer
            with pytest.raises(LockNotAcquired), manager.lock("r", reentrant=False, timeout=0):
                pass


def test_tokens_increase_across_simulations() -> None:
    """Fencing tokens increase, and a later simulation starts above an earlier one's."""
    tokens = []
    for _ in range(2):
        with simulate():
            for _ in range(3):
                lease = locks["default"].acquire("t")
                tokens.append(lease.token)
                lease.release()
    assert tokens == sorted(set(tokens))
    assert tokens[0] > 10**15  # time-based (microseconds): above earlier test runs' rows


def test_using_covers_one_alias(traps: list[Trap]) -> None:
    """``using="default"`` covers that alias only: ``multi`` still goes to its nodes."""
    with simulate(using="default"):
        locks["default"].acquire("x", timeout=0).release()
        assert connected(traps) == 0
        with pytest.raises((NodesUnavailable, LockNotAcquired)):
            locks["multi"].acquire("x", timeout=0)
    assert connected(traps) > 0
    for trap in traps:
        trap.connections = 0


def test_nested_simulations_inner_wins_outer_restored() -> None:
    """The inner simulation wins; leaving it restores the outer one."""
    with simulate(busy=["x"]):
        with simulate():
            locks["default"].acquire("x", timeout=0).release()
        with pytest.raises(LockNotAcquired):
            locks["default"].acquire("x", timeout=0)


def test_managers_created_during_simulation_are_covered() -> None:
    """A manager created while the simulation runs (after a reset) is simulated too, and
    gets its real engines back after it."""
    with simulate(busy=["x"]):
        locks.reset()
        with pytest.raises(LockNotAcquired):
            locks["default"].acquire("x", timeout=0)
    assert not isinstance(locks["default"].engine, type(locks["default"].shards[0])) or (
        type(locks["default"].engine).__name__ == "Engine"
    )


def test_lease_taken_before_goes_to_its_real_engine(traps: list[Trap]) -> None:
    """A lease taken inside a simulation keeps its simulated engine after it ends (its
    release is in memory, nothing connects)."""
    with simulate():
        lease = locks["default"].acquire("kept")
    assert lease.release() is True
    assert connected(traps) == 0


def test_bad_arguments_are_refused_before_anything() -> None:
    """Bad arguments: a clear error, and no simulation starts."""
    with pytest.raises(TypeError, match="list of globs"):
        simulate(busy="order:*")
    with pytest.raises(ValueError, match="lost_after"):
        simulate(lost_after=-1)
    with pytest.raises(TypeError, match="lost_after"):  # a wrong type, as for busy: TypeError
        simulate(lost_after=True)
    with pytest.raises(ValueError, match="busy glob"):
        simulate(busy=[""])
    with pytest.raises(ValueError, match="no such alias"), simulate(using="nope"):
        pass
    assert type(locks["default"].engine).__name__ == "Engine"


def test_simulation_object() -> None:
    """``simulate()`` returns a Simulation; entering it twice at once is an error."""
    simulation = simulate()
    assert isinstance(simulation, Simulation)
    with simulation, pytest.raises(RuntimeError, match="already active"):
        simulation.start()
