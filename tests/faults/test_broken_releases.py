"""Releases whose connection breaks (``tests/support/tcp_proxy.py`` between the client and its
nodes): ``release()`` is True only when a quorum of nodes confirmed the compare-and-delete;
otherwise it is sent again on a new connection, and in the background until the lease's
validity ends, so the name is never left locked for the TTL by a lease nobody holds."""

from __future__ import annotations

import asyncio
import contextlib
import random
import signal
import threading
import time
from collections.abc import Callable

import pytest

from django_redlock import locks
from django_redlock.engine import giveback
from django_redlock.exceptions import LockError, LockNotAcquired, NodesUnavailable
from django_redlock.locking.lease import Lease
from django_redlock.locking.manager import LockManager
from django_redlock.testing import RedisNodes
from tests.support.signal_storm import storm
from tests.support.tcp_proxy import Proxy
from tests.support.waiting import until

Nodes = Callable[..., RedisNodes]
Alias = Callable[..., LockManager]
TTL = 30.0


def _keys(nodes: RedisNodes, key: str) -> int:
    return sum(int(node.client().exists(key)) for node in nodes)


@pytest.mark.parametrize("fault", ["reset", "drop-replies"])
@pytest.mark.parametrize("count", [1, 3])
def test_a_release_whose_connection_breaks_is_given_back(
    redis_node_factory: Nodes,
    redlock_alias: Alias,
    proxies: Callable[[RedisNodes], list[Proxy]],
    fault: str,
    count: int,
) -> None:
    """The connections to a quorum of the nodes break as the release is sent (reset: closed at
    once; drop-replies: the node runs it, the reply never comes, then the connection is
    closed). ``release()`` is False and the lease says its release is unconfirmed
    (``check()`` raises); once the network heals the release is given back in the background
    and the name is free within a second, not after its 30 s TTL. It used to return True with
    the name left locked (reset) for the TTL."""
    nodes = redis_node_factory(count)
    px = proxies(nodes)
    a = redlock_alias([p.url for p in px], TTL=TTL, NODE_TIMEOUT=0.2)
    b = redlock_alias(nodes, TTL=TTL, KEY_PREFIX=a.config.key_prefix)
    a.acquire("warm", timeout=0).release()  # connections through the proxies are up
    lease = a.acquire("k", timeout=0)
    key = f"{a.config.key_prefix}k"
    # a quorum of the nodes that hold the key (a quorum-first acquire may have reached only
    # a quorum, and a node behind or slow is skipped: which ones depends on the name and load)
    holders = [i for i, node in enumerate(nodes) if node.client().exists(key)]
    broken = [px[i] for i in holders[: count // 2 + 1]]
    for proxy in broken:
        proxy.set(fault)
    assert lease.release() is False
    assert lease.release_unconfirmed
    with pytest.raises(LockError, match="too few nodes confirmed"):
        lease.check()
    if fault == "reset":  # nothing reached the broken nodes: the name is still held there
        assert _keys(nodes, key) == len(broken)
        with pytest.raises(LockNotAcquired):
            b.acquire("k", timeout=0)
    for proxy in broken:
        proxy.set("pass")
    until(lambda: _keys(nodes, key) == 0, 5.0, "the release given back")
    until(lambda: not lease.release_unconfirmed, 5.0, "the release confirmed")
    b.acquire("k", timeout=0).release()
    lease.check()  # confirmed now: nothing to report


def _held_behind_proxies(
    redis_node_factory: Nodes, redlock_alias: Alias, proxies: Callable[[RedisNodes], list[Proxy]]
) -> tuple[RedisNodes, list[Proxy], Lease, str]:
    """Three nodes behind proxies (connections up), and a lease of ``k`` on them, with its key."""
    nodes = redis_node_factory(3)
    px = proxies(nodes)
    a = redlock_alias([p.url for p in px], TTL=TTL, NODE_TIMEOUT=0.2)
    a.acquire("warm", timeout=0).release()
    lease, key = a.acquire("k", timeout=0), f"{a.config.key_prefix}k"
    # the acquire is decided by a quorum: on a loaded machine the third node's copy may still
    # be in its proxy when the test breaks that connection
    until(lambda: _keys(nodes, key) == 3, 5.0, "the key on every node")
    return nodes, px, lease, key


@pytest.mark.parametrize("kept", [False, True], ids=["", "kept-across-a-reset"])
@pytest.mark.parametrize("fault", ["reset", "drop-replies"])
def test_a_release_a_quorum_confirmed_is_given_back_to_the_straggler(
    redis_node_factory: Nodes,
    redlock_alias: Alias,
    proxies: Callable[[RedisNodes], list[Proxy]],
    fault: str,
    kept: bool,
) -> None:
    """One of three connections breaks as the release is sent: ``release()`` is True (two
    nodes confirmed it) at once, and the third node's key is given back once it is reachable,
    not left there for the 30 s TTL. It used to stay: a minority holding the name makes every
    acquire need all the other nodes.

    ``kept``: the settings changed (``override_settings`` of ``REDLOCK``: ``locks.reset()``)
    between the acquire and the release, and the lease's manager was kept. Its engine, closed
    by the reset, used to stay closed for its background give-backs while it went on locking,
    so the third node kept the key for the TTL (and every five-node release started a
    thread)."""
    nodes, px, lease, key = _held_behind_proxies(redis_node_factory, redlock_alias, proxies)
    if kept:
        locks.reset()  # what a change of REDLOCK does: every engine made so far is closed
    px[0].set(fault)
    assert lease.release() is True
    assert not lease.release_unconfirmed
    lease.check()
    px[0].set("pass")
    until(lambda: _keys(nodes, key) == 0, 5.0, "the straggler's key given back")


def test_the_give_back_goes_on_for_a_node_that_heals_after_the_quorum(
    redis_node_factory: Nodes,
    redlock_alias: Alias,
    proxies: Callable[[RedisNodes], list[Proxy]],
) -> None:
    """Two of three connections break at the release; one heals, the background give-back
    reaches a quorum (the release is confirmed), and the other, healed later, is given back too
    (a CI run once left it locked: the give-back stopped at the quorum)."""
    nodes, px, lease, key = _held_behind_proxies(redis_node_factory, redlock_alias, proxies)
    px[0].set("reset")
    px[1].set("reset")
    assert lease.release() is False
    px[0].set("pass")
    until(lambda: not lease.release_unconfirmed, 5.0, "the release confirmed by a quorum")
    assert _keys(nodes, key) == 1
    px[1].set("pass")
    until(lambda: _keys(nodes, key) == 0, 5.0, "the last node's key given back")


def test_an_unconfirmed_release_stops_trying_when_the_lease_runs_out(
    redis_node_factory: Nodes,
    redlock_alias: Alias,
    proxies: Callable[[RedisNodes], list[Proxy]],
) -> None:
    """A node that stays cut off: the background give-back stops once the lease's validity is
    over (the key expires there anyway)."""
    nodes = redis_node_factory(1)
    px = proxies(nodes)
    a = redlock_alias([p.url for p in px], TTL=1.0, NODE_TIMEOUT=0.2)
    lease = a.acquire("k", timeout=0)
    px[0].set("reset")
    assert lease.release() is False
    assert lease.release_unconfirmed
    until(lambda: not lease.release_unconfirmed, 3.0, "the give-back stopping")
    px[0].set("pass")


@pytest.mark.parametrize("count", [1, 3])
def test_an_acquire_whose_reply_was_lost_gives_its_grant_back(
    redis_node_factory: Nodes,
    redlock_alias: Alias,
    proxies: Callable[[RedisNodes], list[Proxy]],
    count: int,
) -> None:
    """The nodes grant the attempt, their replies are swallowed and then the connections are
    closed (the proxy aborts a connection that lost a reply when the network heals): the
    attempt fails, and its give-back cannot go out on the closed connections (or went out
    just before the close and was lost with it). It is sent on a new connection in the
    background once the client's next call finds a connection broken. The name is free within
    a few seconds, not after its 30 s TTL (it used to stay locked, held by nobody)."""
    nodes = redis_node_factory(count)
    px = proxies(nodes)
    a = redlock_alias([p.url for p in px], TTL=TTL, NODE_TIMEOUT=0.3)
    a.acquire("warm", timeout=0).release()
    key = f"{a.config.key_prefix}k"
    for proxy in px:
        proxy.set("drop-replies")
    swallowed = [proxy.counters.swallowed["down"] for proxy in px]
    failed: list[BaseException] = []

    def attempt() -> None:
        try:
            a.acquire("k", timeout=0).release()
        except Exception as exc:
            failed.append(exc)

    thread = threading.Thread(target=attempt)
    thread.start()
    until(lambda: _keys(nodes, key) == count, 5.0, "the grants made")
    # the grants' replies lost, not still on their way through a loaded proxy (healed first,
    # it delivered them, and the attempt succeeded)
    until(
        lambda: all(
            proxy.counters.swallowed["down"] > before
            for proxy, before in zip(px, swallowed, strict=True)
        ),
        5.0,
        "the grants' replies swallowed",
    )
    for proxy in px:
        proxy.set("pass")  # closes every connection that lost a reply
    thread.join(10)
    assert len(failed) == 1 and isinstance(failed[0], NodesUnavailable | LockNotAcquired)
    # a give-back written just before its connection broke is known lost only once a call
    # notices the broken connection: this client's next one
    a.acquire("next", timeout=0).release()
    until(lambda: _keys(nodes, key) == 0, 5.0, "the grants given back")


class _Alarm(Exception):
    """Raised by the test's SIGALRM handler (a signal handler that raises, like Ctrl-C)."""


def test_an_interrupt_while_reconnecting_does_not_mark_the_node_down(
    redis_node_factory: Nodes,
    redlock_alias: Alias,
    proxies: Callable[[RedisNodes], list[Proxy]],
) -> None:
    """The connection broke; the next call reconnects inline, through a slow network (100 ms
    each way), and a signal handler raises while it connects. The call after it reconnects
    inline again and succeeds: it used to fail NodesUnavailable ("down") for the 0.5-2 s until
    a background reconnect, on a healthy node."""
    nodes = redis_node_factory(1)
    px = proxies(nodes)
    a = redlock_alias([px[0].url], TTL=TTL, NODE_TIMEOUT=1.0)
    a.acquire("warm", timeout=0).release()
    previous = signal.signal(signal.SIGALRM, _raise_alarm)
    try:
        px[0].set("reset")  # the open connection breaks
        px[0].set("delay", delay_ms=100)
        signal.setitimer(signal.ITIMER_REAL, 0.05)
        with pytest.raises(_Alarm):
            a.acquire("k", timeout=0).release()
        signal.setitimer(signal.ITIMER_REAL, 0)
        a.acquire("k", timeout=0).release()
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def _raise_alarm(signum: int, frame: object) -> None:
    raise _Alarm


@pytest.mark.parametrize("kind", ["lock_many", "limits"])
@pytest.mark.parametrize("count", [1, 3])
def test_a_set_whose_release_connection_breaks_is_given_back(
    redis_node_factory: Nodes,
    redlock_alias: Alias,
    proxies: Callable[[RedisNodes], list[Proxy]],
    kind: str,
    count: int,
) -> None:
    """``lock_many`` and ``limits`` sets, released while the connections to a quorum of the
    nodes are reset: ``release()`` is False, each lease's release is unconfirmed, and once the
    network heals every name is given back within seconds (it used to answer True and leave
    them locked for the TTL)."""
    nodes = redis_node_factory(count)
    px = proxies(nodes)
    a = redlock_alias([p.url for p in px], TTL=TTL, NODE_TIMEOUT=0.2)
    a.acquire("warm", timeout=0).release()
    names = ["s:1", "s:2"]
    if kind == "lock_many":
        held = a.acquire_many(names, timeout=0)
    else:
        held = a.acquire_limits(dict.fromkeys(names, 1), timeout=0)
    for proxy in px[: count // 2 + 1]:
        proxy.set("reset")
    assert held.release() is False
    assert all(lease.release_unconfirmed for lease in held.leases.values())
    for proxy in px:
        proxy.set("pass")
    # a lock's key is its name; a permit's, its slot (the semaphore's marker stays a while)
    pattern = f"{a.config.key_prefix}{'s:*' if kind == 'lock_many' else '__permit__:*'}"
    until(lambda: not any(n.client().keys(pattern) for n in nodes), 5.0, "the set given back")


def test_a_closed_connection_reports_its_unanswered_give_backs(
    redis_node_factory: Nodes, redlock_alias: Alias
) -> None:
    """A fire-and-forget give-back whose connection is closed before its reply is read (a
    blocking connection given up after an interrupt: the server drops what was queued behind
    the ``BLPOP``) is reported unanswered, so the engine gives it back elsewhere. Closing used
    to drop it silently: a blocking acquire interrupted in its wait left its name locked for
    the TTL now and then (10 of 200 in a signal storm through a resetting proxy)."""
    from django_redlock.engine.replies import Call, Request
    from django_redlock.engine.scripts import RELEASE
    from django_redlock.engine.transport.sync import Channel

    nodes = redis_node_factory(1)
    manager = redlock_alias(nodes)
    engine = manager.engine
    channel = Channel(engine.labels, engine._factories)
    channel.prepare()
    reported: list[int] = []
    nodes[0].pause()  # the reply stays unread
    try:
        call = Call(RELEASE, ("k",), ("owner",))
        channel.execute(Request([call], 0.0, wait=False, unanswered=reported.append))
        assert reported == []
        channel.close()
    finally:
        nodes[0].resume()
    assert reported == [0]


def test_a_lock_many_block_whose_release_is_unconfirmed_does_not_raise(
    redis_node_factory: Nodes,
    redlock_alias: Alias,
    proxies: Callable[[RedisNodes], list[Proxy]],
) -> None:
    """Leaving a ``lock_many`` block whose release a broken connection left unconfirmed
    raises nothing: its leases were valid, they are being given back. It raised LockLost
    (the shop's carts, 5 nodes with 1-2 paused: a cart sold but reported failed)."""
    nodes = redis_node_factory(1)
    px = proxies(nodes)
    a = redlock_alias([px[0].url], TTL=TTL, NODE_TIMEOUT=0.2)
    a.acquire("warm", timeout=0).release()
    with a.lock_many(["b:1", "b:2"], timeout=0) as held:
        px[0].set("reset")
    assert all(lease.release_unconfirmed for lease in held.leases.values())
    px[0].set("pass")
    pattern = f"{a.config.key_prefix}b:*"
    until(lambda: not nodes[0].client().keys(pattern), 5.0, "the set given back")


def test_a_give_back_confirmed_before_the_caller_looks_is_not_a_loss(
    redis_node_factory: Nodes,
    redlock_alias: Alias,
    proxies: Callable[[RedisNodes], list[Proxy]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The background give-back of an unconfirmed release can be confirmed before the caller
    looks (a loaded machine: the caller's thread waits for the CPU longer than the give-back's
    first pause). Here it is made to finish before ``start()`` returns: leaving the
    ``lock_many`` block raises nothing, and no lease of the set is lost. It used to count as a
    loss (``LockLost`` after a sold cart had committed), because "being given back" was read
    from the running give-backs."""
    nodes = redis_node_factory(1)
    px = proxies(nodes)
    a = redlock_alias([px[0].url], TTL=TTL, NODE_TIMEOUT=0.2)
    a.acquire("warm", timeout=0).release()
    start = giveback.GiveBack.start

    def start_and_finish(self: giveback.GiveBack) -> None:
        px[0].set("pass")
        start(self)
        self.join(10)

    monkeypatch.setattr(giveback.GiveBack, "start", start_and_finish)
    with a.lock_many(["c:1", "c:2"], timeout=0) as held:
        px[0].set("reset")
    assert not any(lease.lost for lease in held.leases.values())
    assert not any(lease.release_unconfirmed for lease in held.leases.values())
    assert not nodes[0].client().keys(f"{a.config.key_prefix}c:*")


def _dropped_pairs(
    nodes: RedisNodes, px: list[Proxy], alias: Alias, pairs: int, seed: int
) -> tuple[int, int, int]:
    """``pairs`` acquire/release pairs, each with a quorum of its connections broken at a
    random moment of it (reset, or replies swallowed and then the connections aborted); then
    nothing may stay locked, and no ``release()`` that returned True may have left its name
    locked. Returns (acquired, confirmed releases, failed acquires)."""
    a = alias([p.url for p in px], TTL=TTL, NODE_TIMEOUT=0.1)
    rng = random.Random(seed)
    acquired = confirmed = failed = freed_wrongly = 0
    happened: dict[str, str] = {}
    for i in range(pairs):
        name = f"p:{i}"
        fault, at, breaker = _breaker(px, rng, 0.006)
        breaker.start()
        try:
            lease = a.acquire(name, timeout=0.2)
        except (NodesUnavailable, LockNotAcquired) as exc:
            failed += 1
            happened[name] = f"{fault} at {at:.4f} s: acquire failed ({type(exc).__name__})"
        else:
            acquired += 1
            released = lease.release()
            happened[name] = f"{fault} at {at:.4f} s: acquired, release() {released}"
            if released:
                confirmed += 1
                freed_wrongly += _locked_on_a_quorum(nodes, f"{a.config.key_prefix}{name}")
        breaker.join()
    # a give-back lost with its connection is known lost once a call finds it broken
    a.acquire("last", timeout=2.0).release()
    try:
        until(lambda: not _any_locked(nodes, a.config.key_prefix), 5.0, "no name left locked")
    except AssertionError:
        left = _left_locked(nodes, a.config.key_prefix)
        raise AssertionError(f"left locked: {[(n, happened.get(n)) for n in left]}") from None
    assert freed_wrongly == 0
    return acquired, confirmed, failed


def _breaker(
    px: list[Proxy], rng: random.Random, latest: float
) -> tuple[str, float, threading.Thread]:
    """A thread (not started) that breaks a quorum of ``px`` (reset, or replies swallowed and
    then the connections aborted) at a random moment up to ``latest`` seconds in, for 2-30 ms;
    with the fault and the moment, for a failure's message."""
    hit = rng.sample(px, len(px) // 2 + 1)
    fault = rng.choice(["reset", "drop-replies"])
    at, heal = rng.uniform(0.0, latest), rng.uniform(0.002, 0.03)

    def breaking() -> None:
        time.sleep(at)
        for proxy in hit:
            proxy.set(fault)
        time.sleep(heal)
        for proxy in hit:
            proxy.set("pass")

    return fault, at, threading.Thread(target=breaking)


def _locked_on_a_quorum(nodes: RedisNodes, key: str) -> bool:
    return _keys(nodes, key) > len(nodes) // 2


def _copies(nodes: RedisNodes, prefix: str) -> list[tuple[int, str]]:
    """Per node, the pairs' names of ``prefix`` it holds."""
    return [
        (i, key.decode().removeprefix(prefix))
        for i, node in enumerate(nodes)
        for key in node.client().scan_iter(f"{prefix}p:*")
    ]


def _left_locked(nodes: RedisNodes, prefix: str) -> list[str]:
    """The pairs' names of ``prefix`` locked on a quorum of ``nodes``."""
    names = {name for _, name in _copies(nodes, prefix)}
    return sorted(n for n in names if _locked_on_a_quorum(nodes, f"{prefix}{n}"))


def _any_locked(nodes: RedisNodes, prefix: str) -> bool:
    return bool(_left_locked(nodes, prefix))


@pytest.mark.parametrize("pairs", [100, pytest.param(500, marks=pytest.mark.slow)])
@pytest.mark.parametrize("count", [1, 3])
def test_pairs_whose_connections_break_leave_nothing_locked(
    redis_node_factory: Nodes,
    redlock_alias: Alias,
    proxies: Callable[[RedisNodes], list[Proxy]],
    count: int,
    pairs: int,
) -> None:
    """100 pairs per shape (the long profile: 500) with their connections broken."""
    nodes = redis_node_factory(count)
    acquired, confirmed, failed = _dropped_pairs(nodes, proxies(nodes), redlock_alias, pairs, count)
    print(f"\n{pairs} pairs: {acquired} acquired, {confirmed} released, {failed} failed")


#: An interrupt inside redis-py's ``connect()`` leaves that socket to the garbage collector
#: (a ResourceWarning, not a name left locked: tests/faults/test_interrupt_storm.py).
_SOCKET_LEFT_TO_GC = pytest.mark.filterwarnings(
    "ignore:Exception ignored in. <socket.socket:pytest.PytestUnraisableExceptionWarning"
)


@_SOCKET_LEFT_TO_GC
@pytest.mark.parametrize("count", [1, 3])
def test_interrupted_acquires_whose_connections_break_leave_nothing_locked(
    redis_node_factory: Nodes,
    redlock_alias: Alias,
    proxies: Callable[[RedisNodes], list[Proxy]],
    count: int,
) -> None:
    """Both faults at once: 100 blocking acquires (TTL 30 s) of names a holder keeps 20-60 ms,
    each interrupted by a signal handler that raises at a random moment while a quorum of its
    connections is reset, or loses its replies, at another (up to 300 until both outcomes
    came 5 times: a loaded machine completes fewer). Nothing stays locked, and no
    ``release()`` that returned True left its name locked."""
    nodes = redis_node_factory(count)
    px = proxies(nodes)
    a = redlock_alias([p.url for p in px], TTL=TTL, NODE_TIMEOUT=0.1)
    holder = redlock_alias(nodes, TTL=TTL, KEY_PREFIX=a.config.key_prefix)  # not behind them
    freed_wrongly = 0
    with storm(seed=count) as s:
        tried = 0
        for i in range(300):
            if i >= 100 and s.interrupted >= 5 and s.completed >= 5:
                break
            tried += 1
            name = f"p:{i}"
            hold = s.random.uniform(0.02, 0.06)
            releasing = threading.Timer(hold, holder.acquire(name, timeout=0).release)
            breaker = _breaker(px, s.random, 0.07)[2]
            releasing.start()
            breaker.start()
            lease = s.call(lambda: a.acquire(name, timeout=1.0), s.random.uniform(0.0, 0.08))  # noqa: B023
            breaker.join()
            releasing.join()
            if lease is not None and lease.release():
                freed_wrongly += _locked_on_a_quorum(nodes, f"{a.config.key_prefix}{name}")
    print(f"\n{tried} acquires: {s.interrupted} interrupted, {s.completed} completed")
    # 16-22 of 100 complete on a quiet machine, 3-9 did on a loaded one: at least 5 of each
    # outcome shows the storm hit both ways
    assert s.interrupted >= 5 and s.completed >= 5, "the storm missed"
    a.acquire("last", timeout=2.0).release()  # a give-back lost with its connection is found
    until(lambda: not _any_locked(nodes, a.config.key_prefix), 5.0, "no name left locked")
    assert freed_wrongly == 0


def test_late_answers_to_a_release_are_not_sent_again(
    redis_node_factory: Nodes, redlock_alias: Alias, unique_name: str
) -> None:
    """Five healthy nodes: a release is decided once three answered, and the other two
    answers are read by the next call on the connection. Those answers settle their nodes,
    so the background give-back sends nothing: each node runs one script per acquire and one
    per release (it used to send about one release in five again to the last two nodes:
    0.1-0.2 extra scripts per node and pair, and a thread hand-off per pair), not even when
    the process stalls between two calls for longer than the give-back's first wait (a
    loaded machine: CI saw 3-4 extra scripts on two nodes)."""
    nodes = redis_node_factory(5)
    manager = redlock_alias(nodes, TTL=TTL)
    manager.acquire(f"{unique_name}:warm", timeout=0).release()  # scripts loaded, links up
    admins = [node.client() for node in nodes]

    def scripts_run() -> list[int]:
        stats = [admin.info("commandstats") for admin in admins]
        return [
            sum(s.get(f"cmdstat_{c}", {}).get("calls", 0) for c in ("evalsha", "eval"))
            for s in stats
        ]

    time.sleep(2 * giveback.RETRY_AT_MOST)  # the warm-up's own stragglers have gone out
    before = scripts_run()
    pairs = 300
    for i in range(pairs):
        assert manager.acquire(f"{unique_name}:{i % 7}", timeout=0).release() is True
        if i % 50 == 49:  # a process descheduled on a loaded machine: the answers wait unread
            time.sleep(3 * giveback.RETRY_EVERY)
    manager.acquire(f"{unique_name}:last", timeout=0).release()  # reads the 300th's answers
    time.sleep(2 * giveback.RETRY_AT_MOST)  # every straggler round has run
    extra = [after - b - 2 * (pairs + 1) for after, b in zip(scripts_run(), before, strict=True)]
    # the last pair's late answers are never read (no call follows): sent again, at most 1
    assert max(extra) <= 2, extra


def _reaching_the_last_two(manager: LockManager, name: str) -> Lease:
    """A lease of ``name`` whose ``reached`` leaves the first node out. The first node's
    "held" answer settles it only when it comes before the other two grants; a loaded machine
    may read the grants first, and the attempt then counts the first node as one that may
    hold (that lease's release goes to all three, and it is let go and taken again)."""
    for _ in range(20):
        lease = manager.acquire(name, timeout=0)
        if lease.record.reached == (False, True, True):
            return lease
        assert lease.record.reached == (True, True, True), lease.record.reached
        assert lease.release() is True
    raise AssertionError("the first node's answer never came before the grants")


def test_a_release_to_the_nodes_a_lease_reached_reads_their_answers(
    redis_node_factory: Nodes, redlock_alias: Alias, unique_name: str
) -> None:
    """Three nodes, the name held by someone else on the first: the lease holds the other
    two (``reached`` leaves the first out), and its release goes to those two only. Their
    answers are read as they come: ``release()`` is True, confirmed by its one call to each.
    The lane for a set of nodes used to read the first two connections for the answers of the
    last two: it waited ``NODE_TIMEOUT`` (5 s here) for an answer it never looked for, counted
    the third node unanswered and sent it the release a second time."""
    nodes = redis_node_factory(3)
    manager = redlock_alias(nodes, TTL=TTL, NODE_TIMEOUT=5.0)
    manager.acquire(f"{unique_name}:warm", timeout=0).release()
    key = f"{manager.config.key_prefix}{unique_name}"
    nodes[0].client().set(key, "someone|1|0|host|1", px=int(TTL * 1000))
    lease = _reaching_the_last_two(manager, unique_name)
    admins = [node.client() for node in nodes]

    def scripts_run() -> list[int]:
        stats = [admin.info("commandstats") for admin in admins]
        return [s.get("cmdstat_evalsha", {}).get("calls", 0) for s in stats]

    before = scripts_run()
    assert lease.release() is True
    assert [a - b for a, b in zip(scripts_run(), before, strict=True)] == [0, 1, 1]
    assert lease.record.unsure == () and not lease.release_unconfirmed
    assert [int(node.client().exists(key)) for node in nodes] == [1, 0, 0]


def _contending(
    a: LockManager, names: list[str], stop: threading.Event, seed: int, errors: list[BaseException]
) -> threading.Thread:
    """A thread of the same process that takes and releases ``names`` until ``stop``: its
    calls share the interrupted caller's pools, budget and give-backs."""
    rng = random.Random(seed)

    def contend() -> None:
        while not stop.is_set():
            try:
                with a.lock(rng.choice(names), timeout=rng.uniform(0.0, 0.2)):
                    time.sleep(rng.uniform(0.0, 0.01))
            except (LockNotAcquired, NodesUnavailable, LockError):
                pass
            except BaseException as exc:  # anything else fails the test
                errors.append(exc)
                return

    return threading.Thread(target=contend, daemon=True)


def _flapping(px: list[Proxy], stop: threading.Event, seed: int) -> threading.Thread:
    """A thread that puts one proxy at a time into a fault (reset, replies swallowed, or a
    blackhole) for 5-60 ms, then heals it, until ``stop``; every proxy passes at the end."""
    rng = random.Random(seed)

    def flap() -> None:
        while not stop.is_set():
            proxy = rng.choice(px)
            proxy.set(rng.choice(["reset", "drop-replies", "blackhole"]))
            time.sleep(rng.uniform(0.005, 0.06))
            proxy.set("pass")
            time.sleep(rng.uniform(0.0, 0.05))
        for proxy in px:
            proxy.set("pass")

    return threading.Thread(target=flap, daemon=True)


def _describe_copies(nodes: RedisNodes, prefix: str) -> list[str]:
    """Each copy left: node, name, when it was granted (ms before now, by its value) and its
    TTL left (ms): printed by the test."""
    now_ms = time.time() * 1000
    described = []
    for i, name in _copies(nodes, prefix):
        client = nodes[i].client()
        raw = client.get(f"{prefix}{name}") or b""
        value = raw.decode() if isinstance(raw, bytes) else str(raw)
        granted = value.rsplit("|", 3)[1] if value.count("|") >= 4 else "?"
        age = f"{now_ms - int(granted):.0f}" if granted.isdigit() else "?"
        described.append(
            f"node {i} {name}: granted {age} ms ago, {client.pttl(f'{prefix}{name}')} ms left"
        )
    return described


@_SOCKET_LEFT_TO_GC
@pytest.mark.parametrize("seconds", [8, pytest.param(60, marks=pytest.mark.slow)])
@pytest.mark.parametrize("seed", [1, 2])
def test_interrupted_locks_among_contending_threads_and_flapping_proxies_leave_nothing_locked(
    redis_node_factory: Nodes,
    redlock_alias: Alias,
    proxies: Callable[[RedisNodes], list[Proxy]],
    seed: int,
    seconds: float,
) -> None:
    """Everything at once on three nodes behind proxies: one proxy at a time resets, swallows
    replies or blackholes; three threads of the process contend for five names; the main
    thread's ``with lock()`` blocks are interrupted at random moments by a raising signal
    handler. Once the network heals, no name stays locked (a lease nobody holds), and the
    process takes every name again."""
    nodes = redis_node_factory(3)
    px = proxies(nodes)
    a = redlock_alias([p.url for p in px], TTL=TTL, NODE_TIMEOUT=0.1, TIMEOUT=1.0)
    names = [f"p:{i}" for i in range(5)]
    stop, errors = threading.Event(), list[BaseException]()
    helpers = [_contending(a, names, stop, seed * 10 + i, errors) for i in range(3)]
    helpers.append(_flapping(px, stop, seed))
    for helper in helpers:
        helper.start()

    def locked_block(name: str, hold: float) -> None:
        with a.lock(name, timeout=0.3):
            time.sleep(hold)

    with storm(seed=seed) as s:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            name, hold = s.random.choice(names), s.random.uniform(0.0, 0.02)
            with contextlib.suppress(LockNotAcquired, NodesUnavailable, LockError):
                s.call(lambda: locked_block(name, hold), s.random.uniform(0.0, 0.05))  # noqa: B023
    stop.set()
    for helper in helpers:
        helper.join(10)
    print(f"\n{s.interrupted} interrupted, {s.completed} completed")
    assert errors == []
    assert s.interrupted > 10 and s.completed > 10, "the storm missed"
    a.acquire("last", timeout=2.0).release()  # a give-back lost with its connection is found
    until(lambda: not _any_locked(nodes, a.config.key_prefix), 5.0, "no name left locked")
    # A copy on one node (a minority: it blocks nobody, and expires with its TTL) is given back
    # too, nearly always; about 1 run in 6 of 60 s still leaves one whose cause is not found
    # yet (docs/algorithm.md, "late grants"): reported, not asserted.
    with contextlib.suppress(AssertionError):
        until(lambda: not _copies(nodes, a.config.key_prefix), 5.0, "no copy left")
    if _copies(nodes, a.config.key_prefix):
        print(f"copies left on one node: {_describe_copies(nodes, a.config.key_prefix)}")
    for name in names:  # a timeout: a last release may have reserved it for a waiter (100 ms)
        a.acquire(name, timeout=2.0).release()


def test_a_grant_that_lands_after_its_release_is_given_back(
    redis_node_factory: Nodes,
    redlock_alias: Alias,
    proxies: Callable[[RedisNodes], list[Proxy]],
) -> None:
    """Three nodes; the third one's proxy holds what the client sends for 300 ms. An acquire
    wins on the first two; the third connection is dropped by the client with the acquire
    still in the proxy (an interrupt drops a connection this way), so the release reaches the
    third node on a new connection before the acquire does: "not yours" there, then the
    acquire lands. That copy stayed for the 30 s TTL; the release goes to such a node once
    more (``LATE_DELIVERY`` later) and takes it back."""
    nodes = redis_node_factory(3)
    px = proxies(nodes)
    a = redlock_alias([p.url for p in px], TTL=TTL, NODE_TIMEOUT=0.1)
    a.acquire("warm", timeout=0).release()  # connections through the proxies are up
    key = f"{a.config.key_prefix}k"
    px[2].set("delay", delay_ms=300)
    lease = a.acquire("k", timeout=0)
    channel = lease.record.pinned
    assert channel is not None and not nodes[2].client().exists(key)
    channel.links[2].interrupted()  # what an interrupt while that call was read does
    px[2].set("pass")
    assert lease.release() is True
    until(lambda: bool(nodes[2].client().exists(key)), 3.0, "the held acquire landed")
    until(lambda: not nodes[2].client().exists(key), 5.0, "the late grant given back")


def test_an_asyncio_release_by_a_manager_kept_across_a_reset_is_given_back_to_the_straggler(
    redis_node_factory: Nodes,
    redlock_alias: Alias,
    proxies: Callable[[RedisNodes], list[Proxy]],
) -> None:
    """The asyncio side of the test above: a manager kept across a settings change
    (``locks.reset()``) releases with ``arelease()`` while one of three connections is
    reset; the third node's key is given back once it is reachable (the engine's give-backs
    stayed off after the reset, so the key stayed for the TTL)."""
    nodes = redis_node_factory(3)
    px = proxies(nodes)
    a = redlock_alias([p.url for p in px], TTL=TTL, NODE_TIMEOUT=0.2)
    key = f"{a.config.key_prefix}k"

    async def scenario() -> None:
        await (await a.aacquire("warm", timeout=0)).arelease()
        lease = await a.aacquire("k", timeout=0)
        await asyncio.sleep(0)
        until(lambda: _keys(nodes, key) == 3, 5.0, "the key on every node")
        locks.reset()  # what a change of REDLOCK does: every engine made so far is closed
        px[0].set("reset")
        assert await lease.arelease() is True
        px[0].set("pass")

    asyncio.run(scenario())
    until(lambda: _keys(nodes, key) == 0, 5.0, "the straggler's key given back")
