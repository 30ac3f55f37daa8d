"""``get_or_set``/``aget_or_set`` in a project's own tests: Django's ``LocMemCache`` and
``simulate()``, no Redis (the aliases' nodes are traps: nothing may connect)."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import pytest
from django.core.cache import caches

from django_redlock.cache import aget_or_set, get_or_set
from django_redlock.testing import simulate

pytestmark = pytest.mark.usefixtures("traps")

LOCMEM = {"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}}


@pytest.fixture
def locmem(settings: Any) -> Any:
    settings.CACHES = LOCMEM
    caches["default"].clear()
    yield caches["default"]
    caches["default"].clear()


def test_threads_missing_at_once_compute_once(locmem: Any) -> None:
    """Eight threads miss one key together under simulate(): one computes (held until the
    others are waiting), all eight get its value, and a plain cache.get() reads it."""
    computes: list[int] = []
    release = threading.Event()

    def compute() -> str:
        computes.append(1)
        release.wait(10)
        return "report"

    got: list[str] = []
    with simulate():
        threads = [
            threading.Thread(target=lambda: got.append(get_or_set("k", compute, 60)))
            for _ in range(8)
        ]
        for thread in threads:
            thread.start()
        deadline = time.monotonic() + 10
        while not computes and time.monotonic() < deadline:
            time.sleep(0.005)
        release.set()
        for thread in threads:
            thread.join(10)
    assert got == ["report"] * 8 and computes == [1]
    assert locmem.get("k") == "report"


def test_a_value_is_fresh_then_stale_then_a_miss(locmem: Any) -> None:
    """A value stored fresh for 0.1 s with 1 s of grace reads fresh, then stale, then (past
    both) as a miss; get_or_set's first caller past the freshness computes its successor."""
    from django_redlock.cache.stores import store_for

    store = store_for("default", locmem)
    assert store.write("s", "v", 1, 100, 1000) is True
    found = store.read("s", 1000)
    assert found is not None and (found.value, found.stale) == ("v", False)
    time.sleep(0.15)
    found = store.read("s", 1000)
    assert found is not None and (found.value, found.stale) == ("v", True)
    time.sleep(1.0)
    assert store.read("s", 1000) is None
    values = iter(["one", "two"])
    with simulate():
        assert get_or_set("t", lambda: next(values), 0.1, stale=5) == "one"
        assert get_or_set("t", lambda: next(values), 0.1, stale=5) == "one"
        time.sleep(0.15)
        assert get_or_set("t", lambda: next(values), 0.1, stale=5) == "two"


def test_an_older_lease_never_overwrites_a_newer_value(locmem: Any) -> None:
    """The fence holds in the process's cache too: a store under an older token is refused."""
    from django_redlock.cache.stores import store_for

    store = store_for("default", locmem)
    assert store.write("f", "new", 20, 60_000, 0) is True
    assert store.write("f", "old", 10, 60_000, 0) is False
    assert locmem.get("f") == "new"


def test_the_asyncio_twin_computes_once(locmem: Any) -> None:
    """Five tasks of one loop miss together: the coroutine computes once."""
    computes: list[int] = []

    async def compute() -> str:
        computes.append(1)
        await asyncio.sleep(0.05)
        return "async"

    async def main() -> list[str]:
        return await asyncio.gather(*(aget_or_set("a", compute, 60) for _ in range(5)))

    with simulate():
        assert asyncio.run(main()) == ["async"] * 5
    assert computes == [1] and locmem.get("a") == "async"
