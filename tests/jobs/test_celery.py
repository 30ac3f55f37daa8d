"""``django_redlock.contrib.celery.LockedTask`` with a real Celery worker.

One prefork worker (two child processes) runs for the whole module, on a redis-server of this
module (broker and results) against the session's lock nodes and test database. Nothing is
mocked: the tests send tasks, signal the worker's child processes (SIGKILL, SIGSTOP) and read
what the runs left in the database and in Redis.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import kombu.pools
import pytest
from celery import Celery, chain, chord, group
from celery.exceptions import ChordError
from celery.signals import before_task_publish

from django_redlock import locks
from django_redlock.contrib.celery import LockedTask
from django_redlock.exceptions import LockError, LockNotAcquired, NodesUnavailable
from django_redlock.locking import context
from testproject.inventory.demo_run import stop_group
from testproject.inventory.models import Product
from tests.jobs.celery_app import (
    app,
    collect,
    limited,
    locked_noop,
    must_run,
    once,
    plain_noop,
    raising,
    record_store,
    serial,
    skipping,
    sleeper,
    stalled_write,
    tick,
)
from tests.support.waiting import pttls

ROOT = Path(__file__).resolve().parent.parent.parent
#: the worker writes to the test database, so each test commits (and is flushed after)
in_database = pytest.mark.django_db(transaction=True)
WAIT = 30.0


class Worker:
    """The worker process of this module and its log."""

    def __init__(self, process: subprocess.Popen[bytes], log: Path, env: dict[str, str]) -> None:
        self.process = process
        self.log = log
        self.env = env  # what a process of the same app (celery beat) needs

    def log_tail(self) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-40:])


def _close_clients() -> None:
    """Close the test process's broker and result-backend connections.

    ``app.close()`` only forgets the broker connection pool: kombu keeps it (and the producer
    pool) in process-wide groups whose after-fork hooks, in every later ``multiprocessing``
    child of this test process, would close the inherited connections, and one left waiting
    for a BRPOP reply (``control.ping``) blocks that child. ``kombu.pools.reset()`` closes them
    here, in the process that owns them."""
    backend = app.backend
    consumer = getattr(backend, "result_consumer", None)
    if consumer is not None:
        consumer.subscribed_to.clear()  # results a failed test left pending unsubscribe nothing
        consumer.stop()
    client = getattr(backend, "client", None)
    if client is not None:
        client.close()
        client.connection_pool.disconnect()
    app.close()
    kombu.pools.reset()
    # the app and its control mailbox cache the producer pool that reset() just closed: drop
    # them, so a later worker fixture (another module) publishes through a new one
    app.amqp._producer_pool = None
    with contextlib.suppress(AttributeError, KeyError):
        del app.control.mailbox.producer_pool


@pytest.fixture
def tag(request: pytest.FixtureRequest) -> str:
    return f"{request.node.name[:30]}-{uuid.uuid4().hex[:8]}"


def wait_record(key: str, count: int = 1, timeout: float = WAIT) -> list[Any]:
    """The first ``count`` values a task recorded under ``key`` (waits for them)."""
    deadline = time.monotonic() + timeout
    with record_store() as store:
        while True:
            values = [json.loads(v) for v in store.lrange(key, 0, -1)]
            if len(values) >= count:
                return values
            assert time.monotonic() < deadline, f"no record {key!r} after {timeout} s"
            time.sleep(0.02)


# -- the contract -------------------------------------------------------------------------
@in_database
def test_concurrent_sends_run_one_at_a_time(worker: Worker, tag: str) -> None:
    """Six sends of one name at once, two worker processes, lock_on_busy="retry": all six run,
    never two at a time, each under a newer fencing token, which its row carries."""
    results = [serial.delay(tag, i) for i in range(6)]
    tokens = [r.get(timeout=WAIT) for r in results]
    runs = sorted(wait_record(f"{tag}:runs", 6), key=lambda run: run[1])
    assert sorted(run[0] for run in runs) == list(range(6))
    assert [run[3] for run in runs] == [1] * 6  # the only holder each time
    for before, after in itertools.pairwise(runs):
        assert before[2] <= after[1], f"runs {before[0]} and {after[0]} overlapped"
    ordered_tokens = [run[4] for run in runs]
    assert ordered_tokens == sorted(set(ordered_tokens))  # strictly increasing
    assert sorted(tokens) == ordered_tokens
    rows = list(Product.objects.filter(name__startswith=f"{tag} ").order_by("id"))
    assert [row.fence_token for row in rows] == ordered_tokens
    assert {row.name: row.fence_token for row in rows} == {
        f"{tag} {i}": token for i, token in zip(range(6), tokens, strict=True)
    }


def test_lock_limits_bound_the_runs_per_tenant(worker: Worker, tag: str) -> None:
    """LockedTask(lock_limits=...): on a real worker (two child processes), three runs of one
    tenant never overlap (its limit is 1) and no more than two run at once (the global limit);
    a full semaphore makes a run busy, retried until it gets its permits."""
    sends = [("a", 0), ("a", 1), ("a", 2), ("b", 3)]
    results = [limited.delay(tag, tenant, i) for tenant, i in sends]
    assert sorted(r.get(timeout=WAIT) for r in results) == [0, 1, 2, 3]
    runs = wait_record(f"{tag}:limited", 4)
    assert sorted(run[0] for run in runs) == [0, 1, 2, 3]
    assert all(run[3] == 1 for run in runs), runs  # one run of a tenant at a time
    assert all(run[2] <= 2 for run in runs), runs


@in_database
def test_busy_name_skips_the_run(worker: Worker, tag: str) -> None:
    """lock_on_busy="skip": while the name is held the run returns None and the body does not
    run; once it is free, the body runs under the lock."""
    lease = locks["default"].acquire(f"held:{tag}", ttl=10)
    try:
        assert skipping.delay(tag).get(timeout=WAIT) is None
        assert not Product.objects.filter(name=tag).exists()
    finally:
        lease.release()
    assert skipping.delay(tag).get(timeout=WAIT) == "ran"
    row = Product.objects.get(name=tag)
    assert row.fence_token > lease.token


@in_database
def test_busy_name_fails_the_run_with_raise(worker: Worker, tag: str) -> None:
    """lock_on_busy="raise": the task fails with LockNotAcquired; the body did not run."""
    lease = locks["default"].acquire(f"held:{tag}", ttl=10)
    try:
        result = raising.delay(tag)
        with pytest.raises(LockNotAcquired, match=f"held:{tag}"):
            result.get(timeout=WAIT)
        assert result.state == "FAILURE"
        assert not Product.objects.filter(name=tag).exists()
    finally:
        lease.release()


@in_database
def test_sigkilled_worker_frees_the_name_within_one_ttl(worker: Worker, tag: str) -> None:
    """A worker process SIGKILLed mid-task renews nothing: the name (TTL 2 s) is held right
    after the kill and its key expires within one TTL (its PTTL, on the server's clock); then
    a newer token takes it."""
    result = sleeper.delay(tag, 60)
    [(pid, token)] = wait_record(f"{tag}:pid")
    os.kill(pid, signal.SIGKILL)
    manager = locks["default"]
    left = pttls(manager, manager.engine.state.keys.lock(f"sleep:{tag}"))
    assert all(0 < ms <= 2000 for ms in left), left
    lease = manager.acquire(f"sleep:{tag}", ttl=5, timeout=30)
    lease.release()
    assert lease.token > token
    with pytest.raises(Exception, match=r"exited prematurely|WorkerLostError|SIGKILL"):
        result.get(timeout=WAIT)


@in_database
def test_stopped_worker_write_is_rejected_after_its_lease_expired(worker: Worker, tag: str) -> None:
    """A worker process SIGSTOPped under its lease (TTL 1 s) past its expiry, while another
    holder takes the name and writes the row: resumed, its write is refused with
    StaleTokenError and the row keeps the newer token."""
    product = Product.objects.create(name=tag, stock=5)
    result = stalled_write.delay(tag, product.pk)
    [(pid, stale_token)] = wait_record(f"{tag}:pid")
    os.kill(pid, signal.SIGSTOP)
    try:
        with locks["default"].lock(f"product:{product.pk}", ttl=5, timeout=5) as lease:
            fresh = Product.objects.get(pk=product.pk)
            fresh.stock = 7
            fresh.save()
        with record_store() as store:
            store.set(f"{tag}:go", "1")
    finally:
        os.kill(pid, signal.SIGCONT)
    # Celery stores the nearest picklable class: LockError (StaleTokenError cannot be
    # re-created from its message alone); the task recorded the real type.
    with pytest.raises(LockError, match=r"write with fencing token \d+ rejected"):
        result.get(timeout=WAIT)
    [outcome] = wait_record(f"{tag}:outcome")
    assert outcome == ["StaleTokenError", stale_token, lease.token]
    assert stale_token < lease.token
    product.refresh_from_db()
    assert (product.stock, product.fence_token) == (7, lease.token)


@in_database
def test_two_schedulers_one_run_per_tick(worker: Worker, tag: str) -> None:
    """lock_min_hold: two sends of one tick 0.5 s apart (two beat schedulers), the first
    finished before the second arrives: one run, the second is skipped; the name is kept
    until 5 s after the run started (its remaining TTL, against stamps taken before the first
    send and after the check)."""
    sent = time.monotonic()
    first = tick.apply_async((tag,))
    assert first.get(timeout=WAIT) == "ran"
    time.sleep(max(0.0, 0.5 - (time.monotonic() - sent)))
    assert tick.apply_async((tag,)).get(timeout=WAIT) is None
    assert Product.objects.filter(name=f"tick {tag}").count() == 1
    with pytest.raises(LockNotAcquired) as busy:
        locks["default"].acquire(f"tick:{tag}", timeout=0)
    checked = time.monotonic()
    left = busy.value.retry_after
    # the run started after ``sent``, the remaining TTL was read before ``checked``
    assert left is not None and sent + 5.0 - checked - 0.01 <= left <= 5.0


@in_database
def test_two_beat_schedulers_one_run_per_tick(worker: Worker, tag: str, tmp_path: Path) -> None:
    """Two real ``celery beat`` processes send the same two periodic tasks every 2 s: the
    plain one runs once per tick per scheduler, the LockedTask (lock_min_hold=1.5) once
    per tick."""
    env = {**worker.env, "REDLOCK_CELERY_BEAT_TAG": tag}
    beats = []
    for n in range(2):
        argv = [sys.executable, "-m", "celery", "-A", "tests.jobs.celery_app", "beat"]
        argv += ["--loglevel=warning", f"--schedule={tmp_path / f'beat{n}'}"]
        argv += [f"--pidfile={tmp_path / f'beat{n}.pid'}"]
        with (tmp_path / f"beat{n}.log").open("wb") as out:
            beats.append(
                subprocess.Popen(
                    argv,
                    env=env,
                    cwd=ROOT,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            )
    try:
        plain = wait_record(f"{tag}:plain", 8, timeout=60)  # four ticks of two schedulers
    finally:
        for beat in beats:
            stop_group(beat)
    time.sleep(0.5)  # the worker runs what was sent before the schedulers stopped
    plain = wait_record(f"{tag}:plain", 1)
    locked = wait_record(f"{tag}:locked", 1)
    runs = sorted(locked, key=lambda run: run[2])  # in token order: the order of the grants
    # a run's lock is held 1.5 s (min_hold) from its grant, which came after its call started;
    # the next run's grant came after that, before it won: stamps that a late worker only
    # pushes further apart
    gaps = [after[1] - before[0] for before, after in itertools.pairwise(runs)]
    logs = "\n".join((tmp_path / f"beat{n}.log").read_text() for n in range(2))
    assert all(gap > 1.4 for gap in gaps), (gaps, logs)  # never twice in one tick
    assert len(plain) >= 8
    # every tick ran once: as many locked runs as ticks of one scheduler (the plain runs
    # of both, halved), one tick either way for a scheduler that started or stopped late
    assert abs(2 * len(locked) - len(plain)) <= 2, (len(locked), len(plain), logs)
    tokens = [token for *_, token in runs]
    assert len(set(tokens)) == len(tokens)


@in_database
def test_enqueue_once(worker: Worker, tag: str) -> None:
    """lock_enqueue_once: a second send while the first message is queued (not started) sends
    nothing and returns None; once the first run started, a new send is accepted."""
    first = once.apply_async((tag, 1.0), countdown=0.5)
    assert once.apply_async((tag, 1.0)) is None
    assert context.current_lease() is None  # the marker fences none of the sender's writes
    [(started_id, _)] = wait_record(f"{tag}:started")
    assert started_id == first.id
    again = once.apply_async((tag, 0.0))
    assert again is not None
    assert first.get(timeout=WAIT) == "ran"
    assert again.get(timeout=WAIT) == "ran"  # retried until the first run let go
    assert [r[0] for r in wait_record(f"{tag}:started", 2)] == [first.id, again.id]
    assert Product.objects.filter(name=f"once {tag}").count() == 2


@in_database
def test_redelivered_run_of_a_sigkilled_worker_runs_once_to_the_end(
    worker: Worker, tag: str
) -> None:
    """acks_late + reject_on_worker_lost, lock_on_busy="skip": the pool process is SIGKILLed
    mid-task holding the name; the redelivered message (same task id) is not skipped as busy
    by the dead run's lease: it waits for that lease to expire, runs to the end exactly once
    under a newer token, and the result is the function's return value."""
    result = must_run.delay(tag)
    [(pid, first_token, first_redelivered)] = wait_record(f"{tag}:pid")
    assert first_redelivered is False
    os.kill(pid, signal.SIGKILL)
    wait_dead(pid)
    with record_store() as store:
        store.set(f"{tag}:go", "1")  # only the redelivered run can read it
    assert result.get(timeout=WAIT) == f"finished {tag}"
    runs = wait_record(f"{tag}:pid", 2)
    assert len(runs) == 2, runs
    _, second_token, second_redelivered = runs[1]
    assert second_redelivered is True
    assert second_token > first_token
    assert Product.objects.filter(name=f"{tag} start").count() == 2
    [end] = Product.objects.filter(name=f"{tag} end")
    assert end.fence_token == second_token


def wait_dead(pid: int, timeout: float = WAIT) -> None:
    """Wait until ``pid`` (a child of the worker) is gone or a zombie."""
    deadline = time.monotonic() + timeout
    stat = Path(f"/proc/{pid}/stat")
    while True:
        try:
            if stat.read_text().rsplit(")", 1)[1].split()[0] in ("Z", "X"):
                return
        except (FileNotFoundError, ProcessLookupError):
            return
        assert time.monotonic() < deadline, f"process {pid} still runs after {timeout} s"
        time.sleep(0.02)


CANVASES: dict[str, Callable[[str], Any]] = {
    "group": lambda tag: group(once.s(tag) for _ in range(3)),
    "chord": lambda tag: chord([once.s(tag) for _ in range(3)], collect.s()),
    "chain": lambda tag: chain(once.s(tag), collect.s()),
    # the first member is a LockedTask: it sees the rest of the chain before it is sent
    "chain, later member": lambda tag: chain(locked_noop.s(1), once.si(tag), collect.s()),
}


@pytest.mark.parametrize("canvas", list(CANVASES))
def test_enqueue_once_refuses_canvases(worker: Worker, tag: str, canvas: str) -> None:
    """A lock_enqueue_once task in a group, chord or chain raises ValueError when the canvas
    is sent: a suppressed member would leave the canvas waiting forever. Nothing is
    published and no marker is left behind."""
    published: list[Any] = []

    def count(sender: Any = None, **kwargs: Any) -> None:
        published.append(sender)

    before_task_publish.connect(count, weak=False)
    try:
        with pytest.raises(ValueError, match=r"refuses canvases \(group, chord or chain\)"):
            CANVASES[canvas](tag).apply_async()
    finally:
        before_task_publish.disconnect(count)
    assert published == []
    locks["default"].acquire(f"once:{tag}:enqueued", ttl=1, timeout=0).release()


def test_enqueue_once_behind_a_plain_task_fails_the_canvas(worker: Worker, tag: str) -> None:
    """Behind a plain first member, the lock_enqueue_once member is refused when the worker
    sends it: the chain fails with that ValueError and a chord with ChordError, instead of
    waiting forever; the member never runs."""
    ran_first = chain(plain_noop.s(1), once.si(tag), collect.s()).apply_async()
    with pytest.raises(ValueError, match=r"refuses canvases \(group, chord or chain\)"):
        ran_first.get(timeout=WAIT)
    body = chord([plain_noop.s(i) for i in range(2)], once.si(tag)).apply_async()
    with pytest.raises(ChordError, match=r"refuses canvases \(group, chord or chain\)"):
        body.get(timeout=WAIT)
    with record_store() as store:
        assert store.llen(f"{tag}:started") == 0


def wait_state(result: Any, state: str, timeout: float = WAIT) -> None:
    """Wait until the task of ``result`` is in ``state``."""
    deadline = time.monotonic() + timeout
    while result.state != state:
        assert time.monotonic() < deadline, f"{result.id} is {result.state} after {timeout} s"
        time.sleep(0.05)


def send_once_when_accepted(tag: str, timeout: float = 20.0) -> Any:
    """Send ``once(tag)`` as soon as its enqueue marker lets a new message go."""
    deadline = time.monotonic() + timeout
    while (sent := once.apply_async((tag,))) is None:
        assert time.monotonic() < deadline, f"every send suppressed for {timeout} s"
        time.sleep(0.05)
    return sent


@in_database
def test_enqueue_marker_released_when_the_message_is_revoked(worker: Worker, tag: str) -> None:
    """lock_enqueue_once: a message revoked before a worker ran it (a countdown) never starts;
    the worker discards it and releases its marker, so a new send goes (not suppressed for
    lock_enqueue_ttl) and runs."""
    first = once.apply_async((tag,), countdown=1.0)
    assert first is not None
    app.control.revoke(first.id)
    again = send_once_when_accepted(tag)
    assert again.get(timeout=WAIT) == "ran"
    assert first.state == "REVOKED"
    assert [started[0] for started in wait_record(f"{tag}:started")] == [again.id]


@in_database
def test_enqueue_marker_released_when_the_message_expires(worker: Worker, tag: str) -> None:
    """lock_enqueue_once: a message that expires before a worker runs it (``expires`` shorter
    than its countdown) never starts; its marker goes with it, so a new send goes and runs."""
    first = once.apply_async((tag,), countdown=1.0, expires=0.5)
    assert first is not None
    again = send_once_when_accepted(tag)
    assert again.get(timeout=WAIT) == "ran"
    wait_state(first, "REVOKED")  # Celery's state of a message that expired
    assert [started[0] for started in wait_record(f"{tag}:started")] == [again.id]


def test_enqueue_marker_lives_no_longer_than_the_message(worker: Worker, tag: str) -> None:
    """A message with ``expires`` that no worker takes (a broker that drops expired messages
    never tells a worker) holds its marker at most until it expires, not lock_enqueue_ttl."""
    sent = once.apply_async((tag,), expires=5.0, queue=f"nobody-{tag}")
    assert sent is not None
    with pytest.raises(LockNotAcquired) as busy:
        locks["default"].acquire(f"once:{tag}:enqueued", timeout=0)
    left = busy.value.retry_after
    assert left is not None and left <= 5.0


# -- without the worker --------------------------------------------------------------------
@in_database
def test_direct_call_runs_under_the_lock(tag: str) -> None:
    """Called like a function, the task holds its lock in this process too."""
    assert skipping(tag) == "ran"
    assert Product.objects.get(name=tag).fence_token > 0
    lease = locks["default"].acquire(f"held:{tag}", ttl=5)  # not re-entered, unlike a block
    try:
        assert skipping(tag) is None
    finally:
        lease.release()
    assert Product.objects.filter(name=tag).count() == 1


@pytest.mark.parametrize(
    ("options", "error", "message"),
    [
        ({"lock_on_busy": "wait"}, ValueError, "lock_on_busy must be 'skip', 'retry' or 'raise'"),
        ({"lock_name": "r:{nope}"}, ValueError, "has no parameter 'nope'"),
        ({"lock_name": "r:{1}"}, ValueError, r"no positional parameter \{1\}"),
        ({"lock_name": "r:{0"}, ValueError, "not a valid format string"),
        ({"lock_ttl": 0}, ValueError, "ttl must be a finite number"),
        ({"lock_ttl": "5"}, TypeError, "ttl must be a number"),
        ({"lock_min_hold": -1}, ValueError, "lock_min_hold must be > 0"),
        ({"lock_enqueue_once": "yes"}, TypeError, "lock_enqueue_once must be True or False"),
        ({"lock_using": 1}, TypeError, "lock_using must be an alias"),
    ],
)
@pytest.mark.parametrize("bind", [False, True])
def test_bad_options_fail_when_the_task_is_made(
    options: dict[str, Any], error: type[Exception], message: str, bind: bool
) -> None:
    """Options that could never work fail when the task is created, naming the task."""
    bad = Celery("bad-options", set_as_current=False)
    bad.finalize()

    def bound(self: Any, day: str) -> None: ...

    def plain(day: str) -> None: ...

    body = bound if bind else plain
    with pytest.raises(error, match=message):
        bad.task(base=LockedTask, bind=bind, shared=False, **options)(body)
    good = bad.task(base=LockedTask, bind=bind, shared=False, lock_name="r:{0}:{day}")(body)
    assert good._lock_template().fill(("mon",), {}) == "r:mon:mon"


def test_bad_options_on_a_task_class() -> None:
    with pytest.raises(ValueError, match="Report: lock_on_busy"):

        class Report(LockedTask):
            lock_on_busy = "later"

    class Nightly(LockedTask):  # a base for tasks: no run() yet, so no template check
        lock_name = "nightly:{day}"
        lock_on_busy = "retry"

    with pytest.raises(ValueError, match="no parameter 'day'"):

        class Weekly(Nightly):
            def run(self, week: int) -> None: ...

    class Daily(Nightly):
        def run(self, day: str) -> None: ...

    assert Daily()._lock_template().fill((), {"day": "mon"}) == "nightly:mon"


def test_enqueue_once_in_eager_mode(unique_name: str) -> None:
    """task_always_eager: the run releases the marker as a worker would, so every send runs."""
    eager = Celery("eager", set_as_current=False)
    eager.conf.task_always_eager = True
    eager.finalize()

    def job(key: str) -> str:
        return key

    task = eager.task(
        base=LockedTask, shared=False, lock_name="eager:{key}", lock_enqueue_once=True
    )(job)
    assert task.apply_async((unique_name,)).get() == unique_name
    assert task.delay(unique_name).get() == unique_name
    marker = locks["default"].acquire(f"eager:{unique_name}:enqueued", ttl=1, timeout=0)
    marker.release()


@pytest.mark.parametrize("how", ["apply", "always_eager"])
def test_eager_retry_of_a_busy_task_raises(
    how: str, redis_node_factory: Callable[..., Any], redlock_alias: Callable[..., Any]
) -> None:
    """Eager mode (``apply()``, ``task_always_eager``): Celery's retry runs the task again at
    once, ignoring the countdown, so lock_on_busy="retry" raises LockNotAcquired there
    instead of recursing; the node saw a handful of attempts, not hundreds."""
    [node] = redis_node_factory(1)
    alias = redlock_alias([node.url]).alias
    eager = Celery("eager-retry", set_as_current=False)
    eager.conf.task_always_eager = how == "always_eager"
    eager.finalize()

    def job(key: str) -> str:
        return key

    task = eager.task(
        base=LockedTask,
        shared=False,
        lock_using=alias,
        lock_name="eager:{key}",
        lock_on_busy="retry",
        max_retries=None,
    )(job)
    held, done = threading.Event(), threading.Event()

    def hold() -> None:
        with locks[alias].lock("eager:k", ttl=30, timeout=5):
            held.set()
            done.wait(WAIT)

    holder = threading.Thread(target=hold)
    holder.start()
    try:
        assert held.wait(WAIT)
        admin = node.client()
        before = script_calls(admin)
        with pytest.raises(LockNotAcquired, match="eager:k"):
            if how == "apply":
                task.apply(("k",)).get()
            else:
                task.delay("k").get()
        assert script_calls(admin) - before <= 5
    finally:
        done.set()
        holder.join(WAIT)
    assert task.apply(("k",)).get() == "k"  # free again: it runs


@pytest.mark.parametrize("holder", ["dead", "live"])
def test_redelivered_run_waits_at_most_one_ttl(holder: str, unique_name: str) -> None:
    """A redelivered message (``delivery_info["redelivered"]``) that finds its name busy waits
    for the holder's lease: a dead holder's lease (never renewed) expires and the body runs;
    a live holder renews it, so the run gives up after that wait and skips, as
    lock_on_busy="skip" says."""
    direct = Celery("redelivered", set_as_current=False)
    direct.finalize()
    ran: list[str] = []

    def job(key: str) -> str:
        ran.append(key)
        return key

    task = direct.task(base=LockedTask, shared=False, lock_name="r:{key}", lock_ttl=1.0)(job)
    manager = locks["default"]
    stop = threading.Event()
    if holder == "dead":
        manager.acquire(f"r:{unique_name}", ttl=1.0, timeout=0)  # nobody renews or releases it
    else:
        held = threading.Event()

        def hold() -> None:
            with manager.lock(f"r:{unique_name}", ttl=1.0, timeout=5, auto_extend=True):
                held.set()
                stop.wait(WAIT)

        live = threading.Thread(target=hold)
        live.start()
        assert held.wait(WAIT)
    task.push_request(id="redelivered-1", delivery_info={"redelivered": True})
    try:
        outcome = task(unique_name)
    finally:
        task.pop_request()
        stop.set()
    if holder == "dead":
        assert (outcome, ran) == (unique_name, [unique_name])
    else:
        live.join(WAIT)
        assert (outcome, ran) == (None, [])
    task.push_request(id="first-delivery", delivery_info={"redelivered": False})
    lease = manager.acquire(f"r:{unique_name}", ttl=5.0, timeout=0)
    try:
        assert task(unique_name) is None  # not redelivered: skipped at once, as before
    finally:
        lease.release()
        task.pop_request()


def script_calls(client: Any) -> int:
    """How many scripts the node has run (the lock's attempts are scripts)."""
    stats = client.info("commandstats")
    return sum(stats.get(f"cmdstat_{c}", {}).get("calls", 0) for c in ("eval", "evalsha", "fcall"))


def test_renewals_stop_at_the_hard_time_limit() -> None:
    """max_hold is the run's hard time limit: the message's (Celery sends (hard, soft)), else
    the task's time_limit, else the app's task_time_limit."""
    limited = Celery("limits", set_as_current=False)
    limited.finalize()

    def job() -> None: ...

    task = limited.task(base=LockedTask, shared=False)(job)
    assert task._hard_time_limit() is None
    limited.conf.task_time_limit = 11
    assert task._hard_time_limit() == 11.0
    task.time_limit = 9
    assert task._hard_time_limit() == 9.0
    task.push_request(timelimit=(7, 5))
    try:
        assert task._hard_time_limit() == 7.0
    finally:
        task.pop_request()


@pytest.mark.parametrize("on_busy", ["skip", "retry", "raise"])
def test_no_quorum_always_fails_the_run(
    on_busy: str, redis_node_factory: Callable[..., Any], redlock_alias: Callable[..., Any]
) -> None:
    """NodesUnavailable is not "busy": whatever lock_on_busy says, the run fails with it."""
    nodes = redis_node_factory(1)
    alias = redlock_alias(nodes).alias
    nodes.stop()
    direct = Celery("no-quorum", set_as_current=False)
    direct.finalize()
    ran: list[str] = []

    def job(key: str) -> None:
        ran.append(key)

    task = direct.task(base=LockedTask, shared=False, lock_using=alias, lock_on_busy=on_busy)(job)
    with pytest.raises(NodesUnavailable):
        task("x")
    assert ran == []
