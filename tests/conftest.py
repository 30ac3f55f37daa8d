"""Shared fixtures: real redis-server nodes wired into ``settings.REDLOCK``.

Session nodes (cheap, shared): alias ``default`` = 1 node, ``multi`` = 3 nodes, ``five`` = 5
nodes, each with its own key prefix. Tests that inject faults start their own nodes with
``redlock_alias(nodes, ...)``, which registers a fresh alias for the test only.
"""

from __future__ import annotations

import os
import threading
import uuid
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


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Tests marked ``slow`` run only in the long profile: ``--long`` or REDLOCK_LONG=1 (which
    also lengthens the fault scenarios, tests/faults/conftest.py)."""
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
