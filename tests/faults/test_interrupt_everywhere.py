"""An interrupt at every call boundary of a lock call: a signal handler that raises runs
where CPython checks for signals, which includes the entry of every Python function. Here the
exception is raised, deterministically, at the entry of the k-th function a ``with lock()``
or an ``acquire()`` calls, for every k, with a fresh pool each time (so the connection's
checkout is covered too). After each: the thread has no handoff left open, and no connection
is lost from the pool; at the end no name is left locked and the budget of one connection
still serves a call at once (two connections: the calls' and the background give-backs')."""

from __future__ import annotations

import asyncio
import contextlib
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import Any

import pytest

import django_redlock
from django_redlock.engine import giveback, handoff
from django_redlock.exceptions import LockError, NodesUnavailable
from django_redlock.locking.manager import LockManager
from django_redlock.testing import RedisNodes
from tests.support.waiting import until

Nodes = Callable[..., RedisNodes]
Alias = Callable[..., LockManager]

pytestmark = pytest.mark.wire


LIBRARY = str(Path(django_redlock.__file__).parent)


class Interrupt(Exception):
    """What the injected 'signal handler' raises."""


def _raising_at_call(k: int) -> tuple[Callable[..., Any], list[int]]:
    """A trace function raising :class:`Interrupt` at the entry of the ``k``-th function of
    the library called (counting from 1) in this thread; ``seen[0]`` counts the calls. (The
    standard library's own windows, such as ``Condition.wait`` turning an interrupt into
    ``RuntimeError: release unlocked lock``, are CPython's.)"""
    seen = [0]

    def tracer(frame: FrameType, event: str, arg: Any) -> None:
        if event == "call" and LIBRARY in frame.f_code.co_filename:
            seen[0] += 1
            if seen[0] == k:
                raise Interrupt(frame.f_code.co_name)

    return tracer, seen


def _out_of_pool(pools: Any) -> list[int]:
    with pools._mutex:
        return [id(c) for c in pools._all if c not in pools._free]


def _keys(nodes: RedisNodes, prefix: str) -> list[bytes]:
    """The keys on ``nodes`` that start with ``prefix`` (a key prefix and the names' start)."""
    return [key for node in nodes for key in node.client().keys(f"{prefix}*")]


# an interrupt raised in a generator being closed (a plan, a generator expression) is
# "ignored" by Python, as a real signal handler's would be there
#: the kinds of lease: ``acquire()``'s arguments, and those of a lease the kind's leftover
#: would keep out (a read lease only keeps out a writer)
KINDS: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {
    "lock": ({}, {}),
    "permit": ({"permits": 1}, {"permits": 1}),
    "read": ({"rw": "read"}, {"rw": "write"}),
    "write": ({"rw": "write"}, {"rw": "write"}),
}


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
@pytest.mark.parametrize("count", [1, 3])
@pytest.mark.parametrize(
    ("shape", "kind"),
    [
        ("with lock()", "lock"),
        ("acquire()", "lock"),
        ("acquire()", "permit"),
        ("acquire()", "read"),
        ("acquire()", "write"),
    ],
)
def test_an_interrupt_at_every_call_boundary_leaves_nothing_behind(
    redis_node_factory: Nodes,
    redlock_alias: Alias,
    unique_name: str,
    count: int,
    shape: str,
    kind: str,
) -> None:
    """(A read lease interrupted as its record was made, before its kind was set on it, was
    given back as a lock: its release failed ``WRONGTYPE`` on the readers' set, and the read
    lease stayed for its TTL; found by an attack.)"""
    nodes = redis_node_factory(count)
    manager = redlock_alias(nodes, MAX_CONNECTIONS=2, TTL=30)
    prefix = manager.config.key_prefix
    pools = manager.engine.pools
    options, kept_out = KINDS[kind]
    busy = manager.acquire(f"{unique_name}:busy", timeout=0, **kept_out)
    names = [f"{unique_name}:busy"]
    at_exit: list[str] = []

    def call(name: str) -> None:
        if shape == "with lock()":
            with manager.lock(name, timeout=0):
                pass
        else:
            lease = manager.acquire(name, timeout=0, **options)
            try:
                lease.release()
            finally:
                # interrupted as release() was called, before its first line: the caller's
                # own window (it holds the lease), closed as a try/finally would
                if not lease.released:
                    lease.release()

    interrupted = k = 0
    last: BaseException | None = None
    while True:
        k += 1
        pools._reap(float("inf"))  # a fresh pool: the checkout opens a connection
        # the name busy on even rounds: the failed acquire's cleanup is interrupted too
        name = f"{unique_name}:busy" if k % 2 == 0 else f"{unique_name}:{k}"
        names.append(name)
        tracer, seen = _raising_at_call(k // 2 + 1)
        sys.settrace(tracer)
        try:
            call(name)
        except (Interrupt, LockError) as exc:
            last = exc
            if isinstance(exc, Interrupt) and exc.args == ("__exit__",):
                # the one window left open (docs/algorithm.md, "Waiting without polling"): the
                # first instruction of the block's __exit__; that lease waits for its TTL
                names.remove(name)
                at_exit.append(name)
        finally:
            sys.settrace(None)
        if seen[0] > k // 2:
            interrupted += 1
        assert handoff.current() is None, k  # left open, it swallowed every later grant
        # no channel left out of the pool with its slot (a background give-back may be
        # using one for a moment)
        until(lambda: _out_of_pool(pools) == [], 0.5, f"every channel pooled after {last!r}")
        if seen[0] <= k // 2 and k % 2 == 1:  # ran to its end without an interrupt
            break
    assert interrupted > 20
    busy.release()
    # every name free again for what a leftover of its kind would keep out
    until(lambda: _all_free(manager, names, kept_out), 5.0, "every interrupted grant given back")
    if kind == "lock":
        left = {key.decode() for key in _keys(nodes, f"{prefix}{unique_name}:")}
        assert left <= {f"{prefix}{name}" for name in at_exit}
    # a lost connection: "no free connection in time" (NodesUnavailable) after 5 s
    manager.acquire(f"{unique_name}:after", timeout=0).release()


def _all_free(manager: LockManager, names: list[str], options: dict[str, Any]) -> bool:
    """Whether a lease with ``options`` can be taken on each of ``names`` at once."""
    for name in dict.fromkeys(names):
        try:
            manager.acquire(name, timeout=0, **options).release()
        except LockError:
            return False
    return True


# an interrupt inside redis-py's connect (between its socket() and the assignment that lets
# its disconnect() find the socket) leaves that socket to the garbage collector, which closes
# it with a ResourceWarning: redis-py's window, not a lock held or a slot spent
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
@pytest.mark.filterwarnings("ignore::ResourceWarning")
def test_an_interrupt_while_waiting_for_a_connection_is_the_callers_own(
    redis_node_factory: Nodes, redlock_alias: Alias, unique_name: str
) -> None:
    """The connection held by another thread's calls: the main thread's acquires wait for
    the connection, under a hail of raising ``SIGALRM`` handlers. Each interrupt reaches the
    caller as its own exception (a ``KeyboardInterrupt`` stays one), never as
    ``RuntimeError: release unlocked lock`` from a broken ``threading.Event`` wait (it did),
    and afterwards a plain call gets the connection at once."""
    from tests.support.signal_storm import Hail, Interrupted

    nodes = redis_node_factory(1)
    # two: the calls' connection, and the background give-backs' of interrupted grants
    manager = redlock_alias(nodes, MAX_CONNECTIONS=2, TTL=30)
    stop = threading.Event()

    def hog() -> None:  # keeps the calls' connection busy most of the time
        while not stop.is_set():
            with contextlib.suppress(LockError, NodesUnavailable):
                manager.acquire(f"{unique_name}:hog", timeout=0).release()

    other = threading.Thread(target=hog, daemon=True)
    other.start()
    foreign: list[BaseException] = []

    def step() -> None:
        try:
            manager.acquire(f"{unique_name}:main", timeout=1).release()
        except Interrupted:
            raise  # the hail counts it
        except LockError:
            pass
        except Exception as exc:  # anything but the hail's own interrupt
            foreign.append(exc)

    hail = Hail(0.0002, 2.0)
    try:
        hail.run(step)
    finally:
        stop.set()
        other.join(10)
    assert hail.interrupted > 100
    assert [repr(exc) for exc in foreign] == []
    # a lost connection: "no free connection in time" (NodesUnavailable) after 5 s
    manager.acquire(f"{unique_name}:after", timeout=0).release()


@pytest.mark.parametrize("count", [1, 3])
@pytest.mark.parametrize("where", ["aacquire", "async with alock()"])
def test_an_interrupt_after_an_asyncio_grant_gives_it_back(
    redis_node_factory: Nodes,
    redlock_alias: Alias,
    monkeypatch: pytest.MonkeyPatch,
    count: int,
    where: str,
) -> None:
    """A signal handler raising in the event loop's thread after the nodes granted an
    ``aacquire()`` (as its lease is made) or an ``async with alock()`` (as the block enters
    it), before the caller holds it: the grant is given back from the background, not left
    for its TTL of 30 s (found by an attack; the blocking calls had their handoff already)."""
    from django_redlock.locking import block

    nodes = redis_node_factory(count)
    manager = redlock_alias(nodes, TTL=30)
    prefix = manager.config.key_prefix
    owner, method = (LockManager, "_won") if where == "aacquire" else (block.LockBlock, "_entered")
    real = getattr(owner, method)
    armed = [True]

    def interrupted(self: Any, *args: Any, **kwargs: Any) -> Any:
        if armed[0]:
            armed[0] = False
            if where != "aacquire":
                real(self, *args, **kwargs)  # entered, then interrupted before returning
            raise Interrupt(method)
        return real(self, *args, **kwargs)

    monkeypatch.setattr(owner, method, interrupted)

    async def main() -> None:
        with pytest.raises(Interrupt):
            if where == "aacquire":
                await manager.aacquire("lock:granted", timeout=0)
            else:
                async with manager.alock("lock:granted", timeout=0):
                    pass
        assert handoff.current() is None  # closed: later grants are not noted there

    asyncio.run(main())
    until(lambda: _keys(nodes, f"{prefix}lock:") == [], 5.0, "the interrupted grant given back")
    manager.acquire("lock:granted", timeout=0).release()


#: ``LeaseRecord.kind`` of each kind of :data:`KINDS`
KINDS_OF = {"lock": "", "permit": "permit", "read": "read", "write": "write"}


@pytest.mark.parametrize("count", [1, 3])
@pytest.mark.parametrize("kind", ["permit", "read", "write"])
def test_a_grant_interrupted_as_its_record_is_made_is_given_back_as_its_kind(
    redis_node_factory: Nodes,
    redlock_alias: Alias,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    count: int,
    kind: str,
) -> None:
    """A signal handler raising the moment a lease's record is made (and noted on the
    caller's handoff): the handoff gives the grant back as what it is. The record used to get
    its kind after it was made, so a read lease was given back as a lock: its release failed
    ``WRONGTYPE`` on the readers' set (found by an attack, which also saw it sent again from
    the background until the lease's validity ended)."""
    from django_redlock.engine.state import LeaseRecord
    from django_redlock.locking import interrupted

    nodes = redis_node_factory(count)
    manager = redlock_alias(nodes, TTL=30)
    manager.acquire("warm", timeout=0).release()  # the nodes joined: the grant is the lane's
    options, kept_out = KINDS[kind]
    real = LeaseRecord.__post_init__
    armed = [True]

    def noted_then_interrupted(self: LeaseRecord) -> None:
        real(self)
        if armed[0]:
            armed[0] = False
            raise Interrupt("__post_init__")

    monkeypatch.setattr(LeaseRecord, "__post_init__", noted_then_interrupted)
    given_back: list[str] = []
    real_release = interrupted._release

    def noting(opened: handoff.Handoff, *args: Any, **kwargs: Any) -> None:
        given_back.extend(record.kind for record in opened.records)
        real_release(opened, *args, **kwargs)

    monkeypatch.setattr(interrupted, "_release", noting)
    caplog.set_level("DEBUG", logger="django_redlock")
    with pytest.raises(Interrupt):
        manager.acquire("granted", timeout=0, **options)
    assert not armed[0]
    assert given_back == [KINDS_OF[kind]]  # given back as what it is (was: as a lock, '')
    until(lambda: _all_free(manager, ["granted"], kept_out), 5.0, "the grant given back")
    state = manager.engine.state

    def giving_back() -> list[str]:
        running = list(giveback.GiveBack.running.values())
        return [g._lease.name for g in running if g._state is state]

    # nothing left sending a release again (it was: until the validity's end, 30 s)
    until(lambda: giving_back() == [], 3.0, "no give-back left running")
    refused = [r.getMessage() for r in caplog.records if "not confirmed" in r.getMessage()]
    assert refused == []


SET_CALLS = ["acquire_many()", "with lock_many()", "acquire_limits()", "with limits()"]


@pytest.mark.parametrize("flavour", ["sync", "asyncio"])
@pytest.mark.parametrize("count", [1, 3])
@pytest.mark.parametrize("shape", SET_CALLS)
def test_a_set_interrupted_after_its_grants_is_given_back(
    redis_node_factory: Nodes,
    redlock_alias: Alias,
    monkeypatch: pytest.MonkeyPatch,
    count: int,
    shape: str,
    flavour: str,
) -> None:
    """A signal handler raising once a set's grants came back, before its caller holds it
    (as its leases are made, or as the block records them): the set is given back on every
    node at once, and the block leaves nothing entered. It stayed held for its TTL (found by
    an attack: 4-13 sets in 300-500 random interrupts were left on every node)."""
    from django_redlock.locking import context

    nodes = redis_node_factory(count)
    manager = redlock_alias(nodes, TTL=30)
    manager.acquire("warm", timeout=0).release()
    names = ["a", "b"]
    block = shape.startswith("with")
    where = "push_set" if block else "activate_all"
    real = getattr(context, where)
    armed = [True]

    def interrupted_there(*args: Any) -> Any:
        if armed[0]:
            armed[0] = False
            raise Interrupt(where)
        return real(*args)

    monkeypatch.setattr(context, where, interrupted_there)

    def taking() -> Any:
        if "many" in shape:
            return manager.lock_many(names, timeout=0) if block else None
        return manager.limits(dict.fromkeys(names, 1), timeout=0) if block else None

    if flavour == "sync":
        with pytest.raises(Interrupt):
            if block:
                with taking():
                    pass
            elif "many" in shape:
                manager.acquire_many(names, timeout=0)
            else:
                manager.acquire_limits(dict.fromkeys(names, 1), timeout=0)
    else:

        async def take() -> None:
            if block:
                async with taking():
                    pass
            elif "many" in shape:
                await manager.aacquire_many(names, timeout=0)
            else:
                await manager.aacquire_limits(dict.fromkeys(names, 1), timeout=0)

        with pytest.raises(Interrupt):
            asyncio.run(take())
    assert not armed[0]
    assert handoff.current() is None
    assert not any(context.held(manager.alias, name) for name in names)
    held = _held_keys(nodes, manager.config.key_prefix, [] if "limits" in shape else names)
    until(lambda: held() == [], 5.0, "the set given back on every node")
    assert _all_free(manager, names, {"permits": 1} if "limits" in shape else {})


def _held_keys(nodes: RedisNodes, prefix: str, names: list[str]) -> Callable[[], list[bytes]]:
    """What still holds a name on ``nodes``: the lock key of one of ``names``, or a permit's
    slot key of ``a`` or ``b`` (a semaphore's marker outlives its permits, by design)."""
    wanted = {f"{prefix}{name}".encode() for name in names}

    def held() -> list[bytes]:
        keys = _keys(nodes, prefix)
        return [k for k in keys if k in wanted or (b"__permit__" in k and k[-2:] in (b":a", b":b"))]

    return held
