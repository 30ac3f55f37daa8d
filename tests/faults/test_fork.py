"""Fork safety (SPEC 10, FINDINGS F1): a lock manager used before ``os.fork()`` keeps working in
the parent and in every child; no process reads a reply meant for another; a lease acquired
by the parent stays the parent's (in a child, releasing it raises ``LockError`` and sends
nothing). gunicorn ``--preload`` with a lock used at import is covered by
tests/test_demo_buy_endpoint.py."""

from __future__ import annotations

import faulthandler
import multiprocessing
import queue
import time
import traceback
from collections.abc import Callable
from typing import Any

import pytest
import redis

from django_redlock import locks
from django_redlock.exceptions import LockError
from django_redlock.manager import LockManager
from django_redlock.testing import RedisNodes

Nodes = Callable[..., RedisNodes]
Alias = Callable[..., LockManager]

CHILDREN = 4
CYCLES = 200
COUNTER = "fork:counter"


def bump_cycles(manager: LockManager, client: redis.Redis, cycles: int) -> tuple[list[int], int]:
    """Lock, read-increment-write a plain Redis counter (no atomicity but the lock's), unlock;
    returns the tokens seen and the number of errors."""
    tokens, errors = [], 0
    for _ in range(cycles):
        try:
            with manager.lock("fork:bump", timeout=20) as lease:
                value = int(client.get(COUNTER) or 0)
                client.set(COUNTER, value + 1)
                tokens.append(lease.token)
        except Exception:
            errors += 1
    return tokens, errors


def child(alias: str, url: str, parent_lease: Any, results: Any) -> None:
    """In a forked child: the inherited manager works; the parent's lease is not ours. Any
    error is reported to the parent, and a child stuck for 60 s prints every thread's stack
    (to the test's captured stderr) before it exits."""
    faulthandler.dump_traceback_later(60, exit=True)
    try:
        manager = locks[alias]
        refused = False
        try:
            parent_lease.release()
        except LockError:
            refused = True
        tokens, errors = bump_cycles(manager, redis.Redis.from_url(url), CYCLES)
        results.put((tokens, errors, refused))
    except BaseException:
        results.put(traceback.format_exc())
        raise


def collect(results: Any, processes: list[Any], timeout: float) -> list[Any]:
    """One report per child; fails at once when a child exits without one."""
    reports: list[Any] = []
    deadline = time.monotonic() + timeout
    while len(reports) < len(processes):
        try:
            report = results.get(timeout=0.5)
        except queue.Empty:
            dead = [p.exitcode for p in processes if not p.is_alive()]
            if len(dead) > len(reports):
                time.sleep(1)  # a report may still be in flight from a child that just exited
                if results.empty():
                    pytest.fail(f"a child exited without a report (exit codes {dead})")
            assert time.monotonic() < deadline, f"children still run after {timeout} s"
            continue
        assert not isinstance(report, str), f"a child failed:\n{report}"
        reports.append(report)
    return reports


@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # Python 3.12+: fork with threads
@pytest.mark.parametrize("count", [1, 5])
def test_forked_children_share_nothing_with_the_parent(
    redis_node_factory: Nodes, redlock_alias: Alias, count: int
) -> None:
    """The parent uses the manager (connections, wake-up connections, a held lease), then forks
    4 children; parent and children run 200 lock/bump/unlock cycles each on one name: no
    errors, no lost increment, no token handed out twice, and the parent's lease is still the
    parent's (before the fix: children read each other's replies)."""
    nodes = redis_node_factory(count)
    manager = redlock_alias(nodes, TTL=5.0)
    client = redis.Redis.from_url(nodes[0].url)
    manager.acquire("fork:warm", timeout=0).release()
    waiter = manager.acquire("fork:bump", timeout=0)  # someone will wait: BLPOP connections
    waiter.release()
    parent_lease = manager.acquire("fork:parent", ttl=300, timeout=0)
    context = multiprocessing.get_context("fork")
    results = context.Queue()
    processes = [
        context.Process(target=child, args=(manager.alias, nodes[0].url, parent_lease, results))
        for _ in range(CHILDREN)
    ]
    for process in processes:
        process.start()
    try:
        tokens, errors = bump_cycles(manager, client, CYCLES)
        reports = collect(results, processes, timeout=90)
    finally:
        for process in processes:
            process.join(30)
            if process.is_alive():
                process.kill()
    for child_tokens, child_errors, refused in reports:
        tokens += child_tokens
        errors += child_errors
        assert refused, "a child could release the parent's lease"
    total = CYCLES * (CHILDREN + 1)
    assert errors == 0
    assert int(client.get(COUNTER) or 0) == total
    assert len(set(tokens)) == len(tokens) == total
    assert not parent_lease.lost and parent_lease.release() is True
