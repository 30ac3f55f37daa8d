"""An ``@lock`` generator left suspended and then finalized by the garbage collector. A
collection runs in whichever thread happened to allocate, at whatever point, perhaps inside
the library with one of its own locks held (a pool's, while it picks a connection); the
generator's close releases its lease, and that may need the same lock (a node that has not
answered a call yet makes the release open another connection). The close must never run
there: it runs in a thread of its own, the name is free soon after, its body's ``finally``
run."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest

from django_redlock.testing import RedisNodes
from tests.conftest import SESSION_ALIASES

#: Run in a child process: a hang there is a timeout here, not a hung test run.
_CHILD = """
import gc, json, os, signal, sys, time
import django
from django.conf import settings

urls, pids, name = json.loads(sys.argv[1]), json.loads(sys.argv[2]), sys.argv[3]
settings.configure(
    REDLOCK={"default": {"NODES": urls, "KEY_PREFIX": "c:", "TTL": 5.0, "NODE_TIMEOUT": 0.1}},
    INSTALLED_APPS=["django_redlock"],
    USE_TZ=True,
)
django.setup()
from django_redlock import locks
from django_redlock.exceptions import LockError

manager = locks["default"]
manager.acquire(name + ":warm", timeout=15).release()  # new nodes may vote only later
cleaned = []

@manager.lock("{0}", timeout=0)
def rows(key):
    try:
        yield 1
        yield 2
    finally:
        cleaned.append(key)

it = rows(name)
assert next(it) == 1
cycle = [it]
cycle.append(cycle)  # only the collector frees it
del it, cycle
for pid in pids:  # no quorum now: every connection that asks owes a reply
    os.kill(pid, signal.SIGSTOP)
try:
    manager.acquire(name + ":other", timeout=0)
except LockError:
    pass
gc.disable()  # the collection below is the only one
with manager.engine.pools._mutex:  # where a collection in the pool's checkout runs
    gc.collect()
gc.enable()
for pid in pids:
    os.kill(pid, signal.SIGCONT)
deadline = time.monotonic() + 15
while True:
    try:
        manager.acquire(name, timeout=0, ttl=1).release()
        break
    except LockError:
        if time.monotonic() > deadline:
            raise SystemExit("the name was never released")
        time.sleep(0.05)
print(json.dumps(cleaned))
"""


@pytest.mark.parametrize("count", [1, 3])
def test_a_collected_generator_is_closed_in_a_thread_of_its_own(
    redis_node_factory: object, count: int, unique_name: str
) -> None:
    """A node (or two of three) paused, so the connection the last call used owes a reply,
    and a collection runs while the pool's lock is held (as inside its checkout): before,
    the generator's release waited for that lock for good; now the collection returns, the
    body's ``finally`` runs, and the name is free once the nodes answer again."""
    nodes: RedisNodes = redis_node_factory(count)  # type: ignore[operator]
    pids = [node.pid for node in nodes][-max(1, count - 1) :]
    args = [json.dumps([node.url for node in nodes]), json.dumps(pids), unique_name]
    try:
        result = subprocess.run(
            [sys.executable, "-c", _CHILD, *args],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
    except subprocess.TimeoutExpired:
        for node in nodes:
            node.resume()
        pytest.fail("the collection never returned (the release waited for the pool's lock)")
    assert result.returncode == 0, result.stderr[-3000:]
    assert json.loads(result.stdout.strip().splitlines()[-1]) == [unique_name]


def test_a_finalizer_run_by_a_collection_releases_in_a_thread_of_its_own() -> None:
    """The routing the lease kept until a commit uses too (its callback's finalizer releases
    it on a rollback): a finalizer the collector runs hands the job to a new thread; one run
    because the last reference went (a rollback discarding the callback) runs it at once."""
    import gc
    import threading
    import weakref

    from django_redlock.locking import collected

    ran: list[int] = []
    done = threading.Event()

    def job() -> bool:
        ran.append(threading.get_ident())
        done.set()
        return True

    class Held:
        pass

    freed = Held()
    weakref.finalize(freed, collected.outside_collection, job)
    del freed  # no cycle: freed at once, in this thread
    assert ran == [threading.get_ident()]

    done.clear()
    cyclic = Held()
    cyclic.me = cyclic  # type: ignore[attr-defined]
    weakref.finalize(cyclic, collected.outside_collection, job)
    del cyclic
    gc.collect()
    assert done.wait(10)
    assert len(ran) == 2 and ran[1] != threading.get_ident()
    assert not collected.in_collection()


_FORKED = """
import gc, json, os, sys
import django
from django.conf import settings

alias, name = json.loads(sys.argv[1]), sys.argv[2]
settings.configure(REDLOCK={"default": alias}, INSTALLED_APPS=["django_redlock"], USE_TZ=True)
django.setup()
from django_redlock import locks
from django_redlock.exceptions import LockError

manager = locks["default"]

@manager.lock("{0}", timeout=0)
def rows(key):
    yield 1
    yield 2

for how in ("dropped", "collected", "closed"):
    it = rows(name)
    assert next(it) == 1
    pid = os.fork()
    if pid == 0:  # the child: the generator and its lease are the parent's
        code = 0
        try:
            if how == "closed":
                it.close()
            else:
                cycle = [it] if how == "collected" else []
                cycle.append(cycle)
                del it, cycle
                gc.collect()
            try:
                manager.acquire(name, timeout=0).release()
                code = 3  # the parent's lease was let go by the child
            except LockError:
                pass
        finally:
            sys.stderr.flush()
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0, (how, status)
    it.close()  # the parent's release
    manager.acquire(name, timeout=0).release()
print("ok")
"""


def test_a_generator_inherited_over_a_fork_is_dropped_quietly_in_the_child(
    unique_name: str,
) -> None:
    """A child process that drops, leaves to the collector or closes an ``@lock`` generator
    it inherited, suspended, from its parent: the lease is the parent's, so nothing is sent
    and the parent still holds the name, and nothing is reported either (it printed
    "Exception ignored ... LockError: ... acquired by the parent process before a fork")."""
    result = subprocess.run(
        [sys.executable, "-c", _FORKED, json.dumps(SESSION_ALIASES["multi"]), unique_name],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "Exception ignored" not in result.stderr, result.stderr[-3000:]
    assert "Traceback" not in result.stderr, result.stderr[-3000:]


@pytest.mark.parametrize("alias", ["default", "multi"])
def test_a_collected_generators_finally_runs_while_its_lease_is_held(
    alias: str, unique_name: str
) -> None:
    """The body of a collected generator is closed in place, its ``finally`` run while the
    lease is still held; only the release goes to a thread of its own, after it. (Closing
    the body in that thread too raced the collector, which closes the body itself, in place:
    another thread took the name while the ``finally`` still ran, and "generator already
    executing" was reported.)"""
    import gc
    import threading
    import time

    from django_redlock import locks
    from django_redlock.exceptions import LockNotAcquired

    manager = locks[alias]
    in_finally = threading.Event()
    finally_ended = threading.Event()
    taken_during: list[float] = []
    stop = threading.Event()

    @manager.lock("{0}", timeout=0)
    def rows(name: str, holder: list[Any]) -> Iterator[int]:
        try:
            yield 1
        finally:
            in_finally.set()
            time.sleep(0.3)
            finally_ended.set()

    def contend() -> None:
        in_finally.wait(10)
        while not stop.is_set():
            try:
                with manager.lock(unique_name, timeout=0):
                    if not finally_ended.is_set():
                        taken_during.append(time.monotonic())
                    stop.set()
            except LockNotAcquired:
                time.sleep(0.002)

    other = threading.Thread(target=contend)
    other.start()
    holder: list[Any] = []
    it = rows(unique_name, holder)
    holder.append(it)
    assert next(it) == 1
    del it, holder
    gc.collect()
    assert finally_ended.is_set()
    other.join(10)
    stop.set()
    assert not other.is_alive()
    assert taken_during == [], "another thread held the name while the finally still ran"


_EXITS = """
import json, sys
import django
from django.conf import settings

alias, name, shape, how = json.loads(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]
settings.configure(REDLOCK={"default": alias}, INSTALLED_APPS=["django_redlock"], USE_TZ=True)
django.setup()
from django_redlock import locks

manager = locks["default"]

@manager.lock("{0}", timeout=5)
def rows(key, holder):
    yield 1

holder = []
KEPT = rows(name, holder)
next(KEPT)
if shape == "cycle":
    holder.append(KEPT)
    del KEPT, holder
print("holding", flush=True)
if how == "exit":
    sys.exit(0)
if how == "raise":
    raise RuntimeError("the process ends with an exception")
"""


@pytest.mark.parametrize("how", ["end", "exit", "raise"])
@pytest.mark.parametrize("shape", ["cycle", "global"])
def test_a_process_exits_with_a_suspended_generator_and_lets_its_name_go(
    shape: str, how: str, unique_name: str
) -> None:
    """A process that ends (its script's end, ``sys.exit``, an unhandled exception) with a
    suspended ``@lock`` generator, in a reference cycle or in a global: it exits, and the
    name is free at once, not after its TTL. A release whose late nodes would have gone to
    a background thread at that moment waited for that thread to start, which no thread
    does any more while the interpreter exits: the process never ended."""
    from django_redlock import locks

    result = subprocess.run(
        [
            sys.executable,
            "-c",
            _EXITS,
            json.dumps(SESSION_ALIASES["five"]),
            unique_name,
            shape,
            how,
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert "holding" in result.stdout, result.stderr[-3000:]
    with locks["five"].lock(unique_name, timeout=0):  # free at once: its TTL is 5 s
        pass
