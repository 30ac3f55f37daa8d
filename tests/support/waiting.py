"""Waiting for a waiter, and telling a wake-up from a backoff, without timing anything.

What replaces "sleep a little, the other thread must be waiting by now" in tests that measure
or observe a wait: a caller that waits for a busy name registers on the nodes with its failed
attempt and keeps that registration alive until it wins or gives up (each later attempt renews
it). So once :func:`until_waiting` returns, that caller's call had begun, and it waits for the
name from then on: a release after that point wakes it, and a wait measured by its call
includes everything that happened after that point.

What replaces "it got the name within 90 ms of the release, so the release woke it"
(:func:`assert_woken`): under :func:`backing_off` every backoff step of a waiter is the longest
one (``MAX_BACKOFF``, 0.8 s), so a waiter that was not woken waits at least that long in its
call; one let in sooner was woken. Besides, the release says it handed the name off (it found
the waiter registered, reserved the name for it and pushed a wake-up onto the list the name's
waiters block on), and that wake-up was taken (a waiter that got in at the end of a backoff step
leaves it in the list).
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import redis

from django_redlock.engine.keyspace import wake_node
from django_redlock.engine.policy import MAX_BACKOFF
from django_redlock.locking.manager import LockManager


def waiters(manager: LockManager, name: str) -> int:
    """How many callers are registered as waiting for ``name`` (on the node that has the
    most: an attempt registers on the nodes it reached). Read with ``ZCARD`` (not counted
    among the node's script calls); a registration that lapsed stays counted until a release
    or an attempt prunes it, so use a name of the test's own."""
    keys = manager.engine.state.keys
    counts = []
    for node in manager.config.nodes:
        assert node.url is not None, "a URL node"
        client = redis.Redis.from_url(node.url)
        try:
            counts.append(int(client.zcard(keys.waiters(name))))
        except (redis.RedisError, OSError):
            continue  # a paused or dead node counts for nothing
        finally:
            client.close()
    return max(counts, default=0)


def until_waiting(manager: LockManager, name: str, count: int = 1, seconds: float = 20.0) -> None:
    """Return once at least ``count`` callers wait for ``name``; AssertionError after
    ``seconds`` (spawned processes may take seconds to get there)."""
    until(lambda: waiters(manager, name) >= count, seconds, f"{count} waiter(s) for {name!r}")


def until_blocked(manager: LockManager, name: str, count: int = 1, seconds: float = 20.0) -> None:
    """Return once ``count`` clients block (``BLPOP``) on the node the waiters of ``name``
    block on: registered waiters are then past their attempt, in line for a wake-up (a caller
    that queues behind them cannot take it first). Counts every blocked client of that node,
    so use nodes of the test's own."""
    nodes = manager.config.nodes
    url = nodes[wake_node(name, len(nodes))].url
    assert url is not None, "a URL node"
    client = redis.Redis.from_url(url)
    try:
        blocked = lambda: int(client.info("clients")["blocked_clients"]) >= count  # noqa: E731
        until(blocked, seconds, f"{count} client(s) blocked for {name!r}")
    finally:
        client.close()


def until(test: Callable[[], bool], seconds: float = 20.0, what: str = "condition") -> None:
    """Poll ``test`` until it is true; AssertionError naming ``what`` after ``seconds``."""
    deadline = time.monotonic() + seconds
    while not test():
        assert time.monotonic() < deadline, f"{what}: not met within {seconds} s"
        time.sleep(0.005)


def release_once_waited_for(
    manager: LockManager, name: str, lease: Any, seconds: float, count: int = 1
) -> threading.Thread:
    """A started thread that releases ``lease`` (``release()``) ``seconds`` after ``count``
    callers were seen waiting for ``name``: each of their calls began before that, so each
    waits at least ``seconds``. Join it after the calls."""

    def run() -> None:
        try:
            until_waiting(manager, name, count)
            time.sleep(seconds)
        finally:  # released in any case: an assertion above must not leave the waiter stuck
            lease.release()

    thread = threading.Thread(target=run)
    thread.start()
    return thread


@contextlib.contextmanager
def backing_off(manager: LockManager, retry_delay: float = 5.0) -> Iterator[None]:
    """Inside, ``manager``'s waiters back off the longest step (``MAX_BACKOFF``) every time
    (``RETRY_DELAY`` 5 s: a step of at most 0.8 s, at least half the delay)."""
    states = [engine.state for engine in manager.shards]
    before = [state.retry_delay for state in states]
    for state in states:
        state.retry_delay = retry_delay
    try:
        yield
    finally:
        for state, delay in zip(states, before, strict=True):
            state.retry_delay = delay


def wake_ups_left(manager: LockManager, name: str) -> int:
    """Wake-ups pushed by releases of ``name`` that no waiter has taken (they lapse after
    ``WAKE_TTL_MS``), on the node its waiters block on."""
    nodes = manager.config.nodes
    url = nodes[wake_node(name, len(nodes))].url
    assert url is not None, "a URL node"
    client = redis.Redis.from_url(url)
    try:
        return int(client.llen(manager.engine.state.keys.wake(name)))
    finally:
        client.close()


def handed_off(lease: Any) -> bool:
    """True if ``lease``'s release woke a waiter (found one registered, reserved the name for
    it and pushed its wake-up)."""
    return bool(lease.record.handed_off)


def assert_woken(manager: LockManager, name: str, released: Any, waiters: list[Any]) -> None:
    """Each lease of ``waiters`` (of callers that waited for ``name``) was let in by the
    release of ``released``, not by a backoff step (run them under :func:`backing_off`)."""
    assert handed_off(released), "the release found no waiter to hand the name to"
    assert wake_ups_left(manager, name) == 0, "a wake-up was pushed and never taken"
    # a waiter that was not woken waits at least one whole step in its call
    assert all(lease.waited < MAX_BACKOFF for lease in waiters), [w.waited for w in waiters]


def pttls(manager: LockManager, key: str) -> list[int]:
    """``PTTL`` of ``key`` on each node of ``manager``'s alias (the server's own clock: how
    long a lease nobody renews may still hold it; -2 where it is missing)."""
    found = []
    for node in manager.config.nodes:
        assert node.url is not None, "a URL node"
        client = redis.Redis.from_url(node.url)
        try:
            found.append(int(client.pttl(key)))
        finally:
            client.close()
    return found
