"""Bounded pools (docs/production.md): at most ``MAX_CONNECTIONS`` connections per node
and process, waiting connections included, and idle ones closed after ``IDLE_TIMEOUT``.
Real redis-server nodes; connections counted with ``CLIENT LIST`` on each node."""

from __future__ import annotations

import asyncio
import gc
import json
import math
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from django.conf import settings
from django.core import checks
from django.core.exceptions import ImproperlyConfigured
from django.test import override_settings

from django_redlock.checks import check_settings
from django_redlock.conf import parse_alias
from django_redlock.locking.manager import LockManager
from django_redlock.testing import RedisNode, RedisNodes
from tests.support.sockets import open_sockets_to
from tests.support.waiting import until_blocked

Nodes = Callable[..., RedisNodes]
Alias = Callable[..., LockManager]

CAP = 10
WORKERS = 200


def _ours(node: RedisNode) -> int:
    """How many connections to the node this process holds open (each test starts its own
    nodes). Counted on the client's side: a
    connection the client closed is gone from there at once, while a loaded node may still
    list it for a moment."""
    assert node.port is not None
    return open_sockets_to(node.port)


class _Peak:
    """Samples every node's client count in the background; ``peak`` is the highest seen.
    Given the alias's budget and cap, each sample above the cap is kept with the slots the
    budget counted then (``over``), so a failure says whether the budget let too many in or
    sockets outlived their slots."""

    def __init__(
        self, nodes: RedisNodes, budget: Any = None, cap: int = 0, engine: Any = None
    ) -> None:
        self._nodes = list(nodes)
        self.peak = 0
        self._budget, self._cap, self._engine = budget, cap, engine
        self.over: list[tuple[Any, ...]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            counts = [_ours(node) for node in self._nodes]
            self.peak = max(self.peak, *counts)
            if self._budget is not None and max(counts) > self._cap and len(self.over) < 5:
                threads = sorted(t.name for t in threading.enumerate())
                held = _holders(self._engine) if self._engine is not None else None
                self.over.append((counts, self._budget.in_use(), held, threads))
            self._stop.wait(0.005)

    def __enter__(self) -> _Peak:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        for node in self._nodes:  # once more, at the end
            self.peak = max(self.peak, _ours(node))

    def now(self) -> list[int]:
        return [_ours(node) for node in self._nodes]


def _holders(engine: Any) -> dict[str, Any]:
    """Per kind of holder, its connected links per node (a racy read, for a failure's
    message): which of the engine's objects hold the sockets counted."""
    pools = engine.pools

    def links(channels: list[Any]) -> list[int]:
        return _connected(engine, channels)

    found: dict[str, Any] = {
        "sync": links(list(pools._all)),
        "sync blocking": links(list(pools._blocking_all)),
        "aside": links([pools._aside] if pools._aside else []),
        "sync waiter open": getattr(pools.waiter, "open", None),
    }
    for n, loop_pools in enumerate(list(pools.loops.pools_of.values())):
        found[f"loop {n}"] = links(list(loop_pools.channels))
        found[f"loop {n} blocking"] = links(list(loop_pools.blocking))
        found[f"loop {n} waiting"] = [len(conns) for conns in loop_pools.waiting]
    return found


def _sync_sockets(engine: Any) -> list[int]:
    """Per node, the connected links of the engine's sync channels (pooled, blocking waits,
    the background give-backs')."""
    pools = engine.pools
    channels = [*pools._all, *pools._blocking_all, *([pools._aside] if pools._aside else [])]
    return _connected(engine, channels)


def _connected(engine: Any, channels: list[Any]) -> list[int]:
    """Per node, how many of ``channels`` have a connected link to it."""
    return [
        sum(1 for channel in channels if channel.links[i].connected)
        for i in range(len(engine.labels))
    ]


def _until(test: Callable[[], bool], seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while not test():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


@pytest.fixture
def three(redis_node_factory: Nodes) -> Iterator[RedisNodes]:
    yield redis_node_factory(3)


@pytest.mark.slow  # the cap: test_threads_and_tasks_share_one_budget (default profile)
def test_200_threads_on_3_nodes_stay_within_max_connections(
    three: RedisNodes, redlock_alias: Alias
) -> None:
    """200 threads lock one name at once (most of them wait) with MAX_CONNECTIONS=10: no node
    ever sees more than 10 connections of this process, every lock is taken (generous
    timeout), and a counter incremented under the lock ends exact."""
    manager = redlock_alias(three, MAX_CONNECTIONS=CAP, TTL=10.0, RETRY_DELAY=0.02)
    counter = [0]
    errors: list[BaseException] = []
    start = threading.Barrier(WORKERS)

    def work() -> None:
        try:
            start.wait()
            for _ in range(2):
                with manager.lock("shared", timeout=60):
                    seen = counter[0]
                    time.sleep(0)  # let another thread run here if it could
                    counter[0] = seen + 1
        except BaseException as exc:  # reported below
            errors.append(exc)

    with _Peak(three) as peak:
        threads = [threading.Thread(target=work) for _ in range(WORKERS)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert errors == []
    assert counter[0] == 2 * WORKERS
    assert 0 < peak.peak <= CAP


@pytest.mark.slow  # the cap: test_threads_and_tasks_share_one_budget (default profile)
def test_200_tasks_on_3_nodes_stay_within_max_connections(
    three: RedisNodes, redlock_alias: Alias
) -> None:
    """The asyncio twin: 200 tasks of one event loop, MAX_CONNECTIONS=10."""
    manager = redlock_alias(three, MAX_CONNECTIONS=CAP, TTL=10.0, RETRY_DELAY=0.02)
    counter = [0]

    async def work() -> None:
        for _ in range(2):
            async with manager.alock("shared", timeout=60):
                seen = counter[0]
                await asyncio.sleep(0)  # let another task run here if it could
                counter[0] = seen + 1

    async def main() -> list[Any]:
        return await asyncio.gather(*(work() for _ in range(WORKERS)), return_exceptions=True)

    with _Peak(three) as peak:
        results = asyncio.run(main())
    gc.collect()  # what the closed loop left is reported here, not in a later test
    assert [r for r in results if r is not None] == []
    assert counter[0] == 2 * WORKERS
    assert 0 < peak.peak <= CAP


def test_threads_and_tasks_share_one_budget(three: RedisNodes, redlock_alias: Alias) -> None:
    """Threads and two event loops (in two threads) at once, MAX_CONNECTIONS=4: the cap
    holds for all of them together, and everyone gets the lock. (Ten threads and ten tasks
    per loop, twice each: with twenty of each, three times, the callers of three kinds took
    15-37 s to share four connections per node, over 60 s on a loaded machine; that
    throughput is a limit of its own, not what this test checks.)"""
    manager = redlock_alias(three, MAX_CONNECTIONS=4, TTL=10.0, RETRY_DELAY=0.02)
    counter = [0]
    errors: list[BaseException] = []

    def sync_work() -> None:
        try:
            for _ in range(2):
                with manager.lock("mixed", timeout=60):
                    counter[0] += 1
        except BaseException as exc:
            errors.append(exc)

    async def task() -> None:
        for _ in range(2):
            async with manager.alock("mixed", timeout=60):
                counter[0] += 1

    def loop_work() -> None:
        async def main() -> None:
            await asyncio.gather(*(task() for _ in range(10)))

        try:
            asyncio.run(main())
        except BaseException as exc:
            errors.append(exc)

    with _Peak(three, manager.engine.budget, 4, manager.engine) as peak:
        threads = [threading.Thread(target=sync_work) for _ in range(10)]
        threads += [threading.Thread(target=loop_work) for _ in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert errors == []
    assert counter[0] == 2 * 30
    assert 0 < peak.peak <= 4, f"(sockets per node, budget's slots, threads): {peak.over}"


def test_idle_connections_close_after_idle_timeout(three: RedisNodes, redlock_alias: Alias) -> None:
    """Connections opened by 20 concurrent threads (lock channels and waiting connections)
    are all closed once idle for IDLE_TIMEOUT, with no further lock call to notice it."""
    manager = redlock_alias(three, IDLE_TIMEOUT=0.5, TTL=10.0, RETRY_DELAY=0.02)

    def work() -> None:
        with manager.lock("idle", timeout=30):
            time.sleep(0.01)

    with _Peak(three) as peak:
        threads = [threading.Thread(target=work) for _ in range(20)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert peak.peak > 1
    probe = _Peak(three)
    assert _until(lambda: probe.now() == [0, 0, 0], 3.0), probe.now()


def test_idle_asyncio_connections_close_after_idle_timeout(
    three: RedisNodes, redlock_alias: Alias
) -> None:
    """The asyncio twin: while the event loop runs on, its idle connections close."""
    manager = redlock_alias(three, IDLE_TIMEOUT=0.5, TTL=10.0, RETRY_DELAY=0.02)
    probe = _Peak(three)

    async def work() -> None:
        async with manager.alock("idle", timeout=30):
            await asyncio.sleep(0.01)

    async def main() -> list[int]:
        await asyncio.gather(*(work() for _ in range(20)))
        assert max(probe.now()) > 1
        deadline = time.monotonic() + 3.0
        while probe.now() != [0, 0, 0] and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        return probe.now()

    assert asyncio.run(main()) == [0, 0, 0]


def test_a_call_waits_for_a_connection_within_its_deadline(
    three: RedisNodes, redlock_alias: Alias
) -> None:
    """MAX_CONNECTIONS=1: while one thread's call holds the only connection (a node is
    paused, so the call waits NODE_TIMEOUT), another lock call waits for it and then wins."""
    manager = redlock_alias(three, MAX_CONNECTIONS=1, NODE_TIMEOUT=0.3)
    manager.acquire("warm", timeout=0).release()  # one connection open
    with _Peak(RedisNodes(list(three)[1:])) as peak:
        three[0].pause()
        try:
            slow = threading.Thread(target=lambda: manager.acquire("slow", timeout=0).release())
            slow.start()
            time.sleep(0.05)  # the slow call holds the connection now
            lease = manager.acquire("other", timeout=5)
            slow.join()
        finally:
            three[0].resume()
    assert lease.release() is True
    assert peak.peak == 1


# -- settings ---------------------------------------------------------------------------
URL = "redis://127.0.0.1:1/0"


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        ("MAX_CONNECTIONS", 0, "must be an int >= 1"),
        ("MAX_CONNECTIONS", -3, "must be an int >= 1"),
        ("MAX_CONNECTIONS", 2.5, "must be an int >= 1"),
        ("MAX_CONNECTIONS", True, "must be an int >= 1"),
        ("MAX_CONNECTIONS", "10", "must be an int >= 1"),
        ("IDLE_TIMEOUT", 0, "must be a finite number > 0"),
        ("IDLE_TIMEOUT", -1, "must be a finite number > 0"),
        ("IDLE_TIMEOUT", float("inf"), "must be a finite number > 0"),
        ("IDLE_TIMEOUT", "300", "must be a number of seconds"),
    ],
)
def test_bad_pool_settings_are_refused(key: str, value: Any, message: str) -> None:
    with pytest.raises(ImproperlyConfigured, match=rf"REDLOCK\['bad'\]\['{key}'\]: {message}"):
        parse_alias("bad", {"NODES": [URL], key: value})
    with override_settings(REDLOCK={"bad": {"NODES": [URL], key: value}}):
        errors = check_settings(None)
    assert [e.id for e in errors] == ["django_redlock.E002"]
    assert isinstance(errors[0], checks.Error) and key in errors[0].msg


def test_pool_settings_defaults_and_values() -> None:
    config = parse_alias("ok", {"NODES": [URL]})
    assert (config.max_connections, config.idle_timeout) == (50, 300.0)
    config = parse_alias("ok", {"NODES": [URL], "MAX_CONNECTIONS": 1, "IDLE_TIMEOUT": 0.5})
    assert (config.max_connections, config.idle_timeout) == (1, 0.5)


@pytest.mark.parametrize(("nodes", "cap", "tasks"), [(1, 2, 4), (3, 4, 6)])
def test_tasks_beyond_the_budget_take_turns_on_one_event_loop(
    redis_node_factory: Nodes, redlock_alias: Alias, nodes: int, cap: int, tasks: int
) -> None:
    """More tasks than MAX_CONNECTIONS, each locking and releasing a name of its own in a
    tight loop for half a second: every task gets a connection meanwhile, and none fails. A
    task that returned a channel took it straight back (its next call ran before the task it
    woke), so the tasks beyond the budget waited until the others stopped, and failed
    "no free connection in time" when they ran longer than its 5 s (found by an attack)."""
    # a generous NODE_TIMEOUT: a reply later than 50 ms on a loaded machine (parallel runs)
    # is a node timing out, not what this test looks for
    manager = redlock_alias(
        redis_node_factory(nodes), MAX_CONNECTIONS=cap, TTL=10.0, NODE_TIMEOUT=2.0
    )
    first_done: dict[int, float] = {}
    errors: list[BaseException] = []

    async def one(i: int, end: float) -> None:
        while time.monotonic() < end:
            try:
                await (await manager.aacquire(f"turns:{i}", timeout=0)).arelease()
            except Exception as exc:
                errors.append(exc)
                return
            first_done.setdefault(i, time.monotonic())

    async def main() -> float:
        end = time.monotonic() + 0.5
        await asyncio.gather(*(one(i, end) for i in range(tasks)))
        return end

    end = asyncio.run(main())
    assert errors == []
    late = {i: round(first_done[i] - end, 3) for i in range(tasks) if first_done[i] >= end}
    assert late == {}, "tasks whose first lock came only after the others had stopped"


def test_a_channel_closed_while_a_task_waits_for_it_is_not_used(
    three: RedisNodes, redlock_alias: Alias
) -> None:
    """A task that picked a free channel but had to wait for its mutex (another task was
    woken for it first, then cancelled) must not use it if it was closed meanwhile (evicted
    for a starving pool): it picks again. Before, it used the closed channel, whose links
    reconnected outside the budget and stayed open after the loop closed."""
    # a generous NODE_TIMEOUT: a release reply later than 50 ms on a loaded machine (parallel
    # runs) left its straggler to a background thread, whose connections this test counted
    manager = redlock_alias(three, MAX_CONNECTIONS=2, TTL=10.0, NODE_TIMEOUT=2.0)
    engine = manager.engine

    async def main() -> bool:
        (await manager.aacquire("warm", timeout=0)).release()  # one channel, idle
        pools = await engine.pools.loops.loop_pools()
        [channel] = pools.channels
        await channel.mutex.acquire()  # "another task" holds it
        first = asyncio.ensure_future(channel.mutex.acquire())  # a task waiting for it
        await asyncio.sleep(0)
        user = asyncio.ensure_future(manager.aacquire("x", timeout=5))  # runs before `first`
        channel.mutex.release()  # wakes `first`...
        first.cancel()  # ...which is cancelled before it runs: it passes the mutex on
        await asyncio.sleep(0)  # `user` picked the channel and waits for its mutex
        pools._evict_one(math.inf)  # evicted before `user` runs: closed, out of the pool
        lease = await user
        ok = await lease.arelease()
        reused = any(link.connected for link in channel.links)
        return ok and not reused

    assert asyncio.run(main())
    # all closed with the loop: what is left open is the sync side's (a release's straggler,
    # a node that answered after the quorum on a loaded machine, is sent again from a
    # background thread on a sync channel of its own)
    assert _until(lambda: [_ours(n) for n in three] == _sync_sockets(engine), 5.0), (
        [_ours(n) for n in three],
        _sync_sockets(engine),
    )


def test_a_connect_in_flight_when_its_channel_closes_drops_its_socket(
    three: RedisNodes, redlock_alias: Alias
) -> None:
    """A link whose channel closes while it connects (a background reconnect, sync or
    asyncio, waiting for a slow node) closes what that connect makes: a closed channel holds
    no socket outside the budget, and never reconnects."""
    from django_redlock.engine.transport.aio import AsyncLink
    from django_redlock.engine.transport.link import Link

    manager = redlock_alias(three, TTL=10.0)
    engine = manager.engine
    node = three[0]
    link = Link("n0", engine._factories[0])
    node.pause()  # the TCP connect completes (the kernel's backlog), the handshake waits
    try:
        connecting = threading.Thread(target=link.connect_detached)
        connecting.start()
        assert _until(lambda: _ours(node) == 1, 5)
        link.close_link()
    finally:
        node.resume()
    connecting.join(10)
    assert not link.connected and _ours(node) == 0
    assert link.usable() is False  # and it never tries again

    async def main() -> bool:
        alink = AsyncLink("n0", engine._async_factories[0], 5.0)
        node.pause()
        try:
            connect = asyncio.ensure_future(alink.connect())
            while _ours(node) == 0:
                await asyncio.sleep(0.01)
            alink.close_link()
        finally:
            node.resume()
        ok = await connect
        await asyncio.sleep(0)
        return ok or alink.connected or alink.usable()

    assert asyncio.run(main()) is False
    assert _ours(node) == 0


def test_a_reconnect_that_starts_after_its_channel_closed_opens_no_socket(
    three: RedisNodes, redlock_alias: Alias
) -> None:
    """A background reconnect started before its channel closed, that reaches the connect
    only after (its thread waited for a CPU), opens no socket: the channel's budget slot was
    given back at the close, so a socket then would be one over MAX_CONNECTIONS on that node
    (seen as a node with more sockets than the cap in loaded parallel runs)."""
    from django_redlock.engine.transport.aio import AsyncLink
    from django_redlock.engine.transport.link import Link

    manager = redlock_alias(three, TTL=10.0)
    engine = manager.engine
    made: list[str] = []

    def factory() -> Any:
        made.append("sync")
        return engine._factories[0]()

    def async_factory() -> Any:
        made.append("async")
        return engine._async_factories[0]()

    link = Link("n0", factory)
    link.close_link()  # the channel closed before the reconnect got to its connect
    assert link.connect_detached() is False and not link.connected

    async def main() -> bool:
        alink = AsyncLink("n0", async_factory, 5.0)
        alink.close_link()
        return await alink.connect()

    assert asyncio.run(main()) is False
    assert made == [] and _ours(three[0]) == 0


#: Run in a process of its own (no other test's garbage, the collector off): an event loop
#: closed without closing its pools, then three threads that need the budget.
_CLOSED_LOOP = """
import asyncio, gc, json, os, sys, threading, time
import django
django.setup()
from django_redlock import locks
from tests.support.sockets import open_sockets_to

manager, ports = locks["default"], json.loads(sys.argv[1])
gc.disable()  # the collector would close the left sockets too, at a moment of its own

async def main():
    async def one():
        async with manager.alock("x", timeout=5):
            await asyncio.sleep(0.01)
    await asyncio.gather(one(), one())

loop = asyncio.new_event_loop()
loop.run_until_complete(main())
loop.close()
before = max(open_sockets_to(port) for port in ports)

def work():
    with manager.lock("y", timeout=5):
        time.sleep(0.05)

threads = [threading.Thread(target=work) for _ in range(3)]
for thread in threads:
    thread.start()
peak = 0
while any(thread.is_alive() for thread in threads):
    peak = max(peak, *(open_sockets_to(port) for port in ports))
    time.sleep(0.002)
print(json.dumps({"before": before, "peak": peak}))
os._exit(0)  # the left garbage is not collected (its finalizers would only warn)
"""


def test_a_loop_closed_without_closing_its_pools_keeps_no_socket_past_its_slot(
    three: RedisNodes, redlock_alias: Alias
) -> None:
    """An event loop closed by ``loop.close()`` (no ``asyncio.run`` shutdown to close its
    pools) still holds their connections; when threads then need the budget, its slots are
    reclaimed and its sockets closed with them: never more sockets than MAX_CONNECTIONS.
    (They stayed open until the garbage collector found their transports: 4 sockets on a
    node with a cap of 2.)"""
    manager = redlock_alias(three, MAX_CONNECTIONS=2, TTL=10.0)
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "tests.support.subprocess_settings",
        "REDLOCK_JSON": json.dumps({"default": settings.REDLOCK[manager.alias]}),
        "PYTHONPATH": str(Path(__file__).resolve().parents[2]),
    }
    ports = json.dumps([node.port for node in three])
    done = subprocess.run(
        [sys.executable, "-c", _CLOSED_LOOP, ports],
        env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen["before"] == 2  # the closed loop's connections, still open
    assert seen["peak"] <= 2, seen


@pytest.mark.parametrize("count", [1, 3])
@pytest.mark.parametrize("how", ["sync", "asyncio"])
def test_a_wait_after_a_burst_that_spent_the_budget_blocks_again(
    redis_node_factory: Nodes, redlock_alias: Alias, count: int, how: str
) -> None:
    """A burst of callers opens MAX_CONNECTIONS lock connections per node and leaves them
    idle. A caller that then waits for a held name needs a connection of its own to block
    in BLPOP; the budget was spent, so every wait after such a burst polled instead (until
    IDLE_TIMEOUT closed the idle ones: 27 hand-offs/s against 288 in an attack with a burst
    of 60 and the default 50). A wait that finds the budget spent now has each pool close a
    connection idle for a second, so a later wait blocks: the oracle is a client blocked on
    the node. The connections a busy pool cycles through stay (the long profile's
    test_200_threads_on_3_nodes_stay_within_max_connections)."""
    nodes = redis_node_factory(count)
    manager = redlock_alias(nodes, MAX_CONNECTIONS=4, TTL=10.0)

    async def aburst() -> None:
        async def one(i: int) -> None:
            (await manager.aacquire(f"burst:{i}", timeout=5)).release()

        await asyncio.gather(*(one(i) for i in range(8)))

    def burst() -> None:
        threads = [
            threading.Thread(target=lambda i=i: manager.acquire(f"burst:{i}", timeout=5).release())
            for i in range(8)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join()

    held = manager.acquire("held", timeout=0)
    outcome: list[Any] = []

    async def await_it() -> None:
        await aburst()
        lease = await manager.aacquire("held", timeout=8)
        outcome.append(await lease.arelease())

    def wait_for_it() -> None:
        if how == "asyncio":
            asyncio.run(await_it())
        else:
            burst()
            outcome.append(manager.acquire("held", timeout=8).release())

    waiter = threading.Thread(target=wait_for_it)
    waiter.start()
    try:
        until_blocked(manager, "held", seconds=6.0)
    finally:
        held.release()
        waiter.join()
    assert outcome == [True]


def test_make_room_asks_for_connections_idle_a_second_only_when_the_budget_is_spent() -> None:
    """The budget's side of the burst fix, without I/O: a refused wait asks the pools for a
    connection idle ROOM_IDLE seconds only while a node's whole budget is in use (not only
    the blocking half), and at most every ROOM_EVERY seconds however many waits ask."""
    from django_redlock.engine.pools import budget as budget_module

    budget = budget_module.Budget(nodes=2, limit=4)
    asked: list[float] = []
    budget.add_evictor(object(), asked.append)
    assert budget.take((0, 1), blocking=True) and budget.take((0, 1), blocking=True)
    assert not budget.take((0, 1), blocking=True)  # the blocking half is spent
    budget.make_room((0, 1))
    assert asked == []  # lock calls still have room: nothing to close
    assert budget.take((0, 1)) and budget.take((0, 1))  # now the whole budget is in use
    before = time.monotonic()
    budget.make_room((0,))
    budget.make_room((0,))  # at once again: not asked twice
    assert len(asked) == 1
    assert (
        before - budget_module.ROOM_IDLE <= asked[0] <= time.monotonic() - budget_module.ROOM_IDLE
    )
    time.sleep(budget_module.ROOM_EVERY)
    budget.make_room((1,))
    assert len(asked) == 2
    budget.starve(object(), kind=object())  # a starving caller takes any idle one
    assert asked[2] == math.inf


@pytest.mark.parametrize("how", ["sync", "asyncio"])
def test_room_is_not_made_of_a_channel_a_paused_node_still_owes_a_reply_on(
    three: RedisNodes, redlock_alias: Alias, how: str
) -> None:
    """A burst's idle channels make room for a wait, but not one a node still owes an
    acquire's reply on (a paused node): the lease's release must follow its acquire on that
    connection, else the paused node, resumed, may run the release first and keep the name
    for its TTL. An event loop reads replies as they come, so its channel owes one only
    while the node has not answered: not even a starving pool (``math.inf``) takes it then.
    A sync channel's reply may have come unread: a starving pool still takes it."""
    manager = redlock_alias(three, TTL=10.0, NODE_TIMEOUT=0.2)
    engine = manager.engine

    async def atake() -> None:
        (await manager.aacquire("warm", timeout=0)).release()  # every node trusted
        pools = await engine.pools.loops.loop_pools()
        three[2].pause()
        try:
            await manager.aacquire("owed", timeout=0)  # nodes 0 and 1: a quorum
            [channel] = pools.channels
            assert channel.pending()  # node 2 owes its reply
            pools._evict_one(time.monotonic() + 1.0)  # idle long enough, but owed
            pools._evict_one(math.inf)  # a starving pool: owed all the same
            assert pools.channels == [channel]
        finally:
            three[2].resume()
        for _ in range(200):  # the loop reads the late reply
            if not channel.pending():
                break
            await asyncio.sleep(0.01)
        pools._evict_one(math.inf)
        assert pools.channels == []

    if how == "asyncio":
        asyncio.run(atake())
        return
    manager.acquire("warm", timeout=0).release()
    three[2].pause()
    try:
        manager.acquire("owed", timeout=0)
        [channel] = engine.pools._all
        assert channel.pending()
        engine.pools._evict_one(time.monotonic() + 1.0)
        assert engine.pools._all == [channel]
        engine.pools._evict_one(math.inf)
        assert engine.pools._all == []
    finally:
        three[2].resume()


def test_a_lease_released_while_a_burst_spent_the_budget_follows_its_acquire_on_a_paused_node(
    three: RedisNodes, redlock_alias: Alias
) -> None:
    """An attack: asyncio, a paused node, and a burst on the same loop that spends
    MAX_CONNECTIONS. Every channel then owes the paused node a reply, and the background
    give-backs (a sync kind) starve: they had the loop close an owed channel, the one a
    held lease's acquire went out on. Its release then went out on another connection, the
    resumed node ran it before the acquire, and kept the name until the release's second look
    2 s later (4 of 4 runs). Oracle: the paused node's keys 1 s after it resumed."""
    manager = redlock_alias(three, MAX_CONNECTIONS=4, TTL=8.0, NODE_TIMEOUT=0.05)
    paused = redis.Redis.from_url(str(three[2].url))

    async def main() -> None:
        await (await manager.aacquire("warm", timeout=5)).arelease()
        three[2].pause()
        try:
            lease = await manager.aacquire("X", timeout=5)

            async def one(i: int) -> None:
                await (await manager.aacquire(f"burst:{i}", timeout=10)).arelease()

            await asyncio.gather(*(one(i) for i in range(8)))
            await asyncio.sleep(1.5)  # the give-backs starve meanwhile
            await lease.arelease()
            await asyncio.sleep(0.3)
        finally:
            three[2].resume()
        await asyncio.sleep(1.0)

    asyncio.run(main())
    left = [k for k in paused.keys(f"{manager.engine.state.keys.lock('X')}*") if b"__" not in k]
    assert left == [], [(k, paused.pttl(k)) for k in left]


@pytest.mark.parametrize("count", [1, 3])
def test_a_task_waiting_for_a_channel_is_woken_when_a_lease_call_on_its_own_channel_ends(
    redis_node_factory: Nodes, redlock_alias: Alias, count: int
) -> None:
    """A lease's release (or extend) runs on the channel its acquire used, when that one is
    still pooled. It did not hand the channel on when it ended: a task that had found the
    budget spent and every channel busy (the release held that one) waited for a channel
    until its own timeout, next to an idle one (an attack: 2 of 10 runs, 12 and 30 s
    waits, on three nodes with MAX_CONNECTIONS=4). Oracle: the loop's queue of tasks
    waiting for a channel, once the release is over (no clock)."""
    nodes = redis_node_factory(count)
    manager = redlock_alias(nodes, MAX_CONNECTIONS=1, TTL=10.0)

    async def main() -> None:
        lease = await manager.aacquire("held", timeout=0)
        pools = await manager.engine.pools.loops.loop_pools()
        release = asyncio.ensure_future(lease.arelease())
        await asyncio.sleep(0)  # the release holds the loop's only channel now
        other = asyncio.ensure_future(manager.aacquire("other", timeout=5))
        for _ in range(100):  # until it queues for a channel
            if pools.waiters:
                break
            await asyncio.sleep(0)
        assert pools.waiters, "the second caller never queued for a channel"
        assert await release
        assert not pools.waiters, "the release ended without handing its channel on"
        await (await other).arelease()

    asyncio.run(main())
