"""The effect ledger where it meets transactions, threads, generators and odd input: the
defects an outside attack found (each test failed before its fix)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from django.db import connection, transaction

from django_redlock import lock, locks
from django_redlock.exceptions import LockError
from django_redlock.locking.lease import Lease
from django_redlock.models import Effect

pytestmark = pytest.mark.django_db(transaction=True)


def in_thread(target: Callable[[], Any]) -> tuple[threading.Thread, dict[str, Any]]:
    out: dict[str, Any] = {}

    def run() -> None:
        try:
            out["result"] = target()
        except BaseException as exc:
            out["error"] = exc
        finally:
            connection.close()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, out


def test_two_transactions_waiting_for_each_others_effect_rows_end_with_an_error(
    unique_name: str,
) -> None:
    """A finishes k1 then opens k2 while B finishes k2 then opens k1, each in its own
    transaction: each begin waits on another connection for the other's row, a cycle
    PostgreSQL cannot see. The begin's wait is bounded: a LockError, not a hang."""
    if connection.vendor != "postgresql":
        pytest.skip("PostgreSQL row locks (SQLite refuses the second writer: docs)")
    k1, k2 = f"k1:{unique_name}", f"k2:{unique_name}"
    barrier = threading.Barrier(2)

    def holder(me: str, first: str, second: str) -> Callable[[], str]:
        def run() -> str:
            with transaction.atomic():
                with lock(f"{unique_name}:{me}:1", ttl=30) as lease, lease.once(first):
                    pass
                barrier.wait(10)
                with lock(f"{unique_name}:{me}:2", ttl=2) as lease, lease.once(second):
                    pass
            return "done"

        return run

    (ta, a), (tb, b) = in_thread(holder("a", k1, k2)), in_thread(holder("b", k2, k1))
    ta.join(30)
    tb.join(30)
    assert not ta.is_alive() and not tb.is_alive(), "two holders hung"
    errors = [out.get("error") for out in (a, b)]
    assert all(e is None or isinstance(e, LockError) for e in errors), errors
    assert any(isinstance(e, LockError) and "waited" in str(e) for e in errors), errors


def test_unrelated_effects_at_once_all_begin_on_sqlite(unique_name: str) -> None:
    """Six holders of six names begin six effects at the same moment (no transactions):
    each waits for SQLite's writer lock instead of failing with 'database is locked'."""
    count = 6
    barrier = threading.Barrier(count)
    results: dict[int, object] = {}

    def run(i: int) -> None:
        try:
            with lock(f"{unique_name}:{i}", ttl=30) as lease:
                barrier.wait(10)
                with lease.once(f"u{i}:{unique_name}") as effect:
                    results[i] = effect.pending
                with lease.once(f"u{i}:{unique_name}") as effect:  # the update path too
                    results[i] = results[i] and effect.done
        except BaseException as exc:
            results[i] = f"{type(exc).__name__}: {exc}"
        finally:
            connection.close()

    threads = [threading.Thread(target=run, args=(i,)) for i in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert results == dict.fromkeys(range(count), True)


def test_a_key_taken_again_by_waiting_holders_is_begun_in_turn(unique_name: str) -> None:
    """Holders of different names begin one interrupted key at once (the update path)."""
    key = f"again:{unique_name}"
    with pytest.raises(RuntimeError), lock(unique_name) as lease, lease.once(key):
        raise RuntimeError
    barrier = threading.Barrier(4)
    seen: list[object] = []

    def run(i: int) -> None:
        try:
            with lock(f"{unique_name}:{i}", ttl=30) as lease:
                barrier.wait(10)
                with pytest.raises(RuntimeError), lease.once(key) as effect:
                    seen.append(effect.interrupted)
                    raise RuntimeError
        except BaseException as exc:
            seen.append(type(exc).__name__)
        finally:
            connection.close()

    threads = [threading.Thread(target=run, args=(i,)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    # each one either began it (interrupted) or was refused as older than one that did
    assert all(s is True or s == "StaleTokenError" for s in seen), seen
    assert True in seen


def _gen(lease: Lease, key: str) -> Iterator[int]:
    with lease.once(key):
        yield 1
    yield 2


def test_blocks_closed_out_of_order_leave_no_key_open(unique_name: str) -> None:
    k1, k2 = f"g1:{unique_name}", f"g2:{unique_name}"
    with lock(unique_name) as lease:
        g1, g2 = _gen(lease, k1), _gen(lease, k2)
        next(g1), next(g2)  # both blocks open
        next(g1), next(g2)  # g1's block closes first, then g2's
    with lock(unique_name) as lease, lease.once(k1) as effect:
        assert effect.done


def test_a_block_left_in_another_task_completes(unique_name: str) -> None:
    """An async generator stepped with asyncio.wait_for: each step runs in a new task."""
    key = f"agen:{unique_name}"

    async def agen(lease: Lease) -> Any:
        async with lease.once(key):
            yield 1
        yield 2

    async def main() -> None:
        async with locks["default"].alock(unique_name, ttl=30) as lease:
            steps = agen(lease)
            await asyncio.wait_for(steps.__anext__(), 5)
            await asyncio.wait_for(steps.__anext__(), 5)

    asyncio.run(main())
    assert Effect.objects.get(key=key).state == "done"


def test_two_threads_sharing_a_lease_cannot_run_one_effect_together(unique_name: str) -> None:
    key = f"th:{unique_name}"
    entered, leave = threading.Event(), threading.Event()

    def first(lease: Lease) -> None:
        with lease.once(key):
            entered.set()
            leave.wait(10)

    with lock(unique_name, ttl=30) as lease:
        thread, out = in_thread(lambda: first(lease))
        assert entered.wait(10)
        with pytest.raises(LockError, match="already open under this lease"):
            lease.once(key).__enter__()
        leave.set()
        thread.join(10)
        assert "error" not in out
    assert Effect.objects.get(key=key).state == "done"


def test_a_nul_in_the_lock_name_is_stored_escaped(unique_name: str) -> None:
    with lock(f"{unique_name}\x00x") as lease, lease.once(f"nul:{unique_name}") as effect:
        assert effect.pending
    assert Effect.objects.get(key=f"nul:{unique_name}").lock_name == f"{unique_name}\\x00x"


class LyingKey(str):
    def __str__(self) -> str:
        return "x" * 1000


@pytest.mark.parametrize(
    ("key", "match"), [("k\x00x", "NUL"), (LyingKey("k"), None)], ids=["nul", "str-subclass"]
)
def test_keys_databases_cannot_store_are_refused_or_normalised(
    unique_name: str, key: str, match: str | None
) -> None:
    with lock(unique_name) as lease:
        if match:
            with pytest.raises(ValueError, match=match):
                lease.once(key)
            return
        with lease.once(key):
            pass
    assert Effect.objects.get().key == "k"


def test_a_begin_with_autocommit_off_is_committed(unique_name: str) -> None:
    """Django's manual transactions (set_autocommit(False), no atomic block): the begin is
    committed on its own connection all the same; a rollback leaves it begun."""
    key = f"ac:{unique_name}"
    transaction.set_autocommit(False)
    try:
        with pytest.raises(RuntimeError), lock(unique_name) as lease, lease.once(key):
            raise RuntimeError
        transaction.rollback()
    finally:
        transaction.set_autocommit(True)
    with lock(unique_name) as lease, lease.once(key) as effect:
        assert effect.interrupted
