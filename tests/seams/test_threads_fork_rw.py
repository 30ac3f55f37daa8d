"""Attack probes: leases crossing threads and processes, read-write locks meeting sets."""

from __future__ import annotations

import faulthandler
import multiprocessing
import os
import signal
import threading
from pathlib import Path

import pytest

from django_redlock import locks
from django_redlock.exceptions import LockError, LockLost, LockNotAcquired
from testproject.inventory.models import Product
from tests.seams.helpers import free_elsewhere, keys_left, take_elsewhere


def test_block_lease_released_by_another_thread_is_not_reentered(unique_name: str) -> None:
    """Thread A is inside lock(n); thread B releases A's lease object; thread C takes n.
    A's re-entry must not hand A the released lease (two holders): LockLost or a wait; the
    block's exit reports the loss (LockLost)."""
    outcome: list[object] = []
    with pytest.raises(LockLost), locks["default"].lock(unique_name, timeout=1) as lease:
        t = threading.Thread(target=lambda: outcome.append(lease.release()))
        t.start()
        t.join(10)
        taken = take_elsewhere(unique_name)
        assert not isinstance(taken[0], Exception), taken
        try:
            with locks["default"].lock(unique_name, timeout=0.5) as inner:
                pytest.fail(f"re-entered a released lease: token {inner.token}, another holds n")
        except (LockLost, LockNotAcquired):
            pass
        finally:
            taken[0].release()  # type: ignore[attr-defined]
    assert keys_left(unique_name) == []


@pytest.mark.django_db(transaction=True)
def test_acquire_lease_released_by_another_thread_stops_guarding(unique_name: str) -> None:
    """lease = acquire(n) in this thread guards its writes until released; released from
    another thread, it must stop guarding them here."""
    product = Product.objects.create(name="r", stock=1)
    lease = locks["default"].acquire(unique_name, timeout=1)
    t = threading.Thread(target=lease.release)
    t.start()
    t.join(10)
    product.refresh_from_db()
    product.stock = 4
    product.save()
    row = Product.objects.get(pk=product.pk)
    assert row.fence_token != lease.token, "a released lease still guarded this thread's write"
    assert keys_left(unique_name) == []


#: while set, a forked child writes its threads' stacks to this file if it is still running
#: 20 s after the fork (from the fork itself: a hang before ``_child_tries`` runs shows too)
_HANG_REPORT: list[Path] = []


def _watch_for_a_hang() -> None:
    if _HANG_REPORT:
        report = _HANG_REPORT[0].open("w")  # kept open: the dump writes to it
        faulthandler.dump_traceback_later(20, exit=True, file=report)


os.register_at_fork(after_in_child=_watch_for_a_hang)


def _child_tries(name: str, pipe: object, held_names: list[str]) -> None:
    results: dict[str, object] = {}
    try:
        with locks["default"].lock(name, timeout=0.3) as lease:
            results["reentered"] = lease.token
    except LockNotAcquired:
        results["reentered"] = None
    except Exception as exc:
        results["reentered"] = repr(exc)
    try:
        with locks["default"].lock_many(held_names, timeout=0.3) as held:
            results["set"] = held.tokens
    except LockNotAcquired:
        results["set"] = None
    except Exception as exc:
        results["set"] = repr(exc)
    pipe.send(results)  # type: ignore[attr-defined]
    pipe.close()  # type: ignore[attr-defined]


@pytest.mark.skipif(not hasattr(os, "fork"), reason="fork")
def test_forked_child_does_not_reenter_the_parents_set(unique_name: str, tmp_path: Path) -> None:
    """Fork while holding lock_many([a, b]): in the child lock(a) and lock_many([a, b]) are
    other callers (they time out or raise), never re-entries of the parent's leases."""
    a, b = unique_name + ":a", unique_name + ":b"
    report = tmp_path / "child-stacks.txt"
    with locks["default"].lock_many([a, b], timeout=1) as held:
        parent_end, child_end = multiprocessing.Pipe()
        _HANG_REPORT[:] = [report]
        try:
            # os.fork itself, not a multiprocessing Process: its bootstrap runs the after-fork
            # hooks other libraries registered in this process (kombu's, left by an earlier
            # Celery test on this worker, read a socket shared with the parent and hung)
            pid = os.fork()
            if pid == 0:  # the child
                try:
                    _child_tries(a, child_end, [a, b])
                finally:
                    os._exit(0)
        finally:
            _HANG_REPORT.clear()
        if not parent_end.poll(30):
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            stacks = report.read_text() if report.exists() else "(no report)"
            pytest.fail(f"the forked child hung; its threads:\n{stacks}")
        results = parent_end.recv()
        os.waitpid(pid, 0)
        assert results["reentered"] is None or "LockError" in str(results["reentered"]), results
        assert results["set"] is None or "LockError" in str(results["set"]), results
        assert not free_elsewhere(a) and not free_elsewhere(b)
        assert not held.leases[a].lost
    assert keys_left(unique_name) == []


def test_read_lock_then_lock_many_of_the_name_fails_at_once(unique_name: str) -> None:
    """read_lock(a) then lock_many([a, b]): a LockError at once (a as another kind), never a
    wait for itself; nothing left behind."""
    a, b = unique_name + ":a", unique_name + ":b"
    with locks["default"].read_lock(a, timeout=1):
        with locks["default"].read_lock(a, timeout=1):
            try:
                with locks["default"].lock_many([a, b], timeout=2):
                    pytest.fail("a set took a name the thread reads")
            except LockNotAcquired as exc:
                pytest.fail(f"waited for itself: {exc}")
            except LockError as exc:
                assert a in str(exc)
        assert free_elsewhere(b)
    assert keys_left(unique_name) == []


def test_write_lock_then_lock_many_of_the_name(unique_name: str) -> None:
    """write_lock(a) then lock_many([a, b]) in the same thread: re-entry or a LockError at
    once naming a, never a wait for itself."""
    a, b = unique_name + ":a", unique_name + ":b"
    with locks["default"].write_lock(a, timeout=1):
        try:
            with locks["default"].lock_many([a, b], timeout=2):
                pass
        except LockNotAcquired as exc:
            pytest.fail(f"waited for itself: {exc}")
        except LockError as exc:
            assert a in str(exc)
    assert keys_left(unique_name) == []


def test_lock_many_then_read_lock_of_a_member(unique_name: str) -> None:
    """lock_many([a, b]) then read_lock(a) in the same thread: LockError at once (a is held
    as a lock, the kind differs), never a wait."""
    a, b = unique_name + ":a", unique_name + ":b"
    with locks["default"].lock_many([a, b], timeout=1):
        try:
            with locks["default"].read_lock(a, timeout=2):
                pass
        except LockNotAcquired as exc:
            pytest.fail(f"waited for itself: {exc}")
        except LockError:
            pass
    assert keys_left(unique_name) == []


KINDS = {
    "lock": lambda m, n: m.lock(n, timeout=2),
    "read": lambda m, n: m.read_lock(n, timeout=2),
    "write": lambda m, n: m.write_lock(n, timeout=2),
    "sem": lambda m, n: m.semaphore(n, 2, timeout=2),
    "set": lambda m, n: m.lock_many([n, n + ":other"], timeout=2),
}


@pytest.mark.parametrize("alias", ["default", "multi"])
@pytest.mark.parametrize(
    ("outer", "inner"),
    [
        ("lock", "read"),
        ("lock", "sem"),
        ("lock", "write"),
        ("write", "lock"),
        ("read", "lock"),
        ("read", "sem"),
        ("sem", "lock"),
        ("sem", "read"),
        ("set", "read"),
        ("set", "write"),
        ("set", "sem"),
        ("write", "set"),
        ("sem", "set"),
    ],
)
def test_one_thread_never_waits_for_its_own_other_kind(
    alias: str, outer: str, inner: str, unique_name: str
) -> None:
    """The thread holds n as one kind and enters n as another kind: the docs' table says
    LockError at once (one name, one kind) or re-entry, never a wait for itself."""
    manager = locks[alias]
    with KINDS[outer](manager, unique_name):
        try:
            with KINDS[inner](manager, unique_name):
                pass
        except LockNotAcquired as exc:
            pytest.fail(f"{outer} then {inner}: waited for itself: {exc}")
        except LockError:
            pass
    if "sem" not in (outer, inner):  # a semaphore's marker outlives it by design (one TTL)
        assert keys_left(unique_name, alias) == []


@pytest.mark.parametrize("inner", ["read", "write"])
def test_lock_then_read_or_write_lock_without_timeout_hangs_on_itself(
    inner: str, unique_name: str
) -> None:
    """lock(n, auto_extend=True) then read_lock(n)/write_lock(n) with timeout=None in the
    same thread: the docs promise a LockError (one name, one kind); the call must return."""
    manager = locks["default"]
    outcome: list[object] = []

    def body() -> None:
        try:
            with manager.lock(unique_name, ttl=1, auto_extend=True, max_hold=6):
                cm = (manager.read_lock if inner == "read" else manager.write_lock)(
                    unique_name, timeout=None
                )
                with cm:
                    outcome.append("entered")
        except Exception as exc:
            outcome.append(exc)

    thread = threading.Thread(target=body, daemon=True)
    thread.start()
    thread.join(4)
    hung = thread.is_alive()
    thread.join(30)
    assert not hung, f"{inner}_lock(timeout=None) inside lock() waited for its own thread"
    assert outcome and isinstance(outcome[0], LockError), outcome
