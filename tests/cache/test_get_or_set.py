"""``django_redlock.cache.get_or_set`` (docs/effects.md, "Stampede-proof cache fill") on a real
Redis cache, with Django's ``RedisCache`` and django-redis: one compute for 8 processes that
miss at once, stale values served while one caller refreshes, fenced writes, errors."""

from __future__ import annotations

import asyncio
import os
import signal
import threading
import time
import uuid
from decimal import Decimal
from fractions import Fraction
from typing import Any

import pytest
from django.core.cache import cache, caches
from django.core.cache.backends.base import DEFAULT_TIMEOUT
from django.core.exceptions import ImproperlyConfigured

from django_redlock import locks, signals
from django_redlock.cache import aget_or_set, get_or_set
from django_redlock.cache.arguments import lock_name
from django_redlock.cache.stores import record_key, store_for
from django_redlock.exceptions import LockError, LockNotAcquired, NodesUnavailable
from django_redlock.testing import RedisNode
from tests.support import cache_workers as workers
from tests.support.processes import PROCESSES
from tests.support.waiting import until, until_waiting


@pytest.fixture
def key() -> str:
    return f"k-{uuid.uuid4().hex[:10]}"


def full_key(key: str) -> str:
    return store_for("default", caches["default"]).full_key(key)


# the other backend in the long profile: the single-process tests run on both
@pytest.mark.parametrize(
    "backend", [pytest.param("django", marks=pytest.mark.slow), "django-redis"], indirect=True
)
def test_eight_processes_missing_at_once_compute_once(
    backend: str, cache_node: RedisNode, key: str, settings: Any
) -> None:
    """8 processes miss one key together: one computes, the other 7 wait for its lease (all 7
    are seen waiting while the compute blocks), and all 8 return its value."""
    client = cache_node.client()
    counter = f"{key}:computes"
    args = (settings.REDLOCK, settings.CACHES, key, cache_node.url, counter, 30, None)
    with PROCESSES.Pool(8) as pool:
        results = pool.starmap_async(workers.fill_gated, [args] * 8)
        until(lambda: client.get(counter) is not None, 60, "the first compute")
        until_waiting(locks["default"], lock_name("default", full_key(key)), 7, 60)
        client.rpush(f"{counter}:gate", "go")
        values = results.get(timeout=60)
    assert int(client.get(counter)) == 1
    assert len(set(values)) == 1 and values[0].startswith("computed by ")
    assert cache.get(key) == values[0]  # readable by the backend itself


# the other backend in the long profile: the single-process tests run on both
@pytest.mark.parametrize(
    "backend", ["django", pytest.param("django-redis", marks=pytest.mark.slow)], indirect=True
)
def test_stale_value_served_at_once_while_one_refreshes(
    backend: str, cache_node: RedisNode, key: str, settings: Any
) -> None:
    """Past its timeout, within ``stale``: one of 8 processes recomputes (its compute blocks
    until the test lets it go) while the other 7 return the old value without waiting."""
    get_or_set(key, lambda: "old", 0.2, stale=60)
    time.sleep(0.3)  # past the 0.2 s timeout: stale
    client = cache_node.client()
    counter = f"{key}:computes"
    args = (settings.REDLOCK, settings.CACHES, key, cache_node.url, counter, 0.2, 60)
    with PROCESSES.Pool(8) as pool:
        results = pool.imap_unordered(_fill_gated, [args] * 8)
        first_seven = [results.next(timeout=60) for _ in range(7)]  # before the gate opens
        assert first_seven == ["old"] * 7
        client.rpush(f"{counter}:gate", "go")
        last = results.next(timeout=60)
    assert int(client.get(counter)) == 1
    assert last.startswith("computed by ")
    assert get_or_set(key, _never, 0.2, stale=60) == last


def _fill_gated(args: tuple[Any, ...]) -> str:
    return workers.fill_gated(*args)


def _never() -> str:
    raise AssertionError("compute called on a hit")


def test_older_lease_never_overwrites_a_newer_value(
    backend: str, cache_node: RedisNode, key: str, settings: Any, redlock_alias: Any
) -> None:
    """A process paused (SIGSTOP) while computing, past its lease's TTL: meanwhile the test
    computes and stores under a newer lease; the resumed process's value is refused by the
    fenced write, and the newer value stays (for a plain cache.get too)."""
    manager = redlock_alias(settings.REDLOCK["default"]["NODES"], TTL=0.5)
    ready = f"{key}:ready"
    client = cache_node.client()
    args = (settings.REDLOCK, settings.CACHES, key, cache_node.url, ready, manager.alias)
    with PROCESSES.Pool(1) as pool:
        old = pool.apply_async(workers.fill_paused, args)
        until(lambda: client.get(ready) is not None, 60, "the paused compute")
        pid = int(client.get(ready))
        os.kill(pid, signal.SIGSTOP)
        try:
            time.sleep(1.0)  # its 0.5 s lease runs out while it is stopped
            assert get_or_set(key, lambda: "new", 30, using=manager.alias) == "new"
        finally:
            os.kill(pid, signal.SIGCONT)
        assert old.get(timeout=60) == "old"  # its caller gets what it computed
    assert cache.get(key) == "new"
    assert get_or_set(key, _never, 30, using=manager.alias) == "new"


def test_fenced_write_refuses_an_equal_or_lower_token(backend: str, key: str) -> None:
    """The write script itself: a lower or equal token leaves the value; a higher one (by
    more digits too: tokens are compared as numbers, not as text) replaces it."""
    store = store_for("default", caches["default"])
    fk = store.full_key(key)
    assert store.write(fk, "t9", 9, 30_000, 0)
    assert not store.write(fk, "t8", 8, 30_000, 0)
    assert not store.write(fk, "t9 again", 9, 30_000, 0)
    assert store.write(fk, "t10", 10, 30_000, 0)
    assert cache.get(key) == "t10"


def test_compute_raising_stores_nothing_and_releases(backend: str, key: str) -> None:
    """The exception reaches the caller; nothing is stored and the key's lock is free."""
    with pytest.raises(ZeroDivisionError):
        get_or_set(key, lambda: 1 / 0, 30)
    assert cache.get(key, "absent") == "absent"
    locks["default"].acquire(lock_name("default", full_key(key)), rw="write", timeout=0).release()


def test_waiter_computes_when_the_computing_caller_raises(backend: str, key: str) -> None:
    """A waiter woken by the release of a caller whose compute raised finds no value, takes
    the write lease itself and computes (the error is not shared)."""
    started, go = threading.Event(), threading.Event()

    def failing() -> str:
        started.set()
        go.wait(30)
        raise RuntimeError("boom")

    errors: list[BaseException] = []

    def first() -> None:
        try:
            get_or_set(key, failing, 30)
        except RuntimeError as exc:
            errors.append(exc)

    thread = threading.Thread(target=first)
    thread.start()
    assert started.wait(30)
    result: list[str] = []
    waiter = threading.Thread(target=lambda: result.append(get_or_set(key, lambda: "b", 30)))
    waiter.start()
    until_waiting(locks["default"], lock_name("default", full_key(key)), 1, 30)
    go.set()
    thread.join(30)
    waiter.join(30)
    assert len(errors) == 1 and result == ["b"]
    assert cache.get(key) == "b"


def test_waiters_do_not_queue_for_the_write_lease(backend: str, key: str) -> None:
    """Three callers that wait for a compute are let in together by its release and read the
    value: only the computing caller ever took the key's write lease."""
    name = lock_name("default", full_key(key))
    writes: list[int] = []

    def count(sender: Any, **kwargs: Any) -> None:
        if kwargs["name"] == name and kwargs["lease"].kind == "write":
            writes.append(kwargs["lease"].token)

    started, go = threading.Event(), threading.Event()

    def slow() -> str:
        started.set()
        go.wait(30)
        return "v"

    signals.lock_acquired.connect(count)
    try:
        first = threading.Thread(target=get_or_set, args=(key, slow, 30))
        first.start()
        assert started.wait(30)
        got: list[str] = []
        others = [
            threading.Thread(target=lambda: got.append(get_or_set(key, _never, 30)))
            for _ in range(3)
        ]
        for thread in others:
            thread.start()
        until_waiting(locks["default"], name, 3, 30)
        go.set()
        for thread in [first, *others]:
            thread.join(30)
    finally:
        signals.lock_acquired.disconnect(count)
    assert got == ["v"] * 3
    assert len(writes) == 1


def test_a_value_stored_before_the_lease_is_won_is_not_computed_again(
    backend: str, key: str
) -> None:
    """Between the caller's miss and its write lease another fill stored the value (here: a
    plain cache.set from the lock_acquired signal): the caller reads again under the lease
    and returns it without computing."""
    name = lock_name("default", full_key(key))

    def fill_meanwhile(sender: Any, **kwargs: Any) -> None:
        if kwargs["name"] == name:
            cache.set(key, "stored meanwhile", 30)

    signals.lock_acquired.connect(fill_meanwhile)
    try:
        assert get_or_set(key, _never, 30) == "stored meanwhile"
    finally:
        signals.lock_acquired.disconnect(fill_meanwhile)


def test_hit_returns_the_stored_value_readable_by_the_backend(backend: str, key: str) -> None:
    """Values of every kind round-trip through the backend's own encoding (Django's stores
    ints unpickled; None is a value, not a miss)."""
    for i, value in enumerate([{"a": [1, 2]}, 7, None, "text", b"bytes"]):
        assert get_or_set(f"{key}{i}", lambda value=value: value, 30) == value
        assert cache.get(f"{key}{i}", "absent") == value
        assert get_or_set(f"{key}{i}", _never, 30) == value


def test_timeouts_become_key_lifetimes(backend: str, cache_node: RedisNode, key: str) -> None:
    """``timeout`` (plus ``stale``) is the key's lifetime in Redis; None keeps it forever;
    DEFAULT_TIMEOUT is the cache's own; past ``timeout + stale`` it is a miss."""
    client = cache_node.client()
    get_or_set(key, lambda: 1, 10, stale=5)
    assert 14_000 < client.pttl(full_key(key)) <= 15_000
    assert client.pttl(record_key(full_key(key))) > 14_000
    get_or_set(f"{key}f", lambda: 1, None)
    assert client.pttl(full_key(f"{key}f")) == -1
    get_or_set(f"{key}d", lambda: 1, DEFAULT_TIMEOUT)  # the cache's own TIMEOUT: 300 s
    assert 299_000 < client.pttl(full_key(f"{key}d")) <= 300_000
    get_or_set(f"{key}s", lambda: "first", 0.1, stale=0.1)
    time.sleep(0.3)
    assert get_or_set(f"{key}s", lambda: "second", 0.1, stale=0.1) == "second"


def test_stale_grace_is_each_callers_own(
    backend: str, key: str, settings: Any, redlock_alias: Any
) -> None:
    """A value stored with ``stale=30`` is, past its timeout, served stale only to callers
    that accept that much staleness: while another caller refreshes it (the test holds the
    write lease), one with ``stale=30`` gets it at once, ones without ``stale`` or with
    ``stale=0.05`` wait for the refresh (here until their alias's TIMEOUT)."""
    manager = redlock_alias(settings.REDLOCK["default"]["NODES"], TIMEOUT=0.3)
    get_or_set(key, lambda: "first", 0.1, stale=30, using=manager.alias)
    time.sleep(0.3)  # 0.2 s past its timeout
    with workers.held_by_another_thread(manager, lock_name("default", full_key(key))):
        assert get_or_set(key, _never, 0.1, stale=30, using=manager.alias) == "first"
        for stale in (None, 0.05):
            with pytest.raises(LockNotAcquired):
                get_or_set(key, _never, 0.1, stale=stale, using=manager.alias)
    assert get_or_set(key, lambda: "second", 0.1, using=manager.alias) == "second"


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"timeout": -1}, ValueError, "more than 0 seconds"),
        ({"timeout": 0}, ValueError, "store nothing"),
        ({"timeout": float("inf")}, ValueError, "finite"),
        ({"timeout": "60"}, TypeError, "number of seconds"),
        ({"timeout": True}, TypeError, "number of seconds"),
        ({"stale": -1}, ValueError, "0 or more"),
        ({"stale": "5"}, TypeError, "stale must be"),
        ({"stale": 5, "timeout": None}, ValueError, "finite timeout"),
        ({"timeout": 1e15}, ValueError, "at most 1e\\+12 seconds"),
        ({"timeout": 2**63}, ValueError, "at most 1e\\+12 seconds"),
        ({"timeout": 30, "stale": 1e18}, ValueError, "at most 1e\\+12 seconds"),
        ({"timeout": 10**12, "stale": 1}, ValueError, "at most 1e\\+12 seconds"),
        ({"compute": 42}, TypeError, "callable"),
        ({"compute": "coroutine"}, TypeError, "coroutine function"),
        ({"key": 5}, TypeError, "non-empty str"),
        ({"key": ""}, TypeError, "non-empty str"),
        ({"cache": "nope"}, ImproperlyConfigured, "CACHES has no alias 'nope'"),
        ({"using": "nope"}, ImproperlyConfigured, "REDLOCK has no alias 'nope'"),
    ],
)
def test_bad_input_fails_before_anything_is_written(
    backend: str, cache_node: RedisNode, key: str, kwargs: dict[str, Any], error: Any, message: str
) -> None:
    """Each bad argument is a clear error, raised before compute runs or Redis is written."""
    calls: list[int] = []

    async def coroutine() -> int:
        return 1

    def compute() -> int:
        calls.append(1)
        return 1

    arguments: dict[str, Any] = {"key": key, "compute": compute, "timeout": 30, **kwargs}
    if arguments["compute"] == "coroutine":
        arguments["compute"] = coroutine
    client = cache_node.client()
    before = set(client.scan_iter(count=1000))
    with pytest.raises(error, match=message):
        get_or_set(
            arguments.pop("key"), arguments.pop("compute"), arguments.pop("timeout"), **arguments
        )
    assert calls == []
    # no key written (the node's key count is no measure: other tests' keys expire meanwhile)
    assert set(client.scan_iter(count=1000)) - before == set()


def test_other_cache_backends_are_refused(settings: Any, cache_node: RedisNode, key: str) -> None:
    """The file-based cache (and any backend but the two Redis ones and locmem, or
    django-redis with a client that wraps or spreads values) is an ImproperlyConfigured naming
    the supported backends."""
    settings.CACHES = {
        "default": {"BACKEND": "django.core.cache.backends.dummy.DummyCache"},
        "herd": {
            "BACKEND": "django_redis.cache.RedisCache",
            "LOCATION": cache_node.url,
            "OPTIONS": {"CLIENT_CLASS": "django_redis.client.HerdClient"},
        },
    }
    with pytest.raises(ImproperlyConfigured, match=r"DummyCache.*Supported: django\.core"):
        get_or_set(key, _never, 30)
    with pytest.raises(ImproperlyConfigured, match="HerdClient"):
        get_or_set(key, _never, 30, cache="herd")
    assert caches["default"].get(key) is None


def test_django_redis_compressed_values_stay_readable(
    settings: Any, cache_node: RedisNode, key: str
) -> None:
    """django-redis with a compressor: the stored value is compressed as its own set()
    would, so its get() reads it."""
    settings.CACHES = {
        "default": {
            "BACKEND": "django_redis.cache.RedisCache",
            "LOCATION": cache_node.url,
            "OPTIONS": {"COMPRESSOR": "django_redis.compressors.zlib.ZlibCompressor"},
        }
    }
    value = "x" * 10_000
    assert get_or_set(key, lambda: value, 30) == value
    raw = cache_node.client().get(full_key(key))
    assert raw is not None and len(raw) < 1_000
    assert cache.get(key) == value


def test_waiters_give_up_after_the_alias_timeout(
    backend: str, key: str, settings: Any, redlock_alias: Any
) -> None:
    """A waiter waits for the computing caller up to its alias's TIMEOUT, then raises
    LockNotAcquired (it does not compute beside the lease holder)."""
    manager = redlock_alias(settings.REDLOCK["default"]["NODES"], TIMEOUT=0.3)
    with (
        workers.held_by_another_thread(manager, lock_name("default", full_key(key))),
        pytest.raises(LockNotAcquired),
    ):
        get_or_set(key, _never, 30, using=manager.alias)


def test_a_compute_longer_than_the_ttl_keeps_its_lease(
    backend: str, key: str, settings: Any, redlock_alias: Any
) -> None:
    """The write lease is auto-extended while compute runs: a compute of 2.5 s on an alias
    whose TTL is 1 s still holds the key, so a caller arriving meanwhile waits and reads its
    value instead of computing a second time. (TTL 1 s and a generous NODE_TIMEOUT: with 0.3 s
    and 50 ms, a loaded machine delayed a renewal past the TTL now and then.)"""
    manager = redlock_alias(
        settings.REDLOCK["default"]["NODES"], TTL=1.0, TIMEOUT=30, NODE_TIMEOUT=2.0
    )
    computes: list[str] = []
    started = threading.Event()

    def slow() -> str:
        computes.append("slow")
        started.set()
        time.sleep(2.5)
        return "slow"

    first = threading.Thread(
        target=get_or_set, args=(key, slow, 30), kwargs={"using": manager.alias}
    )
    first.start()
    assert started.wait(30)

    def second() -> str:
        computes.append("second")
        return "second"

    assert get_or_set(key, second, 30, using=manager.alias) == "slow"
    first.join(30)
    assert computes == ["slow"]


def test_a_compute_asking_for_its_own_key_fails_at_once(backend: str, key: str) -> None:
    """get_or_set of a key inside that key's compute would wait for its own lease until the
    alias's TIMEOUT; it is a LockError at once, and the outer call stores nothing."""

    def recursive() -> str:
        return get_or_set(key, _never, 30)

    with pytest.raises(LockError, match="it would wait for itself"):
        get_or_set(key, recursive, 30)
    assert cache.get(key, "absent") == "absent"


def test_django_redis_sentinel_client(settings: Any, redis_sentinel_group: Any, key: str) -> None:
    """django-redis's SentinelClient: the value is stored on the master the sentinels name
    and read back by the backend's own get(), which reads from a replica: once replication
    (asynchronous) has brought it there."""
    group = redis_sentinel_group
    settings.CACHES = {
        "default": {
            "BACKEND": "django_redis.cache.RedisCache",
            "LOCATION": f"redis://{group.service}/0",
            "OPTIONS": {
                "CLIENT_CLASS": "django_redis.client.SentinelClient",
                "CONNECTION_FACTORY": "django_redis.pool.SentinelConnectionFactory",
                "SENTINELS": [("127.0.0.1", s.port) for s in group.sentinels],
            },
        }
    }
    assert get_or_set(key, lambda: {"from": "sentinel"}, 30) == {"from": "sentinel"}
    assert group.master.client().exists(full_key(key), record_key(full_key(key))) == 2
    until(lambda: cache.get(key) == {"from": "sentinel"}, 10, "the value read from a replica")
    cache.client.disconnect()


def test_a_stale_value_is_served_while_the_lock_nodes_are_down(
    backend: str, key: str, redis_node_factory: Any, redlock_alias: Any, caplog: Any
) -> None:
    """With the lock alias's node down, a stale value within its grace is returned (with a
    warning, not refreshed) instead of NodesUnavailable, by both twins; a hit needs no lock;
    a miss (nothing to serve) still raises NodesUnavailable, and nothing is computed."""
    lock_node = redis_node_factory(1)[0]
    manager = redlock_alias([lock_node.url], TTL=1.0, TIMEOUT=2, NODE_TIMEOUT=0.2)
    using = manager.alias
    assert get_or_set(key, lambda: "fresh", 30, using=using) == "fresh"
    assert get_or_set(f"{key}s", lambda: "old", 0.1, stale=60, using=using) == "old"
    time.sleep(0.2)
    lock_node.kill()
    with caplog.at_level("WARNING", logger="django_redlock"):
        assert get_or_set(key, _never, 30, using=using) == "fresh"
        assert get_or_set(f"{key}s", _never, 0.1, stale=60, using=using) == "old"
        assert asyncio.run(aget_or_set(f"{key}s", _never, 0.1, stale=60, using=using)) == "old"
    assert sum("serving its stale value" in r.getMessage() for r in caplog.records) == 2
    with pytest.raises(NodesUnavailable):
        get_or_set(f"{key}m", _never, 30, using=using)
    with pytest.raises(NodesUnavailable):
        get_or_set(f"{key}s", _never, 0.1, using=using)  # no grace of its own: a miss


def test_the_longest_lifetime_and_exact_number_types(
    backend: str, cache_node: RedisNode, key: str
) -> None:
    """``timeout + stale`` up to 1e12 seconds is stored (Redis keeps it); a Fraction or a
    Decimal is taken as Django's cache takes it."""
    assert get_or_set(key, lambda: "long", 10**12) == "long"
    full = full_key(key)
    assert cache_node.client().pttl(full) > 10**14
    assert get_or_set(f"{key}f", lambda: "f", Fraction(3, 2), stale=Decimal("0.5")) == "f"
    assert 1500 < cache_node.client().pttl(full_key(f"{key}f")) <= 2000


def test_no_key_of_the_cache_api_is_a_fence_record(backend: str, key: str) -> None:
    """The fence record's key is out of the cache API's reach: a user's value at a key that
    ends like a record's (the old ``<key>|redlock:fence``) is neither overwritten by a fill
    of ``key`` nor read as its record, and django-redis's ``keys()`` lists only the value."""
    cache.set(f"{key}|redlock:fence", {"user": "data"}, 300)
    assert get_or_set(key, lambda: "mine", 30) == "mine"
    assert cache.get(f"{key}|redlock:fence") == {"user": "data"}
    cache.set(f"{key}|redlock:fence", "user", 300)
    assert get_or_set(key, _never, 30) == "mine"
    if backend == "django-redis":
        assert sorted(cache.keys(f"{key}*")) == sorted([key, f"{key}|redlock:fence"])
