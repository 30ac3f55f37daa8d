"""``django_redlock.contrib.celery.LockedTask`` with a real Celery worker.

One prefork worker (two child processes) runs for the whole module, on a redis-server of this
module (broker and results) against the session's lock nodes and test database. Nothing is
mocked: the tests send tasks, signal the worker's child processes (SIGKILL, SIGSTOP) and read
what the runs left in the database and in Redis.
"""

from __future__ import annotations

import itertools
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import kombu.pools
import pytest
from celery import Celery
from django.conf import settings
from django.db import connection

from django_redlock import context, locks
from django_redlock.contrib.celery import LockedTask
from django_redlock.exceptions import LockError, LockNotAcquired, NodesUnavailable
from testproject.inventory.demo_run import stop_group
from testproject.inventory.models import Product
from tests.jobs import celery_app
from tests.jobs.celery_app import (
    app,
    once,
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


@pytest.fixture(scope="module")
def worker(
    redis_node_factory_session: Callable[..., Any],
    _session_redlock: None,
    django_db_setup: None,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Worker]:
    """``celery worker --pool=prefork --concurrency=2`` on a fresh redis-server, stopped by
    PID at the end of the module (SIGTERM, SIGKILL after 8 s)."""
    broker = redis_node_factory_session(1)[0]
    base = broker.url.rsplit("/", 1)[0]
    celery_app.configure(base)
    log = tmp_path_factory.mktemp("celery") / "worker.log"
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "tests.support.subprocess_settings",
        "REDLOCK_JSON": json.dumps(settings.REDLOCK),
        "TEST_DATABASE_NAME": str(connection.settings_dict["NAME"]),
        "REDLOCK_CELERY_REDIS": base,
        "PYTHONPATH": str(ROOT),
    }
    argv = [sys.executable, "-m", "celery", "-A", "tests.jobs.celery_app", "worker"]
    argv += ["--pool=prefork", "--concurrency=2", "--loglevel=warning", "--hostname=redlock@%h"]
    argv += ["--without-heartbeat", "--without-gossip", "--without-mingle"]
    with log.open("wb") as out:
        process = subprocess.Popen(
            argv, env=env, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
    running = Worker(process, log, env)
    try:
        deadline = time.monotonic() + WAIT
        while not app.control.ping(timeout=0.3):
            if process.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"the Celery worker did not start:\n{running.log_tail()}")
        yield running
    finally:
        stop_group(process)
        _close_clients()


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
            store.rpush(f"{tag}:go", "1")
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
