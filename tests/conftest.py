"""Shared fixtures: real redis-server nodes wired into ``settings.REDLOCK``.

Session nodes (cheap, shared): alias ``default`` = 1 node, ``multi`` = 3 nodes, ``five`` = 5
nodes, each with its own key prefix. Tests that inject faults start their own nodes with
``redlock_alias(nodes, ...)``, which registers a fresh alias for the test only.
"""

from __future__ import annotations

import gc
import os
import threading
import time
import uuid
import warnings
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from django.conf import settings
from django.db import connections
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.backends.signals import connection_created

from django_redlock import locks
from django_redlock.locking import context
from django_redlock.locking.manager import LockManager
from django_redlock.testing import RedisNodes

SESSION_ALIASES: dict[str, dict[str, Any]] = {}


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--long",
        action="store_true",
        help="the long profile: also run the tests marked slow (e.g. --long -m slow for them only)",
    )


#: This suite's shared fixtures that every xdist worker starts for itself (cheap): they group
#: nothing. (A plugin's shared fixtures, pytest-django's database setup and the node factory,
#: are per worker too.)
PER_WORKER_FIXTURES = frozenset({"_session_redlock", "session_nodes"})


def shared_fixture_keys(item: pytest.Item) -> set[str]:
    """The expensive shared things ``item`` uses: each module- or session-scoped fixture of this
    suite in its closure (a node group, a process pool, a worker), named by where it lives."""
    info = getattr(item, "_fixtureinfo", None)
    if info is None:
        return set()
    keys = set()
    for name, definitions in info.name2fixturedefs.items():
        definition = definitions[-1]
        if (
            name in PER_WORKER_FIXTURES
            or definition.scope not in ("module", "package", "session")
            or not definition.baseid.startswith("tests")  # a plugin's
        ):
            continue
        if definition.scope == "session":
            keys.add(f"session:{name}")
        else:
            keys.add(f"{item.nodeid.split('::', 1)[0]}:{name}")
    return keys


def group_shared_fixtures(items: list[pytest.Item]) -> None:
    """Tests that share an expensive fixture run on one xdist worker (``--dist loadgroup``):
    each connected set of tests (sharing a module's sentinel group, the session's Celery worker
    or shop pool...) gets one ``xdist_group``, so that fixture starts once, not once per worker.
    Tests that share nothing are spread one by one."""
    parent: dict[str, str] = {}

    def find(key: str) -> str:
        while parent.setdefault(key, key) != key:
            parent[key] = parent[parent[key]]
            key = parent[key]
        return key

    keyed = [(item, sorted(shared_fixture_keys(item))) for item in items]
    for _, keys in keyed:
        for key in keys[1:]:
            parent[find(key)] = find(keys[0])
    for item, keys in keyed:
        if keys and item.get_closest_marker("xdist_group") is None:
            item.add_marker(pytest.mark.xdist_group(find(keys[0])))


def group_of(item: pytest.Item) -> str | None:
    marker = item.get_closest_marker("xdist_group")
    return None if marker is None else str(marker.args[0])


def largest_groups_first(items: list[pytest.Item]) -> None:
    """Under xdist, the groups first, the largest first, then the rest in their order: xdist
    hands out work in collection order, and a long group started last would run on one
    worker while the others sit idle."""
    groups = {item: group_of(item) for item in items}
    sizes = Counter(group for group in groups.values() if group is not None)
    items.sort(key=lambda item: -sizes[groups[item]] if groups[item] else 0)


#: Fixtures that give a test the database. pytest-django refuses a query from a test without
#: one of them (or the ``django_db`` mark), so every test that touches the database is found.
DATABASE_FIXTURES = frozenset(
    {
        "db",
        "transactional_db",
        "django_db_setup",
        "live_server",
        "django_db_reset_sequences",
        "django_db_serialized_rollback",
    }
)

#: Tests off the wire: they send nothing to a server that the tests marked ``wire`` do not
#: send (the Valkey leg of CI runs only ``-m wire``). Each entry: a path prefix, and why.
OFF_THE_WIRE: dict[str, str] = {
    "tests/engine/test_plans.py": "scripted replies, no server",
    "tests/engine/test_limits_plans.py": "scripted replies, no server",
    "tests/engine/test_lane_plans.py": "scripted replies, no server",
    "tests/engine/test_policy.py": "scripted replies, no server",
    "tests/simulation/": "simulate(): no server",
    "tests/test_demo_simulated.py": "simulate(): no server",
    "tests/test_settings.py": "settings and input validation",
    "tests/test_checks.py": "system checks",
    "tests/test_public_api.py": "import paths",
    "tests/test_import_rules.py": "the import rules, read from the source",
    "tests/test_optional_imports.py": "imports with optional libraries blocked",
    "tests/test_demo.py": "the demo's commands: the engine calls tests/locking sends",
    "tests/test_demo_buy_endpoint.py": "the demo's view on a server: tests/request_locks",
    "tests/jobs/test_celery": "Celery orchestration: its locks are tests/locking's calls",
    "tests/jobs/test_rq.py": "RQ orchestration: its locks are tests/locking's calls",
    "tests/jobs/test_unique_rq.py": "RQ orchestration: the notes are tests/jobs/test_unique_notes",
    "tests/jobs/test_unique_tasks.py": "db_worker orchestration: the notes are test_unique_notes",
    "tests/jobs/test_django_tasks.py": "db_worker orchestration",
    "tests/jobs/test_redlock_run": "process trees under redlock run: tests/locking's calls",
    "tests/operations/test_admin_browser.py": "a browser over the admin: test_admin's pages",
    "tests/observability/test_debug_toolbar_browser.py": "a browser over the toolbar panel",
    "tests/observability/test_prometheus_scrape.py": "gunicorn scraped: test_prometheus_metrics",
    "tests/request_locks/test_idempotency_live.py": "gunicorn: test_idempotency's records",
}


def uses_database(item: pytest.Item) -> bool:
    """True if ``item`` has the ``django_db`` mark or a database fixture in its closure."""
    info = getattr(item, "_fixtureinfo", None)
    closure = set(info.names_closure) if info is not None else set()
    return item.get_closest_marker("django_db") is not None or bool(closure & DATABASE_FIXTURES)


def mark_legs(items: list[pytest.Item]) -> None:
    """``database`` on each test that touches the database (the PostgreSQL leg runs
    ``-m database``); ``wire`` on each test not listed in :data:`OFF_THE_WIRE` (the Valkey
    leg runs ``-m wire``). The SQLite leg runs everything."""
    for item in items:
        path = item.nodeid.split("::", 1)[0]
        if uses_database(item):
            item.add_marker(pytest.mark.database)
        if not path.startswith(tuple(OFF_THE_WIRE)):
            item.add_marker(pytest.mark.wire)


@pytest.hookimpl(tryfirst=True)  # before xdist reads the groups
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The xdist groups and the legs' marks; tests marked ``slow`` run only in the long
    profile: ``--long`` or REDLOCK_LONG=1 (which also lengthens the fault scenarios,
    tests/faults/conftest.py)."""
    group_shared_fixtures(items)
    if hasattr(config, "workerinput"):  # an xdist worker
        largest_groups_first(items)
    mark_legs(items)
    if config.getoption("--long") or os.environ.get("REDLOCK_LONG") == "1":
        return
    skip = pytest.mark.skip(reason="long profile: run with --long")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def session_nodes(redis_node_factory_session: Any) -> RedisNodes:
    """Five nodes shared by the whole session."""
    nodes: RedisNodes = redis_node_factory_session(5)
    return nodes


@pytest.fixture(scope="session", autouse=True)
def _session_redlock(session_nodes: RedisNodes) -> Iterator[None]:
    urls = session_nodes.urls
    aliases = {
        "default": {"NODES": urls[:1], "TTL": 5.0, "KEY_PREFIX": "t1:"},
        "multi": {"NODES": urls[:3], "TTL": 5.0, "KEY_PREFIX": "t3:"},
        "five": {"NODES": urls, "TTL": 5.0, "KEY_PREFIX": "t5:"},
    }
    SESSION_ALIASES.clear()
    SESSION_ALIASES.update(aliases)
    old = getattr(settings, "REDLOCK", None)
    settings.REDLOCK = dict(aliases)
    locks.reset()
    yield
    locks.reset()
    settings.REDLOCK = old


@pytest.fixture(autouse=True)
def _collect_what_the_test_let_pass(request: pytest.FixtureRequest) -> Iterator[None]:
    """A test that lets unraisable exceptions pass (an interrupted connect leaves its socket to
    the garbage collector: an "unclosed socket" ResourceWarning) has its garbage collected
    before it ends, under its own filter. Else the warning surfaces in a later test of the
    same worker, which allows none (CI saw one at a fault test's setup). The library's
    background threads (give-backs, reconnects) are let end first: one still running when the
    test's aliases closed drops its connection when it ends, after the collection (CI saw
    that too, at the setup of the test after a long fault test)."""
    yield
    marks = request.node.iter_markers("filterwarnings")
    lets_pass = any("PytestUnraisableExceptionWarning" in str(mark.args) for mark in marks)
    _LETTING_PASS["previous test"] = lets_pass
    if lets_pass:
        _background_threads_ended(within=5.0)
        gc.collect()


#: Whether the test that ran last let unclosed sockets pass (see below).
_LETTING_PASS = {"previous test": False}


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> Iterator[None]:
    """The setup of the test after one that lets unclosed sockets pass ignores them too. A
    socket of an interrupted connect can stay referenced past that test's collection (CI saw
    it freed at the next test's setup, twice, after the interrupt storms) and has nothing to
    do with the next test; anything its own call or teardown leaves is still reported."""
    if not _LETTING_PASS["previous test"]:
        return (yield)
    with warnings.catch_warnings():
        warnings.filterwarnings(
            "ignore",
            message="Exception ignored in. <socket.socket",
            category=pytest.PytestUnraisableExceptionWarning,
        )
        return (yield)


#: Threads the library starts that may outlive a test by a retry's pause (closed aliases end them)
_BACKGROUND = ("redlock-give-back", "redlock-connect")


def _background_threads_ended(within: float) -> None:
    """Join the library's background threads still running, for at most ``within`` seconds."""
    deadline = time.monotonic() + within
    for thread in threading.enumerate():
        if thread.name.startswith(_BACKGROUND):
            thread.join(max(0.0, deadline - time.monotonic()))


@pytest.fixture(autouse=True)
def _no_active_leases() -> Iterator[None]:
    """Each test starts with no active lease in this thread: a lease from acquire() that an
    earlier test never released would otherwise keep guarding FencedModel writes here."""
    context.clear()
    yield
    context.clear()


# Database connections that no later code of the test session will use or close: those opened
# by threads other than the main one (asgiref's executor under the async test client, live-server
# request threads, test workers), and those the main thread opened while an event loop ran in
# it (asyncio.run, Playwright's sync API): Django keeps a connection per thread, but per asyncio
# context while a loop runs, so once the loop is gone the main thread never sees them again.
# Django's test client turns off the request signals that would close them, so each stays open
# until the garbage collector finds it. On PostgreSQL that is a ResourceWarning at a random
# later test, or a session that keeps pytest-django from dropping the test database.
_OPENED: list[tuple[BaseDatabaseWrapper, bool]] = []
_OPENED_LOCK = threading.Lock()


def _remember_connection(connection: BaseDatabaseWrapper, **_: Any) -> None:
    with _OPENED_LOCK:
        _OPENED.append((connection, threading.current_thread() is threading.main_thread()))


connection_created.connect(_remember_connection, dispatch_uid="redlock-tests")


@pytest.fixture(autouse=True)
def _close_orphaned_connections() -> Iterator[None]:
    """Close, at the end of each test, the connections opened during it that no later code
    will use: every other thread's, and the main thread's that are not its connection now
    (opened while an event loop ran). The main thread's own connection stays (an in-memory
    SQLite database lives in it). A closed wrapper forgets its connection, so a thread that is
    reused (asgiref's executor) reconnects on its next query."""
    yield
    with _OPENED_LOCK:
        opened = list(_OPENED)
        _OPENED.clear()
    for wrapper, in_main_thread in opened:
        raw = wrapper.connection
        if raw is None or wrapper.in_atomic_block:
            continue
        if (
            in_main_thread
            and wrapper.alias in connections
            and connections[wrapper.alias] is wrapper
        ):
            continue
        wrapper.connection = None
        raw.close()


@pytest.fixture
def unique_name(request: pytest.FixtureRequest) -> str:
    """A lock name no other test uses."""
    return f"{request.node.name[:40]}:{uuid.uuid4().hex[:8]}"


@pytest.fixture
def redlock_alias() -> Iterator[Callable[..., LockManager]]:
    """``redlock_alias(nodes_or_urls, **settings) -> LockManager`` for a test-only alias."""
    added: list[str] = []

    def make(nodes: RedisNodes | list[str], **options: Any) -> LockManager:
        urls = nodes.urls if isinstance(nodes, RedisNodes) else list(nodes)
        alias = f"test-{uuid.uuid4().hex[:8]}"
        options.setdefault("KEY_PREFIX", f"{alias}:")
        settings.REDLOCK = {**settings.REDLOCK, alias: {"NODES": urls, **options}}
        added.append(alias)
        return locks[alias]

    yield make
    settings.REDLOCK = {k: v for k, v in settings.REDLOCK.items() if k not in added}
    locks.reset()
