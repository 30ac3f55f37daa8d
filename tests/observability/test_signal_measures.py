"""docs/observability.md: ``lock_acquired`` carries ``waited`` and ``attempts``, ``lock_failed``
also
``votes``, measured by the engine's drivers (blocking and asyncio) for every primitive."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from typing import Any

import pytest

from django_redlock import locks, signals
from tests.support.waiting import release_once_waited_for


@pytest.fixture
def sent() -> Iterator[list[tuple[str, dict[str, Any]]]]:
    """Every lock_acquired / lock_failed sent during the test: (signal, kwargs)."""
    events: list[tuple[str, dict[str, Any]]] = []

    def on_acquired(**kwargs: Any) -> None:
        events.append(("acquired", kwargs))

    def on_failed(**kwargs: Any) -> None:
        events.append(("failed", kwargs))

    signals.lock_acquired.connect(on_acquired)
    signals.lock_failed.connect(on_failed)
    yield events
    signals.lock_acquired.disconnect(on_acquired)
    signals.lock_failed.disconnect(on_failed)


@pytest.mark.parametrize("alias", ["default", "multi"])
def test_a_waiting_acquire_reports_its_wait_and_attempts(
    sent: list[tuple[str, dict[str, Any]]], unique_name: str, alias: str
) -> None:
    """A free name: attempts 1 and a wait within the call; a busy name released 0.3 s after
    the waiter is seen waiting (so after its call began): the waiter's lock_acquired says it
    waited >= 0.3 s over >= 2 attempts, the lease knows its voters, and its hold time lies
    within the block's call."""
    manager = locks[alias]
    called = time.monotonic()
    holder = manager.acquire(unique_name, timeout=0)
    took = time.monotonic() - called
    kind, first = sent[-1]
    assert kind == "acquired" and first["attempts"] == 1 and 0 <= first["waited"] <= took
    # the grants that arrived before a quorum settled the attempt
    assert first["lease"] is holder and manager.config.quorum <= holder.votes
    assert len(holder.voters) == holder.votes <= len(manager.config.nodes)
    thread = release_once_waited_for(manager, unique_name, holder, 0.3)
    called = time.monotonic()
    with manager.lock(unique_name, timeout=30) as lease:
        kind, kwargs = sent[-1]
        assert kind == "acquired" and kwargs["lease"] is lease
        assert kwargs["waited"] >= 0.3 and kwargs["attempts"] >= 2
        assert lease.waited == kwargs["waited"] and lease.attempts == kwargs["attempts"]
    took = time.monotonic() - called
    thread.join()
    assert 0 < lease.held < took - lease.waited


def test_a_timeout_reports_wait_attempts_and_votes(
    sent: list[tuple[str, dict[str, Any]]], unique_name: str
) -> None:
    """lock_failed after a 0.3 s timeout: reason, waited >= 0.3, attempts >= 2, 0 votes."""
    manager = locks["multi"]
    holder = manager.acquire(unique_name, timeout=0)
    with pytest.raises(Exception, match="not acquired"):
        manager.acquire(unique_name, timeout=0.3)
    kind, kwargs = sent[-1]
    assert kind == "failed" and kwargs["reason"] == "timeout"
    assert kwargs["waited"] >= 0.3 and kwargs["attempts"] >= 2 and kwargs["votes"] == 0
    holder.release()


def test_the_asyncio_driver_measures_the_same(
    sent: list[tuple[str, dict[str, Any]]], unique_name: str
) -> None:
    """aacquire: a wait of >= 0.2 s over >= 2 attempts; a busy one-attempt failure: 1 attempt."""
    manager = locks["multi"]

    async def main() -> None:
        holder = await manager.aacquire(unique_name, timeout=0)

        async def release_later() -> None:
            await asyncio.sleep(0.2)
            await holder.arelease()

        task = asyncio.create_task(release_later())
        lease = await manager.aacquire(unique_name, timeout=5)
        await task
        kind, kwargs = sent[-1]
        assert kind == "acquired" and kwargs["waited"] >= 0.2 and kwargs["attempts"] >= 2
        with pytest.raises(Exception, match="not acquired"):
            await manager.aacquire(unique_name, timeout=0)
        kind, kwargs = sent[-1]
        assert kind == "failed" and kwargs["reason"] == "busy" and kwargs["attempts"] == 1
        await lease.arelease()

    asyncio.run(main())


def test_lock_many_and_semaphores_send_the_measures(
    sent: list[tuple[str, dict[str, Any]]], unique_name: str
) -> None:
    """lock_many: one lock_acquired per name, each with waited/attempts; a semaphore permit
    and a read lease too; a busy lock_many's lock_failed carries them as well."""
    manager = locks["multi"]
    names = [f"{unique_name}:a", f"{unique_name}:b"]
    with manager.lock_many(names, timeout=0):
        acquired = [kw for kind, kw in sent if kind == "acquired"]
        assert [kw["name"] for kw in acquired] == names
        assert all(kw["attempts"] == 1 and kw["waited"] >= 0 for kw in acquired)
        with pytest.raises(Exception, match="not acquired"):
            manager.acquire_many(names, timeout=0.2)
        kind, kwargs = sent[-1]
        assert kind == "failed" and kwargs["attempts"] >= 2 and kwargs["waited"] >= 0.2
    sent.clear()
    with (
        manager.semaphore(f"{unique_name}:s", 2, timeout=0),
        manager.read_lock(f"{unique_name}:rw", timeout=0),
    ):
        assert [kw["attempts"] for _, kw in sent] == [1, 1]


def test_an_observer_gets_the_signals_and_a_raising_one_changes_nothing(
    unique_name: str, caplog: pytest.LogCaptureFixture
) -> None:
    """signals.observe(): the observer is called with the receivers' arguments (lock_many's
    acquisitions too); one that raises is logged on django_redlock and the lock call goes on."""
    seen: list[dict[str, Any]] = []

    def observer(**kwargs: Any) -> None:
        seen.append(kwargs)

    def broken(**kwargs: Any) -> None:
        raise RuntimeError("exporter down")

    signals.observe(signals.lock_acquired, observer)
    signals.observe(signals.lock_acquired, observer)  # once, however often added
    signals.observe(signals.lock_acquired, broken)
    names = [f"{unique_name}:1", f"{unique_name}:2"]
    try:
        assert signals.wanted(signals.lock_acquired)
        with (
            caplog.at_level("ERROR", logger="django_redlock"),
            locks["default"].lock_many(names, timeout=0),
        ):
            pass
    finally:
        signals.unobserve(signals.lock_acquired, observer)
        signals.unobserve(signals.lock_acquired, broken)
    assert [kw["name"] for kw in seen] == names
    assert seen[0]["sender"] is locks["default"] and seen[0]["attempts"] == 1
    raised = [r for r in caplog.records if r.exc_info and "exporter down" in str(r.exc_info[1])]
    assert len(raised) == 2  # one per acquired name, and the lock call went on
