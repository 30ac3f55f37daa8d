# mypy: disable-error-code="untyped-decorator"
"""The Celery app and tasks of tests/jobs/test_celery.py (and benchmarks/celery_overhead.py).

A real worker imports this module (``celery -A tests.jobs.celery_app worker``) with
``DJANGO_SETTINGS_MODULE=tests.support.subprocess_settings``, the session's lock nodes in
``REDLOCK_JSON``, its test database in ``TEST_DATABASE_NAME`` and the redis-server of the
broker in ``REDLOCK_CELERY_REDIS`` (database 0: broker, 1: results, 2: what tasks record for
the tests). The test process imports it too and calls :func:`configure` before sending.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

import django
from django.apps import apps

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.support.subprocess_settings")
if not apps.ready:  # the worker; the test process has set Django up already
    django.setup()

import redis
from celery import Celery

from django_redlock.contrib.celery import LockedTask
from django_redlock.exceptions import StaleTokenError
from django_redlock.locking import context

app = Celery("redlock_tests")
app.conf.update(
    task_serializer="json",
    result_serializer="json",
    accept_content=["json"],
    worker_prefetch_multiplier=1,
    broker_connection_retry_on_startup=True,
    worker_hijack_root_logger=False,
    task_default_queue="redlock-tests",
)
_redis_url = ""


def configure(redis_url: str) -> None:
    """Point the app at ``redis_url`` (``redis://host:port``, no database)."""
    global _redis_url
    _redis_url = redis_url.rstrip("/")
    app.conf.update(broker_url=f"{_redis_url}/0", result_backend=f"{_redis_url}/1")


def wait_go(tag: str, timeout: float = 30.0) -> None:
    """Wait (polling, bounded) until the test sets ``<tag>:go``. A key, not a list popped
    with BLPOP: a pool process SIGKILLed while blocked in BLPOP could still be handed the
    item by the server (before it noticed the closed connection), and redis-py's default
    5 s socket timeout would end a longer BLPOP with TimeoutError."""
    deadline = time.monotonic() + timeout
    with record_store() as store:
        while not store.exists(f"{tag}:go") and time.monotonic() < deadline:
            time.sleep(0.02)


def record_store() -> redis.Redis:
    """What tasks record for the tests (database 2 of the broker's server)."""
    return redis.Redis.from_url(f"{_redis_url}/2", decode_responses=True)


if os.environ.get("REDLOCK_CELERY_REDIS"):
    configure(os.environ["REDLOCK_CELERY_REDIS"])

#: ``celery beat`` processes of the tests send both periodic tasks every BEAT_EVERY seconds
#: with the tag in ``REDLOCK_CELERY_BEAT_TAG``.
BEAT_EVERY = 2.0
if os.environ.get("REDLOCK_CELERY_BEAT_TAG"):
    _beat_args = (os.environ["REDLOCK_CELERY_BEAT_TAG"],)
    app.conf.beat_schedule = {
        "locked": {
            "task": "tests.jobs.celery_app.beat_locked",
            "schedule": BEAT_EVERY,
            "args": _beat_args,
        },
        "plain": {
            "task": "tests.jobs.celery_app.beat_plain",
            "schedule": BEAT_EVERY,
            "args": _beat_args,
        },
    }


def _record(key: str, value: Any) -> None:
    with record_store() as store:
        store.rpush(key, json.dumps(value))


# -- tasks --------------------------------------------------------------------------------
@app.task(
    base=LockedTask,
    lock_name="serial:{tag}",
    lock_ttl=0.6,
    lock_on_busy="retry",
    max_retries=None,
)
def serial(tag: str, i: int, hold: float = 0.15) -> int:
    """One run at a time: records (i, start, end, holders seen, token) and a fenced row."""
    from testproject.inventory.models import Product

    started = time.time()
    with record_store() as store:
        holders = store.incr(f"{tag}:holders")
        token = context.current_token()
        Product.objects.create(name=f"{tag} {i}")  # FencedModel: fence_token = the lease's
        time.sleep(hold)
        store.decr(f"{tag}:holders")
        store.rpush(f"{tag}:runs", json.dumps([i, started, time.time(), holders, token]))
    assert token is not None
    return token


@app.task(
    base=LockedTask,
    lock_limits={"api:{tag}": 2, "api:{tag}:{tenant}": 1},
    lock_ttl=2.0,
    lock_on_busy="retry",
    max_retries=None,
)
def limited(tag: str, tenant: str, i: int, hold: float = 0.3) -> int:
    """A permit of the tag's global limit (2) and of its tenant's (1): records (i, tenant,
    runs in progress, runs of this tenant in progress) as it started."""
    with record_store() as store:
        running = store.incr(f"{tag}:running")
        tenant_running = store.incr(f"{tag}:running:{tenant}")
        time.sleep(hold)
        store.decr(f"{tag}:running:{tenant}")
        store.decr(f"{tag}:running")
        store.rpush(f"{tag}:limited", json.dumps([i, tenant, running, tenant_running]))
    return i


def _mark_ran(tag: str) -> str:
    from testproject.inventory.models import Product

    Product.objects.create(name=tag)
    return "ran"


@app.task(base=LockedTask, lock_name="held:{0}", lock_on_busy="skip")
def skipping(tag: str) -> str:
    return _mark_ran(tag)


@app.task(base=LockedTask, lock_name="held:{0}", lock_on_busy="raise")
def raising(tag: str) -> str:
    return _mark_ran(tag)


@app.task(base=LockedTask, lock_name="sleep:{tag}", lock_ttl=2.0, lock_on_busy="raise")
def sleeper(tag: str, seconds: float) -> str:
    """Records its PID (for a test to SIGKILL it), then sleeps."""
    _record(f"{tag}:pid", [os.getpid(), context.current_token()])
    time.sleep(seconds)
    return "slept"


@app.task(base=LockedTask, lock_name="product:{pk}", lock_ttl=1.0, lock_on_busy="raise")
def stalled_write(tag: str, pk: int) -> str:
    """Reads the product under the lock, records its PID, waits for ``<tag>:go``, then
    writes: a test SIGSTOPs it meanwhile, so the write may come after the lease ran out."""
    from testproject.inventory.models import Product

    product = Product.objects.get(pk=pk)
    _record(f"{tag}:pid", [os.getpid(), context.current_token()])
    wait_go(tag)
    product.stock = 1
    try:
        product.save()
    except StaleTokenError as exc:
        _record(f"{tag}:outcome", [type(exc).__name__, exc.token, exc.row_token])
        raise
    _record(f"{tag}:outcome", ["saved", context.current_token(), None])
    return "saved"


@app.task(
    base=LockedTask,
    lock_name="tick:{tag}",
    lock_min_hold=5.0,
    lock_on_busy="skip",
)
def tick(tag: str, hold: float = 0.1) -> str:
    """A periodic job: once per tick, however many schedulers send it."""
    time.sleep(hold)
    return _mark_ran(f"tick {tag}")


@app.task(
    base=LockedTask,
    bind=True,
    lock_name="once:{tag}",
    lock_ttl=1.0,
    lock_on_busy="retry",
    lock_enqueue_once=True,
    max_retries=None,
)
def once(self: LockedTask, tag: str, hold: float = 0.0) -> str:
    """Queued at most once at a time; records when each run starts."""
    _record(f"{tag}:started", [self.request.id, time.time()])
    time.sleep(hold)
    return _mark_ran(f"once {tag}")


@app.task(
    base=LockedTask,
    bind=True,
    lock_name="must:{tag}",
    lock_ttl=2.0,
    acks_late=True,
    reject_on_worker_lost=True,
)
def must_run(self: LockedTask, tag: str) -> str:
    """Acknowledged once it ran, requeued when its process dies (the usual "must run"
    options; ``lock_on_busy`` is the default "skip"): writes a start row, records its PID, its
    token and whether its message was redelivered, waits for ``<tag>:go``, writes an end row."""
    from testproject.inventory.models import Product

    Product.objects.create(name=f"{tag} start")
    redelivered = bool((self.request.delivery_info or {}).get("redelivered"))
    _record(f"{tag}:pid", [os.getpid(), context.current_token(), redelivered])
    wait_go(tag)
    Product.objects.create(name=f"{tag} end")
    return f"finished {tag}"


@app.task
def wait_under_a_time_limit(name: str, using: str, hold: float) -> str:
    """Waits (up to 5 s) for ``name``, which the test keeps taking and letting go, then holds
    it ``hold`` seconds (TTL 30 s: a lease left behind would be seen). Sent with a soft time
    limit, whose ``SoftTimeLimitExceeded`` may land anywhere: while it waits, as it is
    granted, as the block is entered, inside it, as it is released."""
    from django_redlock import locks

    with locks[using].lock(name, ttl=30, timeout=5):
        time.sleep(hold)
    return "ran"


@app.task
def collect(results: Any) -> Any:
    """A plain task for the end of a chain or the body of a chord."""
    return results


@app.task(base=LockedTask, lock_name="beat:{0}", lock_min_hold=1.5, lock_on_busy="skip")
def beat_locked(tag: str) -> str:
    """Sent by two ``celery beat`` processes every 2 s: once per tick. Records when its lock
    call started and when it won (``time.monotonic()``: one clock for every process of the
    machine), and its token."""
    lease = context.current_lease()
    assert lease is not None
    won = time.monotonic() - lease.held  # type: ignore[attr-defined]
    _record(f"{tag}:locked", [won - lease.waited, won, lease.token])  # type: ignore[attr-defined]
    return "ran"


@app.task
def beat_plain(tag: str) -> str:
    """The same job without the lock: once per tick per scheduler."""
    _record(f"{tag}:plain", [time.time(), None])
    return "ran"


# -- benchmarks/celery_overhead.py ---------------------------------------------------------
@app.task
def plain_noop(i: int) -> int:
    return i


@app.task(base=LockedTask, lock_name="bench:{0}", lock_on_busy="raise")
def locked_noop(i: int) -> int:
    return i
