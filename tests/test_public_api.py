"""The public API's shape: contract import paths, old paths kept after the moves, alock() misuse,
and the system checks' registration."""

from __future__ import annotations

import asyncio
import importlib
import inspect

import pytest
from django.core import checks

from django_redlock import locks
from django_redlock.exceptions import LockNotAcquired


def test_contract_import_paths_import() -> None:
    """Every documented path imports (the shims of paths never released are gone)."""
    from django_redlock import inspection
    from django_redlock.cache import aget_or_set, get_or_set
    from django_redlock.decorators import request_lock
    from django_redlock.locking.manager import Lease, LockBlock, LockManager
    from django_redlock.middleware import RequestLockMiddleware, parse_rule, request_rules
    from django_redlock.models import FencedModel
    from django_redlock.request_locks.checks import CHECK_IDS, check_request_locks
    from django_redlock.request_locks.holding import ahold_for_request as aguard
    from django_redlock.request_locks.holding import hold_for_request as guard
    from django_redlock.request_locks.keys import KeyTemplate

    assert callable(inspection.list_locks) and callable(get_or_set) and callable(aget_or_set)
    assert callable(request_lock) and callable(guard) and callable(aguard)
    assert {Lease, LockBlock, LockManager, RequestLockMiddleware, FencedModel, KeyTemplate}
    assert callable(parse_rule) and callable(request_rules) and callable(check_request_locks)
    assert "E010" in CHECK_IDS and "E030" in CHECK_IDS
    from django_redlock.conf import IdempotencyConfig, idempotency_setting

    assert idempotency_setting() == IdempotencyConfig()
    assert "idempotency" in inspect.signature(request_lock).parameters
    for name in ("lock", "locks"):
        assert hasattr(importlib.import_module("django_redlock"), name)


def test_engine_facade_is_all_the_django_layer_needs() -> None:
    """The Django-side modules import the engine only through its facade."""
    import django_redlock.engine as engine

    for name in (
        "Engine",
        "AliasState",
        "LeaseRecord",
        "AcquireFailure",
        "quorum",
        "Keyspace",
        "RecordRead",
    ):
        assert name in engine.__all__


def test_alock_refuses_a_plain_with_and_sync_functions() -> None:
    """alock() is for `async with` and coroutine functions: blocking use fails before any
    network call, with a message that names lock() instead."""
    block = locks["default"].alock("api:alock")
    with pytest.raises(TypeError, match=r"Use lock\(\) in synchronous code"), block:
        pass  # pragma: no cover
    with pytest.raises(TypeError, match="decorate"):

        @locks["default"].alock("api:{0}")
        def job(day: str) -> None: ...  # pragma: no cover


def test_alock_decorates_coroutine_functions() -> None:
    """The same alock() decorates a coroutine function and holds the name around each call."""

    @locks["default"].alock("api:coroutine:{0}", timeout=0)
    async def job(day: str) -> str:
        with pytest.raises(LockNotAcquired):  # held by the decorator while the body runs
            await locks["default"].aacquire(f"api:coroutine:{day}", timeout=0)
        return day

    assert asyncio.run(job("monday")) == "monday"
    lease = locks["default"].acquire("api:coroutine:monday", timeout=0)  # released after it
    lease.release()


def test_checks_are_registered_under_their_own_tag() -> None:
    """`manage.py check --tag django_redlock` runs the settings and request-lock checks."""
    registered = checks.registry.registry.get_checks(include_deployment_checks=True)
    ours = {c.__name__ for c in registered if "django_redlock" in getattr(c, "tags", ())}
    assert {"check_settings", "check_deployment", "check_request_locks"} <= ours
    assert checks.registry.registry.tag_exists("django_redlock")
