"""Read-write locks (docs/primitives.md): ``read_lock``/``write_lock`` and their asyncio twins on
real
nodes: readers overlap, a writer excludes everyone, a waiting writer keeps new readers out,
and a write lease's token is above every earlier lease's."""

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
from tests.support.processes import PROCESSES
from tests.support.waiting import assert_woken, backing_off, until_waiting


@pytest.mark.parametrize("alias", ["default", "five"])
def test_readers_overlap_and_a_writer_excludes_everyone(alias: str, unique_name: str) -> None:
    manager = locks[alias]
    with manager.read_lock(unique_name, ttl=5) as r1:
        r2 = manager.acquire(unique_name, rw="read", ttl=5, timeout=0)  # another reader
        assert r1.token != r2.token
        r2.release()
        with pytest.raises(LockNotAcquired):
            manager.acquire(unique_name, rw="write", timeout=0)
        with pytest.raises(LockNotAcquired):  # a plain lock is a writer too
            manager.acquire(unique_name, timeout=0)
    with manager.write_lock(unique_name, ttl=5) as w:
        assert w.token > max(r1.token, r2.token)
        with pytest.raises(LockNotAcquired):
            manager.acquire(unique_name, rw="read", timeout=0)
        with pytest.raises(LockNotAcquired):
            manager.acquire(unique_name, rw="write", timeout=0)
    with manager.read_lock(unique_name, ttl=5, timeout=0) as r3:
        assert r3.token > w.token


@pytest.mark.parametrize("alias", ["default", "five"])
def test_a_waiting_writer_keeps_new_readers_out_and_is_woken(alias: str, unique_name: str) -> None:
    """A writer waiting for a reader keeps new readers out (writer preference) and is woken
    by the last reader's release (not let in by a backoff step: tests/support/waiting.py)."""
    manager = locks[alias]
    reader = manager.acquire(unique_name, rw="read", ttl=30, timeout=0)
    got: list[Any] = []

    def write() -> None:
        with manager.write_lock(unique_name, ttl=5, timeout=30) as lease:
            got.append(lease)
            time.sleep(0.2)

    with backing_off(manager):
        writer = threading.Thread(target=write)
        writer.start()
        until_waiting(manager, unique_name)  # the writer has tried and waits
        with pytest.raises(LockNotAcquired):  # writer preference: no new reader gets in
            manager.acquire(unique_name, rw="read", timeout=0)
        assert reader.release() is True
        writer.join(30)
    assert got and got[0].token > reader.token
    assert_woken(manager, unique_name, reader, got)
    manager.acquire(unique_name, rw="read", timeout=2).release()  # readers again afterwards


# the 1-node case is in the long profile: the 5-node one runs the same processes
@pytest.mark.parametrize("alias", [pytest.param("default", marks=pytest.mark.slow), "five"])
def test_six_readers_and_two_writers_in_processes(
    alias: str, session_nodes: RedisNodes, unique_name: str
) -> None:
    """6 reading and 2 writing processes: a writer never sees a reader or another writer
    inside, a reader never sees a writer, readers did overlap, both writers finished (not
    starved), and each write token is above the tokens of the sections before it."""
    url = session_nodes[0].url
    args = [(settings.REDLOCK, alias, unique_name, url, 15, False)] * 6
    args += [(settings.REDLOCK, alias, unique_name, url, 10, True)] * 2
    with PROCESSES.Pool(8) as pool:
        done = pool.starmap(workers.read_write_sections, args)
    assert done == [15] * 6 + [10] * 2
    seen = [v.split() for v in session_nodes[0].client().lrange(f"{unique_name}:seen", 0, -1)]
    writes = [s for s in seen if s[0] == b"writers"]
    reads = [s for s in seen if s[0] == b"readers"]
    assert len(writes) == 20 and len(reads) == 90
    assert all(s[1] == b"1" and s[2] == b"0" for s in writes)
    assert all(s[2] == b"0" for s in reads)
    assert max(int(s[1]) for s in reads) > 1  # readers shared the lock
    for i, section in enumerate(seen):
        if section[0] == b"writers":
            assert all(int(section[3]) > int(before[3]) for before in seen[:i])


def test_kinds_do_not_mix(unique_name: str) -> None:
    manager = locks["five"]
    with manager.semaphore(unique_name, 2, ttl=5):
        with pytest.raises(LockError):
            manager.acquire(unique_name, rw="read", timeout=0)
        with pytest.raises(LockError):
            manager.acquire(unique_name, rw="write", timeout=0)
    with manager.read_lock(f"{unique_name}-rw", ttl=5), pytest.raises(LockError):
        manager.acquire(f"{unique_name}-rw", permits=2, timeout=0)


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"rw": "reading"}, ValueError, "rw must be 'read' or 'write'"),
        ({"rw": "read", "permits": 2}, ValueError, "not both"),
    ],
)
def test_bad_input_fails_before_any_network_call(
    kwargs: dict[str, Any], error: type[Exception], message: str, redlock_alias: Any
) -> None:
    manager = redlock_alias(["redis://127.0.0.1:1/0"])  # nothing listens there
    with pytest.raises(error, match=message):
        manager.acquire("x", **kwargs)


def test_auto_extended_reader_outlives_its_ttl(unique_name: str) -> None:
    manager = locks["five"]
    # renewed every third of the TTL: 1 s leaves a loaded machine's renewal thread 0.6 s of slack
    with manager.read_lock(unique_name, ttl=1.0, auto_extend=True) as lease:
        time.sleep(2.5)
        assert lease.validity > 0
        with pytest.raises(LockNotAcquired):
            manager.acquire(unique_name, rw="write", timeout=0)
    manager.acquire(unique_name, rw="write", timeout=0).release()


def test_async_read_and_write_locks(unique_name: str) -> None:
    manager = locks["five"]

    async def main() -> tuple[int, int]:
        readers = 0
        most_readers = 0
        writer_saw_readers = 0

        async def read() -> None:
            nonlocal readers, most_readers
            async with manager.aread_lock(unique_name, ttl=5, timeout=10):
                readers += 1
                most_readers = max(most_readers, readers)
                await asyncio.sleep(0.05)
                readers -= 1

        async def write() -> None:
            nonlocal writer_saw_readers
            await asyncio.sleep(0.01)
            async with manager.awrite_lock(unique_name, ttl=5, timeout=10):
                writer_saw_readers = max(writer_saw_readers, readers)

        await asyncio.gather(*(read() for _ in range(4)), write())
        return most_readers, writer_saw_readers

    most, saw = asyncio.run(main())
    assert most > 1 and saw == 0


@pytest.mark.parametrize("alias", ["default", "five"])
def test_readers_kept_out_by_a_writer_go_in_together(alias: str, unique_name: str) -> None:
    """Three readers wait for a writer; its release wakes them all (a lock's release wakes
    one), so none of them is let in by a backoff step (tests/support/waiting.py): they go in
    together instead of one per step."""
    manager = locks[alias]
    writer = manager.acquire(unique_name, rw="write", ttl=30, timeout=0)
    entered: list[Any] = []

    def read() -> None:
        with manager.read_lock(unique_name, ttl=5, timeout=30) as lease:
            entered.append(lease)
            time.sleep(0.3)

    with backing_off(manager):
        readers = [threading.Thread(target=read) for _ in range(3)]
        for thread in readers:
            thread.start()
        until_waiting(manager, unique_name, 3)  # all three wait
        assert writer.release() is True
        for thread in readers:
            thread.join(30)
    assert len(entered) == 3
    assert_woken(manager, unique_name, writer, entered)


@pytest.mark.parametrize("alias", ["default", "five"])
def test_a_force_released_reader_cannot_renew_over_the_next_writer(
    alias: str, unique_name: str
) -> None:
    """Force-releasing a read-write lock evicts its readers: a reader's later renewal finds
    its lease lost and never turns the writer who came next back into readers (which would let
    new readers in beside that writer)."""
    manager = locks[alias]
    reader = manager.acquire(unique_name, rw="read", ttl=5, timeout=0)
    assert manager.force_release(unique_name) >= 1
    writer = manager.acquire(unique_name, rw="write", ttl=2, timeout=0)
    with pytest.raises(LockLost):
        reader.extend(5)
    with pytest.raises(LockNotAcquired):  # the writer still excludes new readers
        manager.acquire(unique_name, rw="read", timeout=0)
    assert writer.token > reader.token
    assert writer.release() is True
