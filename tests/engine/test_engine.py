"""The lock engine against real redis-server processes: exclusion, tokens, faults, waiting."""

from __future__ import annotations

import asyncio
import itertools
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings
from django.test import override_settings

from django_redlock import lock, locks, signals
from django_redlock.exceptions import LockLost, LockNotAcquired, NodesUnavailable
from django_redlock.testing import RedisNodes
from tests.support import engine_workers as workers
from tests.support.processes import PROCESSES
from tests.support.waiting import assert_woken, backing_off, until, until_blocked, until_waiting


def _keys(nodes: RedisNodes, pattern: str) -> list[list[bytes]]:
    return [list(node.client().scan_iter(match=pattern)) for node in nodes]


@pytest.mark.parametrize("alias", ["default", "multi", "five"])
def test_lock_excludes_second_holder(alias: str, unique_name: str) -> None:
    """While one lease holds a name, a second acquire with timeout=0 is refused."""
    manager = locks[alias]
    with manager.lock(unique_name, ttl=5) as lease:
        assert lease.token > 0
        with pytest.raises(LockNotAcquired):
            manager.acquire(unique_name, timeout=0)
    again = manager.acquire(unique_name, timeout=0)
    assert again.token > lease.token
    assert again.release() is True


def test_processes_lose_no_increment_on_five_nodes(session_nodes: RedisNodes, unique_name: str):
    """8 processes doing a non-atomic read-modify-write under the 5-node lock lose nothing,
    and the tokens they saw, in critical-section order, strictly increase."""
    counter_key = f"counter:{unique_name}"
    rounds = 15
    with PROCESSES.Pool(8) as pool:
        results = pool.starmap(
            workers.increment_under_lock,
            [
                (settings.REDLOCK, "five", unique_name, session_nodes[0].url, counter_key, rounds)
                for _ in range(8)
            ],
        )
    client = session_nodes[0].client()
    assert int(client.get(counter_key)) == 8 * rounds
    in_order = [int(t) for t in client.lrange(f"{counter_key}:tokens", 0, -1)]
    assert len(in_order) == 8 * rounds
    assert all(a < b for a, b in itertools.pairwise(in_order))
    assert sorted(t for r in results for t in r) == in_order


def test_without_lock_the_workload_loses_increments(session_nodes: RedisNodes, unique_name: str):
    """Control for the test above: the same read-modify-write without a lock loses updates."""
    client = session_nodes[0].client()
    key = f"nolock:{unique_name}"
    code = (
        "import redis,time,sys\n"
        "c=redis.Redis.from_url(sys.argv[1])\n"
        "time.sleep(max(0.0, float(sys.argv[3]) - time.time()))\n"
        "for _ in range(200):\n"
        "    v=int(c.get(sys.argv[2]) or 0); time.sleep(0.0005); c.set(sys.argv[2], v+1)\n"
    )
    import subprocess
    import sys

    start_at = str(time.time() + 1.5)  # all four start together
    procs = [
        subprocess.Popen([sys.executable, "-c", code, session_nodes[0].url, key, start_at])
        for _ in range(4)
    ]
    for p in procs:
        assert p.wait(60) == 0
    assert int(client.get(key)) < 4 * 200


def test_tokens_increase_after_highest_node_restarts_empty(redis_node_factory, redlock_alias):
    """Tokens keep increasing when the node with the highest counter is killed and restarted
    empty: it is quarantined for one TTL, then rejoins with the majority's counter."""
    nodes = redis_node_factory(3)
    manager = redlock_alias(nodes, TTL=0.5, NODE_TIMEOUT=0.1)
    tokens = []
    with manager.lock("t", timeout=2) as lease:  # a brand-new cluster initialises itself
        tokens.append(lease.token)
    nodes[2].pause()
    for _ in range(4):  # nodes 0 and 1 run ahead of node 2
        with manager.lock("t", timeout=2) as lease:
            tokens.append(lease.token)
    nodes[2].resume()
    nodes[0].kill()
    nodes[0].restart()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and len(tokens) < 30:
        with manager.lock("t", timeout=5) as lease:
            tokens.append(lease.token)
    time.sleep(0.6)  # past node 0's quarantine (TTL 0.5 s since its restart)
    nodes[1].pause()  # now a quorum needs node 0 again
    try:
        for _ in range(5):
            with manager.lock("t", timeout=5) as lease:
                tokens.append(lease.token)
    finally:
        nodes[1].resume()
    assert len(tokens) == 35
    assert all(a < b for a, b in itertools.pairwise(tokens))
    # node 0 rejoined: it holds the fence counter again
    fence = nodes[0].client().hgetall(f"{manager.config.key_prefix}__fence__")
    assert int(fence[b"token"]) >= tokens[5]


@pytest.mark.parametrize("count", [1, 3])
def test_first_acquires_of_many_processes_on_a_new_cluster_all_succeed(
    count: int, redis_node_factory: Any, tmp_path: Path
) -> None:
    """Four processes make their first acquire on a new cluster at the same moment, 12 times
    (a fresh key prefix each time): every one succeeds. One of them used to fail with
    NodesUnavailable ("quarantined") when another process initialised the fence state
    between its acquire and its probe."""
    urls = [node.url for node in redis_node_factory(count)]
    rounds, step = 12, 0.25
    go = tmp_path / "go"
    with PROCESSES.Pool(4) as pool:
        running = pool.starmap_async(
            workers.first_acquires,
            [(urls, f"new{count}-", rounds, str(go), step, i) for i in range(4)],
        )
        # the first round starts once all four have imported Django and connected
        workers.start_together(go, 4, running, delay=0.3)
        results = running.get(120)
    failures = [(r, i, out) for i, outs in enumerate(results) for r, out in enumerate(outs)]
    assert [f for f in failures if f[2] != "ok"] == []


@pytest.mark.parametrize("round_", range(3))
def test_first_acquires_with_timeout_0_of_many_threads_on_a_new_cluster(
    round_: int, redis_node_factory: Any, redlock_alias: Any
) -> None:
    """Twelve threads of one process make their first acquire(rw="write", timeout=0) on a new
    3-node cluster at once (a fresh alias each round), each of its own name: every one gets its
    lease, none NodesUnavailable ("quarantined"). The one retry after another caller initialised
    the nodes applies to timeout=0 too (it used to be skipped there: the rejoin check ran once
    per half second per alias, so the threads behind the initialising one failed)."""
    # a generous NODE_TIMEOUT, as in the processes' test: on a loaded machine (parallel runs)
    # a probe reply later than 2 x 50 ms made the rejoin check inconclusive, and a timeout=0
    # call fails then, rightly; what this test checks is the race to initialise the nodes
    manager = redlock_alias(redis_node_factory(3), TTL=5.0, TIMEOUT=30, NODE_TIMEOUT=2.0)
    outcomes = _first_acquires(manager, [f"fresh-{i}" for i in range(12)])
    assert outcomes == ["won"] * 12


@pytest.mark.parametrize("round_", range(3))
def test_first_acquires_with_timeout_0_of_one_name_on_a_new_cluster(
    round_: int, redis_node_factory: Any, redlock_alias: Any
) -> None:
    """The same twelve first acquires, all of one name: at most one wins, every other is refused
    LockNotAcquired, none NodesUnavailable. "At most": with timeout=0 each caller makes one
    attempt, and racing attempts on 3 nodes can split the votes (three callers with one node
    each) so that nobody wins; Redlock retries a split only while the caller's timeout lasts
    (docs/algorithm.md, "Quorum first")."""
    # a generous NODE_TIMEOUT, as in the processes' test: on a loaded machine (parallel runs)
    # a probe reply later than 2 x 50 ms made the rejoin check inconclusive, and a timeout=0
    # call fails then, rightly; what this test checks is the race to initialise the nodes
    manager = redlock_alias(redis_node_factory(3), TTL=5.0, TIMEOUT=30, NODE_TIMEOUT=2.0)
    outcomes = _first_acquires(manager, ["fresh"] * 12)
    assert outcomes.count("won") <= 1
    assert sorted(outcomes) == ["busy"] * (12 - outcomes.count("won")) + ["won"] * outcomes.count(
        "won"
    )


def _first_acquires(manager: Any, names: list[str]) -> list[str]:
    """Each name's acquire(rw="write", timeout=0) in a thread of its own, all at once; a winner
    keeps its lease until every other thread has its answer. The outcomes, sorted."""
    barrier = threading.Barrier(len(names))
    outcomes: list[str] = []

    def first_acquire(name: str) -> None:
        barrier.wait(30)
        try:
            lease = manager.acquire(name, rw="write", timeout=0)
        except LockNotAcquired:
            outcomes.append("busy")
        except NodesUnavailable as exc:
            outcomes.append(f"unavailable: {exc}")
        else:
            outcomes.append("won")
            deadline = time.monotonic() + 30
            while len(outcomes) < len(names) and time.monotonic() < deadline:
                time.sleep(0.01)  # every other thread has its answer
            lease.release()

    threads = [threading.Thread(target=first_acquire, args=(name,)) for name in names]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    return sorted(outcomes)


def test_restarted_node_is_quarantined_while_a_holds(redis_node_factory, redlock_alias):
    """A holds on all 3 nodes; node 0 is killed and restarted empty at once. B must be
    refused (the restarted node does not vote) rather than get a second lease."""
    nodes = redis_node_factory(3)
    manager = redlock_alias(nodes, TTL=30, NODE_TIMEOUT=0.1)
    a = manager.acquire("q", timeout=0)
    nodes[0].kill()
    nodes[0].restart()
    with pytest.raises(LockNotAcquired):
        manager.acquire("q", timeout=0.5)
    assert a.release() is True


@pytest.fixture
def busy_poll(request: pytest.FixtureRequest) -> Any:
    with override_settings(REDLOCK_BUSY_POLL=request.param):
        yield request.param


def _slowest_pair_with_one_paused(
    manager: Any, nodes: RedisNodes, prefix: str, pairs: int, between: float = 0.0
) -> float:
    """Seconds of the slowest of ``pairs`` acquire+release pairs (each release confirmed once
    a quorum answered) made while the last node is SIGSTOPped, ``between`` seconds apart."""
    manager.acquire("warm", timeout=0).release()
    nodes[-1].pause()
    slowest = 0.0
    try:
        for i in range(pairs):
            started = time.monotonic()
            lease = manager.acquire(f"{prefix}{i}", timeout=0)
            assert lease.release() is True  # returns once a quorum answered
            slowest = max(slowest, time.monotonic() - started)
            time.sleep(between)
    finally:
        nodes[-1].resume()
    return slowest


def test_background_give_backs_leave_the_pool_to_callers(redis_node_factory, redlock_alias):
    """One of five nodes SIGSTOPped: each release leaves it a straggler, sent to again in the
    background, on a connection of the give-backs' own. The callers keep the pooled one to
    themselves, so none opens another, whose connect would wait for the paused node (four
    NODE_TIMEOUTs: 4 s here); no pair waits half that. Before, a background send took the
    pooled connection for NODE_TIMEOUT now and then, and a pair waited for the new
    connection's handshake (80 s in test_one_paused_node_costs_at_most_node_timeout)."""
    nodes = redis_node_factory(5)
    manager = redlock_alias(nodes, TTL=5, NODE_TIMEOUT=1.0)
    # between pairs, the stragglers' thread wakes (every 0.1 s at first) and sends
    slowest = _slowest_pair_with_one_paused(manager, nodes, "s", 12, between=0.15)
    assert slowest < 2.0  # half the paused node's connect timeout: no pair waited for it


@pytest.mark.parametrize("busy_poll", [0.0, 0.0001], indirect=True)
def test_one_paused_node_costs_at_most_node_timeout(busy_poll, redis_node_factory, redlock_alias):
    """With one of five nodes SIGSTOPped, every acquire+release pair succeeds without waiting
    for it: NODE_TIMEOUT is 20 s here, so one call that waited for the paused node would take
    that long, while the pairs return once a quorum answered; once it resumes it holds no lock
    key. Both with busy polling (the default) and without (REDLOCK_BUSY_POLL = 0: straight to
    poll())."""
    nodes = redis_node_factory(5)
    manager = redlock_alias(nodes, TTL=5, NODE_TIMEOUT=20.0)
    assert manager.engine.state.busy_poll == busy_poll
    slowest = _slowest_pair_with_one_paused(manager, nodes, "p", 50)
    assert slowest < 10.0  # half a NODE_TIMEOUT: no call waited for the paused node
    manager.acquire("flush", timeout=0).release()  # drains the queued replies
    until(lambda: _keys(nodes, f"{manager.config.key_prefix}p*") == [[]] * 5, 10, "no key left")


def test_quorum_paused_fails_fast_and_leaves_no_key(redis_node_factory, redlock_alias):
    """Three of five paused: NodesUnavailable once NODE_TIMEOUT (0.5 s) has passed, not at
    a socket default nor when the nodes resume (the test's bound, 10 s, is far from both
    NODE_TIMEOUT and a loaded machine's delays), and after they resume no key for that name
    is left on any node."""
    nodes = redis_node_factory(5)
    manager = redlock_alias(nodes, TTL=20, NODE_TIMEOUT=0.5)
    manager.acquire("warm", timeout=0).release()
    for node in nodes[:3]:
        node.pause()
    try:
        started = time.monotonic()
        with pytest.raises(NodesUnavailable) as info:
            manager.acquire("x", timeout=0)
        assert time.monotonic() - started < 10.0
        assert info.value.quorum == 3
    finally:
        for node in nodes[:3]:
            node.resume()
    until(lambda: _keys(nodes, f"{manager.config.key_prefix}x") == [[]] * 5, 10, "no key left")


def test_expiry_in_block_raises_lock_lost_and_signals_once(unique_name: str):
    """A block that outlives its TTL raises LockLost on exit and sends lock_lost once;
    extend() after expiry raises LockLost too."""
    lost: list[Any] = []

    def on_lost(sender: Any, **kwargs: Any) -> None:
        lost.append(kwargs)

    signals.lock_lost.connect(on_lost)
    try:
        with pytest.raises(LockLost), locks["multi"].lock(unique_name, ttl=0.2) as lease:
            time.sleep(0.3)
            assert lease.validity == 0
            with pytest.raises(LockLost):
                lease.extend()
        assert len(lost) == 1 and lost[0]["name"] == unique_name
    finally:
        signals.lock_lost.disconnect(on_lost)


def test_block_exception_wins_over_lock_lost(unique_name: str):
    """If the block raised, that exception propagates, not LockLost, and the lock is freed."""
    with pytest.raises(KeyError), locks["default"].lock(unique_name, ttl=0.1):
        time.sleep(0.15)
        raise KeyError("boom")
    locks["default"].acquire(unique_name, timeout=0).release()


def test_extend_renews_and_release_is_idempotent(unique_name: str):
    """extend() pushes the validity back up; release() is True once, then False."""
    lease = locks["five"].acquire(unique_name, ttl=1, timeout=0)
    time.sleep(0.3)
    lease.extend(ttl=5)
    assert lease.validity > 4
    assert lease.release() is True
    assert lease.release() is False
    assert lease.validity == 0


def test_auto_extend_keeps_others_out_then_stops_at_max_hold(unique_name: str):
    """auto_extend holds a 1 s lease for 3 s against another process (checked 1.3 s after it
    holds: past its first TTL; renewed every third of a TTL, it stays held through a
    starved renewal thread of up to 0.6 s on a loaded machine); with max_hold the lease runs
    out afterwards and leaving the block raises LockLost."""
    proc = PROCESSES.Process(
        target=workers.hold_for, args=(settings.REDLOCK, "multi", unique_name, 3.0, 1.0)
    )
    proc.start()
    try:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:  # wait until the child holds it
            try:
                locks["multi"].acquire(unique_name, timeout=0).release()
                time.sleep(0.02)
            except LockNotAcquired:
                break
        time.sleep(1.3)  # beyond the child's TTL
        with pytest.raises(LockNotAcquired):
            locks["multi"].acquire(unique_name, timeout=0)
    finally:
        proc.join(20)
    assert proc.exitcode == 0
    with (
        pytest.raises(LockLost),
        locks["multi"].lock(unique_name, ttl=0.2, auto_extend=True, max_hold=0.3),
    ):
        time.sleep(0.8)


def test_waiter_is_woken_by_release(unique_name: str):
    """A waiter blocked on a held name is woken by the release, not let in by a backoff step
    (tests/support/waiting.py)."""
    manager = locks["multi"]
    holder = manager.acquire(unique_name, ttl=30, timeout=0)
    got: list[Any] = []

    def wait() -> None:
        with manager.lock(unique_name, timeout=30) as lease:
            got.append(lease)

    with backing_off(manager):
        thread = threading.Thread(target=wait)
        thread.start()
        until_waiting(manager, unique_name)  # the waiter has failed once and is waiting
        holder.release()
        thread.join(30)
    assert got and got[0].token > holder.token
    assert_woken(manager, unique_name, holder, got)


def test_timeout_zero_and_none(unique_name: str):
    """timeout=0 makes one attempt; a waiter with a timeout gives up after about it."""
    manager = locks["default"]
    with manager.lock(unique_name):
        started = time.monotonic()
        with pytest.raises(LockNotAcquired) as info:
            manager.acquire(unique_name, timeout=0.3)
        assert 0.25 < time.monotonic() - started < 2
        assert info.value.timeout == 0.3


def test_script_flush_is_survived(unique_name: str, session_nodes: RedisNodes):
    """After SCRIPT FLUSH on a node, calls fall back to EVAL and keep working."""
    manager = locks["default"]
    manager.acquire(unique_name, timeout=0).release()
    session_nodes[0].client().script_flush()
    lease = manager.acquire(unique_name, timeout=0)
    assert lease.release() is True


def test_decorator_with_key_template(unique_name: str):
    """@lock("...{0}") formats the name from the call's arguments and holds it inside."""
    seen: list[int] = []

    @lock(unique_name + ":{0}", ttl=5, timeout=0)
    def work(day: int) -> str:
        with pytest.raises(LockNotAcquired):
            locks["default"].acquire(f"{unique_name}:{day}", timeout=0)
        seen.append(day)
        return "done"

    assert work(3) == "done" and seen == [3]


def test_signals_acquired_released_failed(unique_name: str):
    """lock_acquired, lock_released and lock_failed carry alias, name and lease/reason."""
    events: list[tuple[str, dict[str, Any]]] = []
    handlers = {
        "acquired": lambda sender, **kw: events.append(("acquired", kw)),
        "released": lambda sender, **kw: events.append(("released", kw)),
        "failed": lambda sender, **kw: events.append(("failed", kw)),
    }
    signals.lock_acquired.connect(handlers["acquired"])
    signals.lock_released.connect(handlers["released"])
    signals.lock_failed.connect(handlers["failed"])
    try:
        with locks["multi"].lock(unique_name) as lease, pytest.raises(LockNotAcquired):
            locks["multi"].acquire(unique_name, timeout=0)
    finally:
        signals.lock_acquired.disconnect(handlers["acquired"])
        signals.lock_released.disconnect(handlers["released"])
        signals.lock_failed.disconnect(handlers["failed"])
    kinds = [k for k, _ in events]
    assert kinds == ["acquired", "failed", "released"]
    assert events[0][1]["lease"] is lease and events[0][1]["alias"] == "multi"
    assert events[1][1]["reason"] == "busy"


# -- asyncio twins -----------------------------------------------------------------------


def test_async_lock_excludes_and_tokens_increase(unique_name: str):
    """alock/aacquire exclude each other and other callers; tokens increase."""

    async def main() -> list[int]:
        manager = locks["five"]
        tokens = []
        async with manager.alock(unique_name, ttl=5) as lease:
            tokens.append(lease.token)
            with pytest.raises(LockNotAcquired):
                await manager.aacquire(unique_name, timeout=0)
        lease2 = await manager.aacquire(unique_name, timeout=0)
        tokens.append(lease2.token)
        await lease2.aextend(ttl=3)
        assert lease2.validity > 2
        assert await lease2.arelease() is True
        assert await lease2.arelease() is False
        return tokens

    tokens = asyncio.run(main())
    assert tokens[0] < tokens[1]


def test_async_waiters_serialise(unique_name: str):
    """Ten tasks incrementing a shared value with an await inside the lock lose nothing."""

    async def main() -> int:
        state = {"n": 0}

        async def worker() -> None:
            for _ in range(5):
                async with locks["multi"].alock(unique_name, ttl=5, timeout=10):
                    value = state["n"]
                    await asyncio.sleep(0.001)
                    state["n"] = value + 1

        await asyncio.gather(*(worker() for _ in range(10)))
        return state["n"]

    assert asyncio.run(main()) == 50


def test_async_expiry_raises_lock_lost(unique_name: str):
    """An async block that outlives its TTL raises LockLost on exit."""

    async def main() -> None:
        async with locks["default"].alock(unique_name, ttl=0.1):
            await asyncio.sleep(0.2)

    with pytest.raises(LockLost):
        asyncio.run(main())


def test_async_one_paused_node(redis_node_factory, redlock_alias):
    """The async path also succeeds with one of three nodes paused, without waiting for it
    (NODE_TIMEOUT 20 s: a call that waited would take that long)."""
    nodes = redis_node_factory(3)
    manager = redlock_alias(nodes, TTL=5, NODE_TIMEOUT=20.0)

    async def main() -> float:
        (await manager.aacquire("warm", timeout=0)).release()
        nodes[2].pause()
        try:
            slowest = 0.0
            for i in range(10):
                started = time.monotonic()
                lease = await manager.aacquire(f"a{i}", timeout=0)
                slowest = max(slowest, time.monotonic() - started)
                await lease.arelease()
            return slowest
        finally:
            nodes[2].resume()

    assert asyncio.run(main()) < 10.0  # half a NODE_TIMEOUT


def test_reserved_names_are_rejected() -> None:
    """Names starting with '__' would collide with the alias's own keys: ValueError."""
    for name in ("__fence__", "__wait__:x", "__released__"):
        with pytest.raises(ValueError, match="reserved"):
            locks["default"].acquire(name, timeout=0)


def test_release_hands_off_to_a_waiter(unique_name: str) -> None:
    """A thread that releases a name another thread waits for, then asks for it again at
    once, lets the waiter have it first (the waiting marker and the hand-off reservation).
    Checked over 10 hand-offs, each released once the waiter blocks for its wake-up; without
    the reservation the releaser wins nearly all."""
    manager = locks["multi"]
    waiter_first = 0
    for round_ in range(10):
        name = f"{unique_name}:{round_}"
        order: list[str] = []
        first = manager.acquire(name, ttl=30, timeout=0)

        def waiter(name: str = name, order: list[str] = order) -> None:
            with manager.lock(name, timeout=30):
                order.append("waiter")
                time.sleep(0.01)

        thread = threading.Thread(target=waiter)
        thread.start()
        until_waiting(manager, name)  # the waiter has tried once and marked the name as wanted
        until_blocked(manager, name)  # ... and blocks for its wake-up
        first.release()
        with manager.lock(name, timeout=30):
            order.append("releaser")
        thread.join(30)
        waiter_first += order[0] == "waiter"
    assert waiter_first >= 7


@pytest.mark.parametrize("flavour", ["sync", "async"])
def test_releaser_that_handed_off_waits_in_line_without_an_attempt(
    redis_node_factory, redlock_alias, flavour: str
) -> None:
    """A holds, B waits; A releases (a hand-off to B) and asks again at once. A must not
    spend a doomed acquire attempt on the reserved name: it registers as a waiter and blocks in
    the same write, B gets the lock, and B's release wakes A. Counted on the node: 7 lock script
    calls (EVALSHA: A acquire, B's failed attempt, A release, B acquire, B release, A acquire,
    A release) and A's registration (one EVAL, sent with its BLPOP); an attempt by A right
    after its release would make 8 EVALSHA."""
    import threading

    (node,) = nodes = redis_node_factory(1)
    manager = redlock_alias(nodes, TTL=5, RETRY_DELAY=5.0)  # only wake-ups explain quick turns
    manager.acquire("warm", timeout=0).release()
    client = node.client()
    client.config_resetstat()
    first = manager.acquire("n", timeout=0)
    held: dict[str, Any] = {}

    def b() -> None:
        with manager.lock("n", timeout=10) as lease:
            held["b"] = lease
            time.sleep(0.2)

    thread = threading.Thread(target=b)
    thread.start()
    until_blocked(manager, "n")  # B has failed once and blocks in BLPOP
    first.release()
    if flavour == "sync":
        again = manager.acquire("n", timeout=10)
        again.release()
    else:

        async def a_again() -> Any:
            lease = await manager.aacquire("n", timeout=10)
            await lease.arelease()
            return lease

        again = asyncio.run(a_again())
    thread.join(5)
    assert first.token < held["b"].token < again.token  # B went first, then A
    assert_woken(manager, "n", held["b"], [again])  # by B's release, not a 0.8 s backoff
    stats = client.info("commandstats")
    calls = {c: stats.get(f"cmdstat_{c}", {}).get("calls", 0) for c in ("evalsha", "eval")}
    assert calls == {"evalsha": 7, "eval": 1}


@pytest.mark.parametrize("flavour", ["sync", "async"])
def test_waiter_gets_past_a_stale_pooled_wait_connection(
    redis_node_factory, redlock_alias, flavour: str
) -> None:
    """The BLPOP connection a waiter left in the pool is killed by the server (as an idle
    timeout or CLIENT KILL would): the next waiter notices at once, blocks on a fresh
    connection and is still woken by the release, instead of sleeping a whole backoff step
    (RETRY_DELAY 5 s: 0.8 s). The async waiter keeps its pool on one event loop throughout."""
    import threading

    nodes = redis_node_factory(1)
    manager = redlock_alias(nodes, TTL=5, RETRY_DELAY=5.0)
    loop = asyncio.new_event_loop()
    loop_thread = threading.Thread(target=loop.run_forever, daemon=True)
    loop_thread.start()

    def wait_for(name: str) -> Any:
        if flavour == "sync":
            return manager.acquire(name, timeout=10)
        future = asyncio.run_coroutine_threadsafe(manager.aacquire(name, timeout=10), loop)
        return future.result(15)

    def handed_over(name: str) -> None:
        """A waiter for ``name`` is woken by its release (tests/support/waiting.py)."""
        holder = manager.acquire(name, ttl=30, timeout=0)
        got: list[Any] = []
        thread = threading.Thread(target=lambda: got.append(wait_for(name)))
        thread.start()
        until_waiting(manager, name)  # the waiter failed once and blocks in BLPOP
        holder.release()
        thread.join(10)
        assert got and got[0].token > holder.token
        assert_woken(manager, name, holder, got)
        got[0].release()

    try:
        handed_over("a")  # leaves one BLPOP connection in the pool
        killed = nodes[0].client().client_kill_filter(_type="normal", skipme=True)
        assert killed >= 2  # the pooled BLPOP connection and the lock channel's
        handed_over("b")
    finally:
        asyncio.run_coroutine_threadsafe(loop.shutdown_asyncgens(), loop).result(5)
        loop.call_soon_threadsafe(loop.stop)
        loop_thread.join(5)
        loop.close()


def test_uncontended_release_leaves_only_the_fence_hash(redis_node_factory, redlock_alias):
    """Without waiters, acquire+release leaves no key behind but the alias's fence hash (no
    waiting markers, no wake-up lists)."""
    nodes = redis_node_factory(3)
    manager = redlock_alias(nodes, TTL=5)
    for i in range(5):
        manager.acquire(f"n{i}", timeout=0).release()
    prefix = manager.config.key_prefix.encode()
    assert _keys(nodes, manager.config.key_prefix + "*") == [[prefix + b"__fence__"]] * 3


def test_node_wiped_without_restart_is_quarantined(redis_node_factory, redlock_alias):
    """A long-running node that loses its data without restarting (FLUSHALL) must not vote at
    once: A holds on nodes 0 and 1, node 0 is wiped, and B (which could win nodes 0 and 2) is
    refused while A's lease is valid."""
    nodes = redis_node_factory(3)
    manager = redlock_alias(nodes, TTL=1.0, NODE_TIMEOUT=0.1)
    manager.acquire("warm", timeout=0).release()
    time.sleep(1.1)  # every node's uptime now exceeds the longest TTL
    nodes[2].pause()
    try:
        a = manager.acquire("q", ttl=1.0, timeout=0)  # wins on nodes 0 and 1
    finally:
        nodes[2].resume()
    key = f"{manager.config.key_prefix}q"
    deadline = time.monotonic() + 2
    while not nodes[2].client().exists(key) and time.monotonic() < deadline:
        time.sleep(0.01)  # the queued SET reaches node 2 once it resumes...
    nodes[2].client().delete(key)  # ...drop it, as if that SET had been lost on the way
    nodes[0].client().flushall()
    with pytest.raises((LockNotAcquired, NodesUnavailable)):
        manager.acquire("q", ttl=1.0, timeout=0)
    assert a.validity > 0  # B was refused while A still held the lock
    a.release()


def test_a_node_whose_connection_factory_raises_is_down_with_its_reason() -> None:
    """A connection factory that raises (an invalid TLS option, a timeout that overflows) makes
    the node "down" with that reason, with backoff: no thread dies with a traceback per call
    (pytest turns one into an error) and the reason reaches the failure's errors."""
    from django_redlock.engine import AcquireFailure, AliasState, Engine

    def factory() -> Any:
        raise ValueError("Invalid SSL Certificate Requirements Flag: bogus")

    engine = Engine(AliasState("l1:", 0.05, 0.01, 5.0), ["bad"], [factory], [factory])
    try:
        for _ in range(20):
            outcome = engine.acquire("x", 5.0, 0)
            assert isinstance(outcome, AcquireFailure) and outcome.reason == "unavailable"
        assert "Invalid SSL Certificate" in outcome.errors["bad"]
        threads = [t for t in threading.enumerate() if t.name.startswith("redlock-connect")]
        assert len(threads) <= 1  # backoff: not one reconnect thread per call
    finally:
        engine.close()


# -- who waits (docs/production.md "Waiting")
# ---------------------------------------------------------


def _waiters(alias: str, name: str) -> int:
    from django_redlock import inspection

    info, errors = inspection.get_lock(alias, name)
    assert info is not None and not errors
    return info.waiters


def _until(test: Any, seconds: float = 10.0) -> None:
    deadline = time.monotonic() + seconds
    while not test():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.01)


@pytest.mark.parametrize("flavour", ["sync", "async"])
@pytest.mark.parametrize("holds", [0.0, 0.05], ids=["releases-at-once", "holds-a-while"])
@pytest.mark.parametrize("alias", ["default", "multi"])
def test_timeout_zero_succeeds_after_the_woken_waiter_released(
    alias: str, holds: float, flavour: str, unique_name: str
) -> None:
    """A holds, B waits; A's release wakes B, B takes the name and releases it. Nobody
    holds or waits for it now, so C's acquire(timeout=0) right after must succeed: B stopped
    counting as a waiter when it won (its registration must not make B's release reserve the
    name for nobody)."""
    manager = locks[alias]
    holder = manager.acquire(unique_name, ttl=10, timeout=0)
    tokens: list[int] = []

    async def take_async() -> None:
        lease = await manager.aacquire(unique_name, timeout=10)
        tokens.append(lease.token)
        await asyncio.sleep(holds)
        await lease.arelease()

    def take() -> None:
        if flavour == "async":
            asyncio.run(take_async())
            return
        lease = manager.acquire(unique_name, timeout=10)
        tokens.append(lease.token)
        time.sleep(holds)
        lease.release()

    thread = threading.Thread(target=take)
    thread.start()
    until_waiting(manager, unique_name)  # B has failed once (registered) and waits
    holder.release()
    thread.join(10)
    assert tokens and tokens[0] > holder.token  # B was woken and took it
    again = manager.acquire(unique_name, timeout=0)  # C, right after B's release
    assert again.token > tokens[0]
    assert again.release() is True


@pytest.mark.parametrize("alias", ["default", "multi"])
def test_waiters_counts_live_waiters(alias: str, unique_name: str) -> None:
    """Three threads waiting for a held name: inspection reports waiters == 3 (show and list,
    also in as_dict() for --json); once each has had its turn, waiters == 0 and a new holder
    takes the name with timeout=0."""
    from django_redlock import inspection

    manager = locks[alias]
    holder = manager.acquire(unique_name, ttl=10, timeout=0)
    turns: list[int] = []

    def wait() -> None:
        with manager.lock(unique_name, timeout=10) as lease:
            turns.append(lease.token)
            time.sleep(0.01)

    threads = [threading.Thread(target=wait) for _ in range(3)]
    for thread in threads:
        thread.start()
    _until(lambda: _waiters(alias, unique_name) == 3)
    page = inspection.list_locks(using=[alias], prefix=unique_name)
    assert [info.as_dict()["waiters"] for info in page.locks] == [3]
    holder.release()
    for thread in threads:
        thread.join(10)
    assert len(turns) == 3
    again = manager.acquire(unique_name, ttl=10, timeout=0)
    try:
        # a waiter that won withdraws its mark fire-and-forget: on a loaded machine the last
        # withdrawal may still be on its way when the count is read
        _until(lambda: _waiters(alias, unique_name) == 0, 5.0)
    finally:
        again.release()


@pytest.mark.parametrize("alias", ["default", "multi"])
def test_waiter_that_gave_up_stops_counting(alias: str, unique_name: str) -> None:
    """A waiter whose timeout ran out no longer waits: at once it counts 0, and the holder's
    release reserves nothing for it (acquire(timeout=0) right after succeeds)."""
    manager = locks[alias]
    holder = manager.acquire(unique_name, ttl=10, timeout=0)
    with pytest.raises(LockNotAcquired):
        manager.acquire(unique_name, timeout=0.3)
    assert holder.release() is True
    again = manager.acquire(unique_name, timeout=0)
    try:
        assert _waiters(alias, unique_name) == 0
    finally:
        again.release()


@pytest.mark.parametrize("alias", ["default", "multi"])
def test_waiter_killed_while_waiting_stops_counting_within_a_second(
    alias: str, unique_name: str, session_nodes: RedisNodes
) -> None:
    """A waiter process SIGKILLed while it waits stops counting within 1 s: a release 1 s after
    the kill reserves the name for nobody, so a third caller's acquire(timeout=0) right after it
    succeeds, and inspection counts no waiter."""
    manager = locks[alias]
    nodes = list(session_nodes)[: len(manager.config.nodes)]
    holder = manager.acquire(unique_name, ttl=10, timeout=0)
    proc = PROCESSES.Process(
        target=workers.wait_for_lock, args=(settings.REDLOCK, alias, unique_name, 60)
    )
    proc.start()

    def blocked() -> bool:  # the waiter failed its attempt and blocks in BLPOP
        clients = [c for node in nodes for c in node.client().client_list()]
        return any(c["cmd"] == "blpop" and "b" in c["flags"] for c in clients)

    try:
        _until(blocked, 60)
    finally:
        proc.kill()  # SIGKILL: no goodbye of any kind
        proc.join(10)
    time.sleep(1.02)  # its last registration was made before the kill and lives <= 1 s
    assert holder.release() is True
    reservation = f"{manager.config.key_prefix}__handoff__:{unique_name}"
    assert not any(node.client().exists(reservation) for node in nodes)  # for nobody
    again = manager.acquire(unique_name, timeout=0)  # right after the release
    try:
        assert _waiters(alias, unique_name) == 0
    finally:
        again.release()


def test_acl_user_without_the_waiter_commands_still_locks_and_waits(
    redis_node_factory, redlock_alias
) -> None:
    """An ACL user set up before the waiter sets existed (no TIME, ZADD, ZREM,
    ZREMRANGEBYSCORE, ZCOUNT) keeps locking: waiter bookkeeping is never needed for safety.
    Its waiters are not registered, so a release wakes nobody and the waiter gets the name
    after its backoff instead."""
    from tests.support.redis_acl import ACL_COMMANDS, acl_user_urls

    waiter_commands = {"+time", "+zadd", "+zrem", "+zremrangebyscore", "+zcount"}
    old = " ".join(c for c in ACL_COMMANDS.split() if c not in waiter_commands)
    nodes = redis_node_factory(3)
    urls = acl_user_urls(nodes, "old", "pw", "acl:", old)
    manager = redlock_alias(urls, KEY_PREFIX="acl:", RETRY_DELAY=0.05)
    holder = manager.acquire("n", ttl=5, timeout=0)
    got: list[Any] = []
    thread = threading.Thread(target=lambda: got.append(manager.acquire("n", timeout=5)))
    thread.start()
    until(lambda: manager.engine.waiters.value == 1)  # the waiter failed and waits
    assert not any(node.client().exists("acl:__waiters__:n") for node in nodes)  # refused
    assert holder.release() is True
    thread.join(10)
    assert got and got[0].token > holder.token
    assert got[0].release() is True
    assert manager.acquire("n", timeout=0).release() is True


def test_releaser_queueing_first_is_registered_on_every_node(redis_node_factory, redlock_alias):
    """On 3 nodes, A releases to B (a hand-off) and asks again at once: A queues without an
    attempt, so it registers itself on every node (the wake-up node with its BLPOP, the others
    from a lock connection). While B holds, each node counts exactly one waiter (A; B stopped
    counting when it won), so B's release reserves the name on every node for A."""
    nodes = redis_node_factory(3)
    manager = redlock_alias(nodes, TTL=5, RETRY_DELAY=5.0)
    key = f"{manager.config.key_prefix}__waiters__:n"
    first = manager.acquire("n", timeout=0)
    tokens: dict[str, int] = {}
    b_holds, b_may_go = threading.Event(), threading.Event()

    def b() -> None:
        with manager.lock("n", timeout=10) as lease:
            tokens["b"] = lease.token
            b_holds.set()
            b_may_go.wait(30)  # holds until the test has counted the waiters

    def live(node: Any) -> int:
        client = node.client()
        seconds, micros = client.time()
        return int(client.zcount(key, f"({seconds * 1000 + micros // 1000}", "+inf"))

    thread = threading.Thread(target=b)
    thread.start()
    until_blocked(manager, "n")  # B has failed once and blocks
    first.release()
    again: list[Any] = []
    a = threading.Thread(target=lambda: again.append(manager.acquire("n", timeout=30)))
    a.start()
    assert b_holds.wait(30)
    _until(lambda: [live(node) for node in nodes] == [1, 1, 1])
    b_may_go.set()
    thread.join(5)
    a.join(5)
    assert again and first.token < tokens["b"] < again[0].token
    again[0].release()
