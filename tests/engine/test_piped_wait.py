"""A waiter on a single node sends its ``BLPOP`` and its next attempt in one write, so the
server runs the attempt the moment a release wakes it: the hand-off needs no round trip from
the waiter after the wake-up (docs/benchmarks.md, "The piped hand-off and quorum-first"). Real
nodes and processes."""

from __future__ import annotations

import asyncio
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from django.conf import settings

from django_redlock.locking.lease import Lease
from django_redlock.locking.manager import LockManager
from django_redlock.testing import RedisNode, RedisNodes
from tests.support import engine_workers as workers
from tests.support.processes import PROCESSES
from tests.support.redis_acl import ACL_COMMANDS, acl_user_urls


def _until(test: Callable[[], bool], seconds: float = 30.0) -> None:
    deadline = time.monotonic() + seconds
    while not test():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.01)


def _blocked(node: RedisNode) -> bool:
    return any(c["cmd"] == "blpop" and "b" in c["flags"] for c in node.client().client_list())


def _assert_nothing_left(node: RedisNode, manager: LockManager, holder: Lease) -> None:
    """The waiter that gave up left no blocked client and, once its last registration lapsed
    (<= 1 s), no claim: the holder's release reserves the name for nobody."""
    _until(lambda: not _blocked(node), 2.0)
    time.sleep(1.05)
    assert holder.release() is True
    again = manager.acquire("n", timeout=0)
    assert again.token > holder.token
    assert again.release() is True


@pytest.mark.parametrize("how", ["sync", "asyncio"])
def test_the_server_hands_the_lock_to_a_stopped_waiter(
    redis_node_factory: Callable[..., RedisNodes],
    redlock_alias: Callable[..., LockManager],
    how: str,
) -> None:
    """The waiter process is SIGSTOPped while it blocks; the holder releases: the node grants
    the name to the waiter at once (its attempt was already queued behind its BLPOP), though
    the waiter cannot run. Resumed, it holds the lease the server gave it (token above the
    holder's). With a wake-up followed by a fresh attempt, the name would stay free."""
    node = redis_node_factory(1)[0]
    manager = redlock_alias([node.url], TTL=10)
    alias = next(a for a, c in settings.REDLOCK.items() if c["NODES"] == [node.url])
    prefix = manager.config.key_prefix
    holder = manager.acquire("n", timeout=0)
    worker = workers.acquire_and_report if how == "sync" else workers.aacquire_and_report
    proc = PROCESSES.Process(
        target=worker,
        args=(settings.REDLOCK, alias, "n", 30, node.url, "tokens"),
    )
    proc.start()
    stopped = False
    try:
        _until(lambda: _blocked(node))
        os.kill(proc.pid or 0, signal.SIGSTOP)
        stopped = True
        assert holder.release() is True
        client = node.client()
        # taken while the waiter is stopped, with a token above the holder's
        _until(lambda: client.exists(f"{prefix}n") == 1, 2.0)
        value = client.get(f"{prefix}n")
        assert value is not None and int(value.split(b"|")[1]) > holder.token
        os.kill(proc.pid or 0, signal.SIGCONT)
        stopped = False
        # the worker exits once it reported, and its parent (the fork server) reaps it at
        # once: from here on its pid may be gone (or reused), so it is not signalled again
        reply = node.client(socket_timeout=35).blpop(["tokens"], timeout=30)
        assert reply is not None and int(reply[1]) > holder.token
    finally:
        if stopped:  # the test failed while the worker was stopped: let it run and end
            os.kill(proc.pid or 0, signal.SIGCONT)
        proc.join(30)
        if proc.is_alive():
            proc.kill()
    assert manager.acquire("n", timeout=1).release() is True


def test_a_node_that_refuses_blpop_gets_no_busy_loop(
    redis_node_factory: Callable[..., RedisNodes], redlock_alias: Callable[..., LockManager]
) -> None:
    """An ACL user without BLPOP: the first piped wait is refused (NOPERM), so the attempt
    behind it ran at once; the engine then waits the usual way (a sleep when BLPOP fails), so
    a waiter makes a handful of attempts per second, not thousands, and still gets the name."""
    nodes = redis_node_factory(1)
    without = " ".join(c for c in ACL_COMMANDS.split() if c != "+blpop")
    urls = acl_user_urls(nodes, "noblpop", "pw", "acl:", without)
    manager = redlock_alias(urls, KEY_PREFIX="acl:", RETRY_DELAY=0.05)
    holder = manager.acquire("n", ttl=5, timeout=0)
    admin = nodes[0].client()
    admin.config_resetstat()
    got: list[Any] = []
    thread = threading.Thread(target=lambda: got.append(manager.acquire("n", timeout=5)))
    thread.start()
    time.sleep(1.0)
    attempts = int(admin.info("commandstats").get("cmdstat_evalsha", {}).get("calls", 0))
    assert 1 <= attempts <= 40
    assert holder.release() is True
    thread.join(10)
    assert got and got[0].token > holder.token
    assert got[0].release() is True


@pytest.mark.parametrize("kind", ["sync", "asyncio"])
def test_a_waiter_on_a_dead_node_waits_its_steps_instead_of_spinning(
    redis_node_factory: Callable[..., RedisNodes],
    redlock_alias: Callable[..., LockManager],
    kind: str,
) -> None:
    """The only node is killed while a waiter waits for a held name: each piped wait fails at
    once (nothing can be sent), and the waiter must still wait its backoff step before the
    next attempt. Before, it tried again at once: ~18,000 attempts in 3 s, a core spinning
    for as long as the node stayed down (a leader's campaign: for ever); ~17,500 in this
    test."""
    from django_redlock import signals
    from django_redlock.exceptions import NodesUnavailable

    nodes = redis_node_factory(1)
    # NODE_TIMEOUT: the first acquire on a new node timed out once on a loaded machine (the
    # waits after the kill fail at once whatever it is: nothing can be sent)
    manager = redlock_alias(nodes, RETRY_DELAY=0.05, NODE_TIMEOUT=0.5)
    manager.acquire("dead", ttl=30, timeout=0)  # held: the waiter below waits
    failures: list[dict[str, Any]] = []

    def failed(sender: object, **kwargs: Any) -> None:
        failures.append(kwargs)

    signals.lock_failed.connect(failed, weak=False)
    try:
        killer = threading.Timer(0.3, nodes[0].kill)
        killer.start()
        with pytest.raises(NodesUnavailable):
            if kind == "sync":
                manager.acquire("dead", timeout=3)  # > the margin before a deadline: piped
            else:
                asyncio.run(manager.aacquire("dead", timeout=3))
        killer.join()
    finally:
        signals.lock_failed.disconnect(failed)
    [failure] = failures
    assert failure["attempts"] <= 100, failure["attempts"]  # a step is >= 25 ms: <= ~80


class _Interrupted(Exception):
    pass


@pytest.fixture
def alarm() -> Iterator[Callable[[float], None]]:
    """``alarm(seconds)``: raise :class:`_Interrupted` in the main thread after ``seconds``
    (as a worker timeout or Ctrl-C would, in the middle of whatever call is running)."""

    def interrupt(signum: int, frame: Any) -> None:
        raise _Interrupted

    previous = signal.signal(signal.SIGALRM, interrupt)
    yield lambda seconds: signal.setitimer(signal.ITIMER_REAL, seconds)
    signal.setitimer(signal.ITIMER_REAL, 0)
    signal.signal(signal.SIGALRM, previous)


def test_an_interrupted_piped_wait_leaves_nothing_behind(
    redis_node_factory: Callable[..., RedisNodes],
    redlock_alias: Callable[..., LockManager],
    alarm: Callable[[float], None],
) -> None:
    """Interrupted while it blocks: its connection is closed (not reused with a BLPOP still
    due), no blocked client stays on the node, and once its registration has lapsed (<= 1 s)
    the holder's release reserves the name for nobody: the next caller gets it at once."""
    node = redis_node_factory(1)[0]
    manager = redlock_alias([node.url], TTL=10)
    holder = manager.acquire("n", timeout=0)
    alarm(0.4)
    with pytest.raises(_Interrupted):
        manager.acquire("n", timeout=20)
    assert manager.engine.pools._blocking_all == []  # closed, not pooled
    _assert_nothing_left(node, manager, holder)


def test_a_cancelled_piped_wait_leaves_nothing_behind(
    redis_node_factory: Callable[..., RedisNodes], redlock_alias: Callable[..., LockManager]
) -> None:
    """asyncio: a task cancelled while it blocks closes its blocking channel (not pooled with
    a BLPOP still due), no blocked client stays on the node, and once its registration has
    lapsed the holder's release reserves the name for nobody."""
    node = redis_node_factory(1)[0]
    manager = redlock_alias([node.url], TTL=10)
    holder = manager.acquire("n", timeout=0)

    async def main() -> None:
        task = asyncio.create_task(manager.aacquire("n", timeout=20))
        deadline = time.monotonic() + 5.0
        while not _blocked(node):  # the first wait pipes its BLPOP (not the first backoff)
            assert time.monotonic() < deadline, "the waiter never blocked in BLPOP"
            await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        loop = asyncio.get_running_loop()
        assert manager.engine.pools.loops.pools_of[loop].blocking == []  # closed, not pooled

    asyncio.run(main())
    _assert_nothing_left(node, manager, holder)


def test_a_blpop_whose_reply_comes_late_is_not_reused(
    redis_node_factory: Callable[..., RedisNodes],
    redlock_alias: Callable[..., LockManager],
) -> None:
    """An asyncio wait whose BLPOP reply is later than its timeout (the node stopped: a
    loaded machine does the same) closes that connection instead of pooling it: redis-py
    answers the timed-out read with None, as it answers the server's nil, and the next wait on
    that connection would read this one's late reply."""
    node = redis_node_factory(1)[0]
    manager = redlock_alias([node.url], TTL=5.0)
    engine = manager.engine

    async def main() -> tuple[bool, int, int]:
        assert await engine.await_release("n", 0.3) is False  # the nil in time: pooled
        pools = await engine.pools.loops.loop_pools()
        pooled = sum(len(conns) for conns in pools.waiting)
        node.pause()
        try:
            woken = await engine.await_release("n", 0.2)  # its nil comes after the timeout
        finally:
            node.resume()
        return woken, pooled, sum(len(conns) for conns in pools.waiting)

    woken, pooled_before, pooled_after = asyncio.run(main())
    assert pooled_before == 1
    assert woken is False and pooled_after == 0
