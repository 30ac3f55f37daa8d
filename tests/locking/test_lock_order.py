"""The lock-order checker (``REDLOCK_CHECK_ORDER``, docs/production.md "Ordering locks"): two
name shapes taken in both orders, by threads, asyncio tasks or processes sharing the nodes,
warn once (``RuntimeWarning`` and a WARNING log, both stacks); a consistent order never does;
off, nothing is recorded."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import random
import string
import subprocess
import sys
import threading
import time
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from django.db import transaction
from django.test import override_settings

from django_redlock import lock, locks
from django_redlock.exceptions import NodesUnavailable
from django_redlock.locking import ordering
from django_redlock.locking.manager import LockManager
from django_redlock.locking.ordering import shared
from django_redlock.testing import RedisNodes
from tests.conftest import SESSION_ALIASES

ROOT = Path(__file__).resolve().parents[2]


def _letters() -> str:
    """A prefix without digits (digits would be masked into the shape)."""
    return "".join(random.choices(string.ascii_lowercase, k=10))


def _clear_records() -> None:
    for alias in ("default", "multi"):
        shared.clear(locks[alias].engine)
    ordering.reset()


@pytest.fixture
def checker() -> Iterator[str]:
    """The checker on, this process's and the nodes' records empty; yields a name prefix."""
    with override_settings(REDLOCK_CHECK_ORDER=True):
        _clear_records()
        yield _letters()
        _clear_records()


def _in_thread(func: Callable[[], None]) -> None:
    errors: list[BaseException] = []

    def run() -> None:
        try:
            func()
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    thread.join()
    assert not errors, errors


def _recorded(alias: str = "default") -> set[tuple[str, str]]:
    edges, errors = shared.read_all(locks[alias].engine)
    assert not errors
    return {(r.edge[0][1], r.edge[1][1]) for r in edges}


def test_inversion_across_two_threads_warns_with_both_stacks(
    checker: str, caplog: pytest.LogCaptureFixture
) -> None:
    """One thread takes order:N then invoice:N, another invoice:N then order:N: a
    RuntimeWarning and a WARNING log name both shapes and carry both threads' stacks."""
    p = checker

    def first_thread_takes_order_then_invoice() -> None:
        with lock(f"{p}:order:1", timeout=1), lock(f"{p}:invoice:1", timeout=1):
            pass

    def second_thread_takes_invoice_then_order() -> None:
        with lock(f"{p}:invoice:2", timeout=1), lock(f"{p}:order:2", timeout=1):
            pass

    _in_thread(first_thread_takes_order_then_invoice)
    caplog.set_level(logging.WARNING, logger="django_redlock")
    with pytest.warns(RuntimeWarning, match="Lock order inversion") as caught:
        _in_thread(second_thread_takes_invoice_then_order)
    assert len(caught) == 1
    message = str(caught[0].message)
    assert f"'{p}:order:{{n}}'" in message and f"'{p}:invoice:{{n}}'" in message
    assert "first_thread_takes_order_then_invoice" in message
    assert "second_thread_takes_invoice_then_order" in message
    logged = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(logged) == 1 and "first_thread_takes_order_then_invoice" in logged[0].getMessage()


def test_inversion_across_two_processes_warns(checker: str) -> None:
    """Another process (a fresh interpreter on the same nodes) takes A then B; this one then
    takes B then A and warns, with the other process's pid and stack read from the nodes."""
    p = checker
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "tests.support.subprocess_settings",
        "REDLOCK_JSON": json.dumps({"default": SESSION_ALIASES["default"]}),
        "PYTHONPATH": str(ROOT),
    }
    done = subprocess.run(
        [sys.executable, "-m", "tests.support.order_worker", f"{p}:a:7", f"{p}:b:7"],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    child = int(done.stdout.split()[-1])
    assert _recorded() == {(f"{p}:a:{{n}}", f"{p}:b:{{n}}")}
    with (
        pytest.warns(RuntimeWarning, match="Lock order inversion") as caught,
        lock(f"{p}:b:8", timeout=1),
        lock(f"{p}:a:8", timeout=1),
    ):
        pass
    message = str(caught[0].message)
    assert f"pid {child} " in message
    assert "child_takes_first_then_second" in message


def test_consistent_order_does_not_warn(checker: str) -> None:
    """The same order everywhere (threads, nesting of three, bare acquire()) records edges and
    never warns (the suite turns warnings into errors)."""
    p = checker

    def in_order() -> None:
        with lock(f"{p}:a:1", timeout=1), lock(f"{p}:b:1", timeout=1):
            lease = locks["default"].acquire(f"{p}:c:1", timeout=1)
            lease.release()

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _in_thread(in_order)
        _in_thread(in_order)
        in_order()
    assert caught == []
    assert _recorded() == {
        (f"{p}:a:{{n}}", f"{p}:b:{{n}}"),
        (f"{p}:a:{{n}}", f"{p}:c:{{n}}"),
        (f"{p}:b:{{n}}", f"{p}:c:{{n}}"),
    }


def test_each_inverted_pair_warns_once(checker: str) -> None:
    """The pair warns the first time; taking it inverted again (either way) does not."""
    p = checker
    with lock(f"{p}:a", timeout=1), lock(f"{p}:b", timeout=1):
        pass
    with pytest.warns(RuntimeWarning), lock(f"{p}:b", timeout=1), lock(f"{p}:a", timeout=1):
        pass
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(2):
            with lock(f"{p}:b", timeout=1), lock(f"{p}:a", timeout=1):
                pass
            with lock(f"{p}:a", timeout=1), lock(f"{p}:b", timeout=1):
                pass
    assert caught == []


def test_off_records_nothing() -> None:
    """REDLOCK_CHECK_ORDER=False (the suite's setting): both orders, no warning, no record
    in this process or on the nodes."""
    _clear_records()
    p = _letters()
    with override_settings(REDLOCK_CHECK_ORDER=False):
        assert not locks["default"].check_order
        with lock(f"{p}:a", timeout=1), lock(f"{p}:b", timeout=1):
            pass
        with lock(f"{p}:b", timeout=1), lock(f"{p}:a", timeout=1):
            pass
    assert ordering.RECORDER.edges == {}
    assert _recorded() == set()


def test_reentry_is_not_an_edge(checker: str) -> None:
    """Re-entering a held name (block in block, bare acquire() of another name of the set)
    records nothing; two names of one shape are not an edge either."""
    p = checker
    with lock(f"{p}:a", timeout=1), lock(f"{p}:a", timeout=1):
        pass
    with lock(f"{p}:x:1", timeout=1), lock(f"{p}:x:2", timeout=1):
        pass
    assert ordering.RECORDER.edges == {}


def test_templates_are_shapes_and_other_names_are_masked(checker: str) -> None:
    """@lock("...{pk}") records its template, a field filled with an id masked as in a plain
    name; a plain name is masked (digits, UUIDs, hex)."""
    p = checker

    @lock(p + ":order:{pk}", timeout=1)
    def update_order(pk: int) -> None:
        with lock(f"{p}:stock:12:0b7e5a6c-1d2e-4f3a-9b8c-7d6e5f4a3b2c", timeout=1):
            pass

    update_order(5)
    assert _recorded() == {(p + ":order:{n}", p + ":stock:{n}:{uuid}")}
    assert ordering.masked("sha:0123456789abcdef0123:v2") == "sha:{hex}:v{n}"
    assert ordering.masked("cafebabecafebabe") == "cafebabecafebabe"  # no digit: a word


def test_lock_many_orders_only_what_was_held_before(checker: str) -> None:
    """Names held before a lock_many set are edges to each of its names; the set's own names
    have no order (all or nothing), so opposite sets never warn."""
    p = checker
    manager = locks["default"]
    with lock(f"{p}:cart:1", timeout=1), manager.lock_many([f"{p}:a:1", f"{p}:b:1"], timeout=1):
        pass
    with manager.lock_many([f"{p}:b:2", f"{p}:a:2"], timeout=1):
        pass
    assert _recorded() == {
        (f"{p}:cart:{{n}}", f"{p}:a:{{n}}"),
        (f"{p}:cart:{{n}}", f"{p}:b:{{n}}"),
    }


def test_semaphores_and_read_write_leases_count(checker: str) -> None:
    """A semaphore's permit and a read lease are locks of their shape."""
    p = checker
    manager = locks["default"]
    with manager.semaphore(f"{p}:pool", 2, timeout=1), manager.read_lock(f"{p}:doc:1", timeout=1):
        pass
    with (
        pytest.warns(RuntimeWarning, match=f"'{p}:pool'"),
        manager.write_lock(f"{p}:doc:2", timeout=1),
        manager.semaphore(f"{p}:pool", 2),
    ):
        pass


@pytest.mark.django_db(transaction=True)
def test_a_lease_kept_until_commit_is_still_held(checker: str) -> None:
    """A block that ended inside a transaction keeps its lease until the commit: a lock taken
    after it, in the same transaction, is ordered after it."""
    p = checker
    with transaction.atomic():
        with lock(f"{p}:order:1", timeout=1):
            pass
        with lock(f"{p}:audit:1", timeout=1):
            pass
    assert _recorded() == {(f"{p}:order:{{n}}", f"{p}:audit:{{n}}")}


def test_inversion_between_asyncio_tasks_warns(checker: str) -> None:
    """Two tasks of one event loop, each holding one name while taking the other's shape."""
    p = checker
    manager = locks["default"]

    async def first_task() -> None:
        async with manager.alock(f"{p}:a:1", timeout=1), manager.alock(f"{p}:b:1", timeout=1):
            pass

    async def second_task() -> None:
        async with manager.alock(f"{p}:b:2", timeout=1), manager.alock(f"{p}:a:2", timeout=1):
            pass

    async def main() -> None:
        await asyncio.create_task(first_task())
        await asyncio.create_task(second_task())

    with pytest.warns(RuntimeWarning, match="Lock order inversion") as caught:
        asyncio.run(main())
    assert "first_task" in str(caught[0].message) and "second_task" in str(caught[0].message)


def test_setting_is_checked_and_defaults_to_debug() -> None:
    """A value other than True, False or None is an ImproperlyConfigured naming the setting
    (and check E006); unset or None follows DEBUG."""
    from django.core.exceptions import ImproperlyConfigured

    from django_redlock.checks import check_settings
    from django_redlock.conf import check_order_setting

    with override_settings(REDLOCK_CHECK_ORDER="yes"):
        with pytest.raises(ImproperlyConfigured, match="REDLOCK_CHECK_ORDER must be True or False"):
            check_order_setting()
        assert "django_redlock.E006" in [m.id for m in check_settings()]
        with pytest.raises(ImproperlyConfigured, match="REDLOCK_CHECK_ORDER"):
            locks["default"]  # the first lock call after the change fails the same way
    with override_settings(REDLOCK_CHECK_ORDER=None, DEBUG=True):
        assert check_order_setting() is True and locks["default"].check_order is True
    with override_settings(REDLOCK_CHECK_ORDER=None, DEBUG=False):
        assert check_order_setting() is False and locks["default"].check_order is False


def test_request_lock_key_template_is_its_shape(checker: str) -> None:
    """A request lock's shape is its KEY template (an id field masked); a lock its view takes
    is ordered after it."""
    from django.http import HttpRequest, HttpResponse
    from django.test import RequestFactory

    from django_redlock.decorators import request_lock

    p = checker

    @request_lock(p + ":order:{order_id}")
    def view(request: HttpRequest, order_id: int) -> HttpResponse:
        with lock(f"{p}:stock:{order_id}", timeout=1):
            return HttpResponse("ok")

    assert view(RequestFactory().post("/"), order_id=3).status_code == 200
    assert _recorded() == {(p + ":order:{n}", p + ":stock:{n}")}


def test_limits_are_ordered_after_what_was_held_before(checker: str) -> None:
    """A ``limits()`` set takes its permits all at once (no order among them), but names held
    before it are ordered before each of its semaphores, and the inverse order warns."""
    p = checker
    manager = locks["default"]
    with lock(f"{p}:order:1", timeout=1), manager.limits({f"{p}:api": 2, f"{p}:tenant:1": 1}):
        pass
    assert _recorded() == {
        (f"{p}:order:{{n}}", f"{p}:api"),
        (f"{p}:order:{{n}}", f"{p}:tenant:{{n}}"),
    }
    with (
        pytest.warns(RuntimeWarning, match=f"'{p}:order:{{n}}'"),
        manager.semaphore(f"{p}:api", 2, timeout=1),
        lock(f"{p}:order:2", timeout=1),
    ):
        pass


def test_alimits_are_ordered_after_what_was_held_before(checker: str) -> None:
    """The asyncio twin: ``alimits`` inside an ``alock`` records an edge to each semaphore."""
    p = checker
    manager = locks["default"]

    async def main() -> None:
        async with manager.alock(f"{p}:order:1", timeout=1), manager.alimits({f"{p}:api": 2}):
            pass

    asyncio.run(main())
    assert (f"{p}:order:{{n}}", f"{p}:api") in _recorded()


def test_a_new_edge_does_not_block_the_event_loop(
    checker: str,
    redis_node_factory: Callable[..., RedisNodes],
    redlock_alias: Callable[..., LockManager],
) -> None:
    """``aacquire`` records a new edge on the nodes without blocking the event loop: with the
    node paused, the edge's call waits up to four node timeouts (2 s here) while another task
    of the loop keeps ticking every 10 ms. It used to make that call synchronously, freezing
    every task of the loop for the whole wait."""
    p = checker
    nodes = redis_node_factory(1)
    manager = redlock_alias(nodes, NODE_TIMEOUT=0.5)
    gaps: list[float] = []

    async def ticker(stop: asyncio.Event) -> None:
        last = time.monotonic()
        while not stop.is_set():
            await asyncio.sleep(0.01)
            now = time.monotonic()
            gaps.append(now - last)
            last = now

    async def main() -> None:
        held = await manager.aacquire(f"{p}:held:1", ttl=30, timeout=0)
        nodes[0].pause()
        stop = asyncio.Event()
        ticking = asyncio.create_task(ticker(stop))
        try:
            await asyncio.sleep(0.05)
            with pytest.raises(NodesUnavailable):
                await manager.aacquire(f"{p}:other:1", timeout=0)
        finally:
            stop.set()
            await ticking
            nodes[0].resume()
        await held.arelease()

    asyncio.run(main())
    assert max(gaps) < 1.0, f"the event loop stood still for {max(gaps):.2f} s"
