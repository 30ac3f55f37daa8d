"""Background threads started while a signal handler raises in the main thread (a signal
storm, ``tests/support/signal_storm.py``): ``Thread.start()`` is not safe there (the new
thread dies with ``KeyError`` when the interrupt lands after it exists; its wait for the
thread can end in ``RuntimeError: release unlocked lock``). Every start the library makes
goes through :mod:`django_redlock.engine.starter`: a start handed over is made, and a
reconnect is never recorded as running when none runs."""

from __future__ import annotations

import queue
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
import redis

from django_redlock.engine import giveback, start_thread, starter
from django_redlock.engine.state import AliasState, LeaseRecord
from django_redlock.engine.transport.link import Link
from tests.support.signal_storm import Hail, Interrupted
from tests.support.waiting import until

#: How long each hail lasts.
SECONDS = 2.0


@pytest.fixture
def thread_failures() -> Iterator[list[str]]:
    """What threads and finalizers raised meanwhile (a thread that died before it ran), but
    the hail's own exceptions in finalizers."""
    failures: list[str] = []
    previous_thread, previous_unraisable = threading.excepthook, sys.unraisablehook

    def on_thread(args: Any) -> None:
        failures.append(f"thread: {args.exc_type.__name__}: {args.exc_value}")

    def on_unraisable(args: Any) -> None:
        if isinstance(args.exc_value, Interrupted):
            return  # the hail's own, raised in a finalizer (Python ignores those)
        failures.append(f"unraisable: {type(args.exc_value).__name__}: {args.exc_value}")

    threading.excepthook, sys.unraisablehook = on_thread, on_unraisable
    try:
        yield failures
    finally:
        threading.excepthook, sys.unraisablehook = previous_thread, previous_unraisable


def test_every_start_handed_over_runs_its_thread(thread_failures: list[str]) -> None:
    """Starts interrupted at random moments: each start that returned ran its thread, none
    ran twice, and no thread died before running (plain ``Thread.start()`` fails this)."""
    ran: queue.SimpleQueue[int] = queue.SimpleQueue()
    made = [0]

    def step() -> None:
        made[0] += 1
        start_thread(threading.Thread(target=ran.put, args=(made[0],), daemon=True))

    hail = Hail(0.0003, SECONDS)  # about as long as a start: half of them are interrupted
    returned = hail.run(step)
    print(f"\n{made[0]} starts: {hail.interrupted} interrupted, {returned} returned")
    assert hail.interrupted > 20, "the storm never interrupted a start: it tests nothing"

    seen: set[int] = set()

    def drained() -> bool:
        while not ran.empty():
            i = ran.get()
            assert i not in seen, f"thread {i} ran twice"
            seen.add(i)
        return len(seen) >= returned

    until(drained, 30, f"{returned} starts returned, fewer threads ran")
    assert len(seen) <= made[0]
    assert thread_failures == []


def _port_nobody_listens_on() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_an_interrupted_reconnect_start_is_never_recorded_as_running(
    thread_failures: list[str],
) -> None:
    """A link to a node that is down, asked for a background reconnect over and over while a
    storm interrupts it: afterwards no reconnect is recorded as running when none runs (a
    recorded one that never started would keep the link from ever reconnecting)."""
    port = _port_nobody_listens_on()
    link = Link(
        f"redis://127.0.0.1:{port}/0",
        lambda: redis.Connection(host="127.0.0.1", port=port, socket_connect_timeout=0.5),
    )

    def step() -> None:
        link._retry_at = 0.0  # due at once, every time
        link.usable()

    hail = Hail(0.00005, SECONDS)
    returned = hail.run(step)
    # no reconnect is due from now on: a request still queued for the starter returns at
    # once; a start that an interrupt left recorded as running stays recorded all the same.
    # (A link queued one request per call: over a million in the storm's two seconds, which
    # took over 120 s to drain on a loaded machine. One waits at a time now.)
    link._retry_at = float("inf")
    print(f"\n{returned + hail.interrupted} reconnect requests: {hail.interrupted} interrupted")
    assert hail.interrupted > 20, "the storm never interrupted a request: it tests nothing"

    def settled() -> bool:
        return not any(t.name.startswith("redlock-connect") for t in threading.enumerate())

    # the starter runs its jobs in order: once this one ran, every reconnect handed to it
    # has been started (a start still queued when the threads were counted, on a loaded
    # machine, set the flag right after: the check raced it)
    drained = threading.Event()
    starter.call_soon(drained.set)
    assert drained.wait(30), "the starter never got to the end of its queue"
    until(settled, 30, "reconnect threads still running")
    assert not link._reconnecting, "a reconnect is recorded as running, and none runs"
    assert thread_failures == []


def test_a_link_that_is_down_queues_one_reconnect_at_a_time(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Callers asking a link to a node that is down, in a tight loop, while the starter is
    busy: one background reconnect waits in its queue, not one per call (a million in two
    seconds once, which took minutes to drain); the reconnect runs once the starter is free.
    The link's own jobs are counted: the starter is the process's, and other engines of a
    test worker queue jobs of their own meanwhile."""
    port = _port_nobody_listens_on()
    link = Link(
        f"redis://127.0.0.1:{port}/0",
        lambda: redis.Connection(host="127.0.0.1", port=port, socket_connect_timeout=0.5),
    )
    busy, ran = threading.Event(), threading.Event()
    real_call_soon = starter.call_soon
    reconnects = [0]

    def counting(job: Any) -> None:
        if job == link._start_reconnect:
            reconnects[0] += 1
        real_call_soon(job)

    monkeypatch.setattr(starter, "call_soon", counting)
    starter.call_soon(lambda: busy.wait(30))
    try:
        for _ in range(10_000):
            link._retry_at = 0.0  # due at once, every time
            link.usable()
        queued = reconnects[0]
    finally:
        busy.set()
    assert 1 <= queued <= 2  # one reconnect (again after REQUEUE_AFTER on a slow machine)
    starter.call_soon(ran.set)
    assert ran.wait(30)
    until(lambda: not link._reconnecting, 30, "the reconnect never ended")
    assert "ConnectionRefusedError" in link.last_error or "Connection refused" in link.last_error


def test_every_give_back_begun_sends_its_release(thread_failures: list[str]) -> None:
    """Background give-backs begun while a storm interrupts the main thread: every one whose
    ``begin()`` returned sends its release (here to a sender that records it and confirms),
    and none is left recorded as running. ``Thread.start()`` in the caller's thread (as
    ``GiveBack`` did) loses some: the new thread dies with ``KeyError`` before it runs, the
    name stays locked for its TTL and the lease reads "unconfirmed" for good."""
    state = AliasState("t:", 0.05, 0.01, 5.0)
    sent: queue.SimpleQueue[str] = queue.SimpleQueue()

    def send(make_plan: Any) -> bool:  # stands in for the pool: no node is involved
        sent.put(threading.current_thread().name)
        return True

    made: list[LeaseRecord] = []

    def step() -> None:
        lease = LeaseRecord(f"n{len(made)}", "k", "o", 1, 5.0, time.monotonic() + 5.0)
        lease.unsure = (0,)
        made.append(lease)
        giveback.GiveBack(state, lease, send, quiet=True).begin()

    hail = Hail(0.0003, SECONDS)
    returned = hail.run(step)
    print(f"\n{len(made)} give-backs: {hail.interrupted} interrupted, {returned} returned")
    assert hail.interrupted > 20, "the storm never interrupted a start: it tests nothing"
    until(lambda: sent.qsize() >= returned, 30, f"{returned} begun, fewer sent")
    until(lambda: not giveback.GiveBack.running, 30, "give-backs recorded as running")
    assert thread_failures == []


def test_a_closed_engine_starts_no_straggler_thread() -> None:
    """A release a quorum confirmed with nodes left to send it to, on an engine that is
    closed (a settings change closed it while the release ran): no worker is started, since
    it would stop at once (each such release used to start a thread of its own)."""
    state = AliasState("t:", 0.05, 0.01, 5.0)
    state.closed = True
    lease = LeaseRecord("k", "t:lock:k", "o", 1, 5.0, time.monotonic() + 5.0)
    lease.unsure = (2,)
    lease.settled = True
    giveback.Stragglers.add(state, lease, lambda make_plan: True)
    assert state.stragglers is None


#: Run in a child process (a hang there is a timeout here, not a hung test run): a thread
#: start made by a finalizer that the garbage collector ran while this thread was inside
#: threading's own bookkeeping (``threading.enumerate()`` allocates under its registry lock).
_START_INSIDE_THREADINGS_REGISTRY = """
import threading
from django_redlock.engine import starter

starter.start_thread(threading.Thread(target=lambda: None))  # the starter thread runs
ran = threading.Event()
with threading._active_limbo_lock:  # what a finalizer run inside enumerate() holds
    starter.start_thread(threading.Thread(target=ran.set))
assert ran.wait(10)
print("started")
"""

#: A release that a finalizer ran while this thread was adding another to the stragglers
#: (``Stragglers.add`` builds a thread under its lock: an allocation, so a collection).
_STRAGGLER_ADDED_INSIDE_ANOTHER_ADD = """
import threading, time
from django_redlock.engine import giveback
from django_redlock.engine.state import AliasState, LeaseRecord

state = AliasState("t:", 0.05, 0.01, 5.0)
for where in ("main", "thread"):
    def add():
        lease = LeaseRecord("k", "t:lock:k", "o", 1, 5.0, time.monotonic() + 5.0)
        lease.unsure, lease.settled = (2,), True
        with giveback.Stragglers._lock:
            giveback.Stragglers.add(state, lease, lambda make_plan: True)
    if where == "main":
        add()
    else:
        worker = threading.Thread(target=add)
        worker.start()
        worker.join()
    assert state.stragglers is not None
print("added")
"""


@pytest.mark.parametrize(
    "script", [_START_INSIDE_THREADINGS_REGISTRY, _STRAGGLER_ADDED_INSIDE_ANOTHER_ADD]
)
def test_a_finalizer_run_inside_threading_or_a_straggler_add_does_not_hang(script: str) -> None:
    """An unclosed ``@lock`` generator that the garbage collector finalizes releases its
    lease wherever the collection happened to run. Two places hung for good: inside
    ``threading.enumerate()`` in the main thread (the start handed to the starter thread
    waited for threading's registry lock, held by the thread waiting for the start), and
    inside ``Stragglers.add`` (its lock, held by the same thread, taken again)."""
    try:
        result = subprocess.run(
            [sys.executable, "-c", script], capture_output=True, text=True, timeout=20, check=False
        )
    except subprocess.TimeoutExpired:
        pytest.fail("the start or the add never returned (a hang)")
    assert result.returncode == 0, result.stderr
