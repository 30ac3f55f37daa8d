"""The fork scenario of tests/faults/test_fork.py, run in a fresh interpreter so that nothing
the test session loaded (a Celery app's broker pools with their own at-fork hooks, a live
server's thread) takes part in the fork: what is tested is django-redlock's fork safety.

``python -m tests.support.fork_scenario URL`` (the first node's URL), with the settings
``tests.support.subprocess_settings`` and ``REDLOCK_JSON`` naming an alias ``fork``; prints
one JSON line: the tokens seen, the errors, the children's refusals and the counter."""

from __future__ import annotations

import faulthandler
import json
import multiprocessing
import queue
import sys
import time
import traceback
from typing import Any

import django

CHILDREN = 4
CYCLES = 200
COUNTER = "fork:counter"
ALIAS = "fork"


def bump_cycles(manager: Any, client: Any, cycles: int) -> tuple[list[int], int]:
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


def child(url: str, parent_lease: Any, results: Any) -> None:
    """In a forked child: the inherited manager works; the parent's lease is not ours. Any
    error is reported to the parent; a child stuck for 60 s prints its stacks and exits."""
    import redis

    from django_redlock import locks
    from django_redlock.exceptions import LockError

    faulthandler.dump_traceback_later(60, exit=True)
    try:
        refused = False
        try:
            parent_lease.release()
        except LockError:
            refused = True
        tokens, errors = bump_cycles(locks[ALIAS], redis.Redis.from_url(url), CYCLES)
        results.put((tokens, errors, refused))
    except BaseException:
        results.put(traceback.format_exc())
        raise


def collect(results: Any, processes: list[Any], timeout: float) -> list[Any]:
    """One report per child; raises at once when a child exits without one."""
    reports: list[Any] = []
    deadline = time.monotonic() + timeout
    while len(reports) < len(processes):
        try:
            report = results.get(timeout=0.5)
        except queue.Empty:
            pass
        else:
            if isinstance(report, str):
                raise RuntimeError(f"a child failed:\n{report}")
            reports.append(report)
            continue
        dead = [p.exitcode for p in processes if not p.is_alive()]
        if len(dead) > len(reports):
            time.sleep(1)  # a report may still be in flight from a child that just exited
            if results.empty():
                raise RuntimeError(f"a child exited without a report (exit codes {dead})")
        if time.monotonic() > deadline:
            raise RuntimeError(f"children still run after {timeout} s")
    return reports


def main() -> None:
    django.setup()
    import redis

    from django_redlock import locks

    manager = locks[ALIAS]
    client = redis.Redis.from_url(sys.argv[1])
    manager.acquire("fork:warm", timeout=0).release()
    waiter = manager.acquire("fork:bump", timeout=0)  # someone will wait: BLPOP connections
    waiter.release()
    parent_lease = manager.acquire("fork:parent", ttl=300, timeout=0)
    context = multiprocessing.get_context("fork")
    results = context.Queue()
    processes = [
        context.Process(target=child, args=(sys.argv[1], parent_lease, results))
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
    refusals = []
    for child_tokens, child_errors, refused in reports:
        tokens += child_tokens
        errors += child_errors
        refusals.append(refused)
    outcome = {
        "tokens": tokens,
        "errors": errors,
        "refusals": refusals,
        "counter": int(client.get(COUNTER) or 0),
        "parent_lost": parent_lease.lost,
        "parent_released": parent_lease.release(),
    }
    print(json.dumps(outcome), flush=True)


if __name__ == "__main__":
    main()
