"""The bad-input table (``docs/bad-input.md``): one test per row. Each checks the typed error
and that nothing was lost or left behind (no key written, no row changed, no SQL run).

Real redis-server processes and the real test database only.
"""

from __future__ import annotations

import contextlib
import math
import threading
import time
import unicodedata
from collections.abc import Callable
from typing import Any

import pytest
import redis
from django.core.exceptions import ImproperlyConfigured
from django.db import connection
from django.test.utils import CaptureQueriesContext

from django_redlock import locks
from django_redlock.checks import _topology
from django_redlock.conf import parse_alias
from django_redlock.exceptions import LockLost, LockNotAcquired, NodesUnavailable
from django_redlock.inspection import get_lock, list_locks
from django_redlock.locking.manager import LockManager
from django_redlock.testing import RedisNodes, server_version
from tests.support.redis_acl import ACL_COMMANDS, acl_user_urls
from tests.support.shop_workload import lock_keys

Nodes = Callable[..., RedisNodes]
Alias = Callable[..., LockManager]
URL = "redis://127.0.0.1:6399/0"

# -- settings ---------------------------------------------------------------------------------

BAD_SETTINGS = {
    "nodes-empty": {"NODES": []},
    "nodes-a-string": {"NODES": URL},
    "node-not-a-url": {"NODES": ["http://127.0.0.1:6379"]},
    "node-bad-port": {"NODES": ["redis://127.0.0.1:notaport/0"]},
    "node-no-host": {"NODES": ["redis:///0"]},
    "node-unix-no-path": {"NODES": ["unix://"]},
    "node-an-int": {"NODES": [6379]},
    "ttl-zero": {"NODES": [URL], "TTL": 0},
    "ttl-negative": {"NODES": [URL], "TTL": -1},
    "ttl-nan": {"NODES": [URL], "TTL": math.nan},
    "ttl-inf": {"NODES": [URL], "TTL": math.inf},
    "ttl-string": {"NODES": [URL], "TTL": "5"},
    "ttl-bool": {"NODES": [URL], "TTL": True},
    "unknown-key": {"NODES": [URL], "TTLS": 5},
    "prefix-glob": {"NODES": [URL], "KEY_PREFIX": "app*:"},
    "drift-1": {"NODES": [URL], "DRIFT_FACTOR": 1.0},
    "node-port-0": {"NODES": ["redis://127.0.0.1:0/0"]},
    "node-db-not-a-number": {"NODES": ["redis://127.0.0.1:6399/O"]},
    "node-bad-query": {"NODES": ["redis://127.0.0.1:6399/0?socket_timeout=abc"]},
    "ttl-no-validity": {"NODES": [URL], "TTL": 0.002},
    "drift-over-half": {"NODES": [URL], "DRIFT_FACTOR": 0.9999},
    "node-timeout-tiny": {"NODES": [URL], "NODE_TIMEOUT": 1e-9},
    "node-timeout-huge": {"NODES": [URL], "NODE_TIMEOUT": 1e300},
    "retry-delay-tiny": {"NODES": [URL], "RETRY_DELAY": 1e-12},
    "fan-out-unknown": {"NODES": [URL], "FAN_OUT": "some"},
}


@pytest.mark.parametrize("raw", list(BAD_SETTINGS.values()), ids=list(BAD_SETTINGS))
def test_bad_settings_raise_improperly_configured(
    raw: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each bad alias setting raises ImproperlyConfigured naming the alias and the key, both
    when parsed and at the first ``locks[alias]``, before any connection is made."""
    from django.conf import settings

    with pytest.raises(ImproperlyConfigured, match=r"REDLOCK\['bad'\]"):
        parse_alias("bad", raw)
    monkeypatch.setattr(settings, "REDLOCK", {**settings.REDLOCK, "bad": raw})
    locks.reset()
    try:
        with pytest.raises(ImproperlyConfigured, match=r"REDLOCK\['bad'\]"):
            locks["bad"]
    finally:
        monkeypatch.undo()
        locks.reset()


def test_huge_ttl_setting_is_refused_before_any_write(
    redis_node_factory: Nodes, redlock_alias: Alias
) -> None:
    """A TTL so large that its milliseconds pass 2**53 is refused by the settings parser
    (ImproperlyConfigured naming the alias and TTL), before any connection: no key is
    written."""
    nodes = redis_node_factory(1)
    with pytest.raises(ImproperlyConfigured, match="'TTL'"):
        redlock_alias(nodes, TTL=1e300)
    assert nodes[0].client().dbsize() == 0  # not even the fence hash


@pytest.mark.parametrize(
    ("urls", "check_id"),
    [([URL, URL.replace("127.0.0.1", "localhost") + "?db=1", URL], "W002"),
     ([URL, "redis://127.0.0.1:6398/0"], "W001")],
    ids=["duplicate-nodes", "even-count"],
)  # fmt: skip
def test_duplicate_or_even_nodes_are_deploy_warnings(urls: list[str], check_id: str) -> None:
    """Duplicate nodes (the same host:port twice, whatever the loopback name or db) and an
    even node count are not refused at runtime but reported by ``manage.py check --deploy``
    (W002, W001)."""
    config = parse_alias("topo", {"NODES": urls})
    ids = [m.id for m in _topology(config)]
    assert f"django_redlock.{check_id}" in ids
    if check_id == "W002":  # one server named three ways: one warning, all three counted
        assert [m.msg for m in _topology(config) if m.id == "django_redlock.W002"] == [
            "REDLOCK['topo'] lists localhost:6399 3 times: its votes are not independent."
        ]


# -- lock arguments -----------------------------------------------------------------------------

BAD_NAMES: dict[str, tuple[Any, type[Exception]]] = {
    "none": (None, TypeError),
    "bytes": (b"name", TypeError),
    "int": (5, TypeError),
    "empty": ("", ValueError),
    "too-long": ("x" * 513, ValueError),
    "reserved": ("__fence__", ValueError),
}


@pytest.mark.parametrize("name,error", list(BAD_NAMES.values()), ids=list(BAD_NAMES))
def test_bad_names_are_refused_before_any_write(
    name: Any, error: type[Exception], session_nodes: RedisNodes
) -> None:
    """Non-str, empty, longer than 512 characters, or starting with ``__`` (reserved for the
    library's own keys): TypeError/ValueError from acquire, lock(), force_release and the
    async twin, and no key is written."""
    manager = locks["multi"]
    clients = [n.client() for n in session_nodes[:3]]
    before = sorted(lock_keys(clients, "t3:"))
    with pytest.raises(error):
        manager.acquire(name, timeout=0)
    with pytest.raises(error):
        manager.force_release(name)
    with pytest.raises(error), manager.lock(name, timeout=0):
        pass  # pragma: no cover
    assert sorted(lock_keys(clients, "t3:")) == before


def test_lone_surrogate_name_is_a_clear_value_error(session_nodes: RedisNodes) -> None:
    """A name with a lone surrogate (a JSON body can carry ``\\ud800``) cannot be encoded
    as UTF-8: a plain ValueError saying so, counting positions in the name (not a
    UnicodeEncodeError whose position counts the key prefix), before any write."""
    manager = locks["multi"]
    clients = [n.client() for n in session_nodes[:3]]
    before = sorted(lock_keys(clients, "t3:"))
    calls: list[Callable[[], Any]] = [
        lambda: manager.acquire("ok\ud800", timeout=0),
        lambda: manager.force_release("ok\ud800"),
        lambda: manager.lock("ok\ud800", timeout=0).__enter__(),
    ]
    for call in calls:
        with pytest.raises(ValueError) as info:
            call()
        assert type(info.value) is ValueError, repr(info.value)
        assert "lone surrogate" in str(info.value) and "position 2" in str(info.value)
        assert "encodable as UTF-8" in str(info.value)
    assert sorted(lock_keys(clients, "t3:")) == before


BAD_ARGS: dict[str, tuple[dict[str, Any], type[Exception]]] = {
    "ttl-zero": ({"ttl": 0}, ValueError),
    "ttl-negative": ({"ttl": -1}, ValueError),
    "ttl-nan": ({"ttl": math.nan}, ValueError),
    "ttl-inf": ({"ttl": math.inf}, ValueError),
    "ttl-huge": ({"ttl": 1e300}, ValueError),
    "ttl-over-31-years": ({"ttl": 1e12, "auto_extend": True}, ValueError),
    "ttl-string": ({"ttl": "5"}, TypeError),
    "ttl-bool": ({"ttl": True}, TypeError),
    "ttl-2ms": ({"ttl": 0.002}, ValueError),
    "timeout-negative": ({"timeout": -1}, ValueError),
    "timeout-nan": ({"timeout": math.nan}, ValueError),
    "timeout-string": ({"timeout": "1"}, TypeError),
    "max-hold-zero": ({"max_hold": 0, "auto_extend": True}, ValueError),
}


@pytest.mark.parametrize("kwargs,error", list(BAD_ARGS.values()), ids=list(BAD_ARGS))
def test_bad_acquire_arguments_are_refused_before_any_write(
    kwargs: dict[str, Any], error: type[Exception], unique_name: str, session_nodes: RedisNodes
) -> None:
    """ttl/timeout/max_hold out of range or of the wrong type: TypeError/ValueError before any
    network call; the name stays free."""
    manager = locks["multi"]
    kwargs = {"timeout": 0, **kwargs}
    with pytest.raises(error):
        manager.acquire(unique_name, **kwargs)
    clients = [n.client() for n in session_nodes[:3]]
    assert not any(c.exists(f"t3:{unique_name}") for c in clients)


ODD_NAMES = {
    "nul": "a\x00b",
    "cr-lf": "a\r\nSET x y\r\n",
    "star": "a*",
    "question": "a?",
    "brackets": "[a]",
    "backslash": "a\\",
    "space": "a b",
    "emoji": "lock-\U0001f512",
}


def test_odd_names_round_trip_without_collisions(
    redis_node_factory: Nodes, redlock_alias: Alias
) -> None:
    """NUL, CR/LF (no protocol injection), glob characters, spaces and non-BMP characters are
    allowed: each name is held at the same time as its plain neighbour ``a`` (no collision),
    listed and shown under its exact name, and released; nothing else is touched."""
    nodes = redis_node_factory(3)
    manager = redlock_alias(nodes, TTL=10.0)
    plain = manager.acquire("a", timeout=0)
    leases = {label: manager.acquire(name, timeout=0) for label, name in ODD_NAMES.items()}
    alias = manager.alias
    listed = sorted(info.name for info in list_locks(using=[alias]).locks)
    assert listed == sorted([*ODD_NAMES.values(), "a"])
    for label, name in ODD_NAMES.items():
        info, errors = get_lock(alias, name)
        assert info is not None and info.token == leases[label].token and not errors
        with pytest.raises(LockNotAcquired):
            manager.acquire(name, timeout=0)
    assert nodes[0].client().get("x") is None  # CR/LF did not inject a command
    assert all(lease.release() for lease in leases.values())
    assert plain.validity > 0 and plain.release() is True
    assert lock_keys([n.client() for n in nodes], manager.config.key_prefix) == []


def test_unicode_normal_forms_are_distinct_names(
    redis_node_factory: Nodes, redlock_alias: Alias
) -> None:
    """``é`` as NFC (U+00E9) and NFD (``e`` + U+0301) are different strings and therefore
    different locks: both are held at once, each releases only itself. (Names are not
    normalised: an application that wants them to collide must normalise.)"""
    nodes = redis_node_factory(1)
    manager = redlock_alias(nodes, TTL=10.0)
    nfc, nfd = unicodedata.normalize("NFC", "caf\u00e9"), unicodedata.normalize("NFD", "caf\u00e9")
    assert nfc != nfd
    a = manager.acquire(nfc, timeout=0)
    b = manager.acquire(nfd, timeout=0)
    assert a.token != b.token
    assert sorted(i.name for i in list_locks(using=[manager.alias]).locks) == sorted([nfc, nfd])
    assert a.release() is True
    assert get_lock(manager.alias, nfd)[0] is not None
    assert b.release() is True


# -- fencing tokens ---------------------------------------------------------------------------

BAD_TOKENS: dict[str, tuple[Any, type[Exception]]] = {
    "str": ("5", TypeError),
    "float": (5.0, TypeError),
    "bool": (True, TypeError),
    "negative": (-1, ValueError),
    "2**53": (2**53, ValueError),
}


@pytest.mark.django_db
@pytest.mark.parametrize("token,error", list(BAD_TOKENS.values()), ids=list(BAD_TOKENS))
def test_bad_fence_tokens_raise_before_any_sql(token: Any, error: type[Exception]) -> None:
    """``save(fence_token=)``, ``delete(fence_token=)``, ``claim(token=)`` and ``fenced()``
    with a str, float, bool, negative or >= 2**53 token raise TypeError/ValueError before any
    SQL is sent, and the row is unchanged."""
    from testproject.inventory.models import Product

    product = Product.objects.create(name="tok", stock=5)
    product.stock = 1
    with CaptureQueriesContext(connection) as queries:
        with pytest.raises(error):
            product.save(fence_token=token)
        with pytest.raises(error):
            product.delete(fence_token=token)
        with pytest.raises(error):
            Product.objects.claim(pk=product.pk, token=token)
        with pytest.raises(error):
            Product.objects.fenced(token)
    assert len(queries) == 0, [q["sql"] for q in queries]
    row = Product.objects.get(pk=product.pk)
    assert (row.stock, row.fence_token) == (5, 0)


@pytest.mark.django_db
def test_none_token_is_a_plain_save_unless_fence_required(monkeypatch: pytest.MonkeyPatch) -> None:
    """``fence_token=None`` outside any lease is an unguarded save: allowed, and it leaves the
    row's token as it is; with ``fence_required = True`` it is refused (StaleTokenError)
    before any SQL and the row is unchanged."""
    from django_redlock.exceptions import StaleTokenError
    from testproject.inventory.models import Product

    product = Product.objects.create(name="none", stock=5)
    Product.objects.filter(pk=product.pk).fenced(7).update(stock=5)
    product.refresh_from_db()
    product.stock = 4
    product.save(fence_token=None)
    row = Product.objects.get(pk=product.pk)
    assert (row.stock, row.fence_token) == (4, 7)
    monkeypatch.setattr(Product, "fence_required", True)
    product.stock = 3
    with CaptureQueriesContext(connection) as queries, pytest.raises(StaleTokenError):
        product.save(fence_token=None)
    assert len(queries) == 0
    assert Product.objects.get(pk=product.pk).stock == 4


# -- Redis error replies ------------------------------------------------------------------------


def _typed_failure(manager: LockManager, name: str) -> LockNotAcquired | NodesUnavailable:
    try:
        lease = manager.acquire(name, timeout=0)
    except (LockNotAcquired, NodesUnavailable) as exc:
        return exc
    except redis.RedisError as exc:  # pragma: no cover - the failure this test is about
        pytest.fail(f"raw redis error escaped: {exc!r}")
    lease.release()
    pytest.fail("acquired despite the error replies")


def test_wrongtype_reply(redis_node_factory: Nodes, redlock_alias: Alias) -> None:
    """The lock's key already holds a hash on every node: the acquire script sees the name as
    taken (it only ever sets a key that does not exist), so the typed LockNotAcquired (busy)
    results, or NodesUnavailable with WRONGTYPE in ``.errors``; the hash is left exactly as
    it was."""
    nodes = redis_node_factory(3)
    manager = redlock_alias(nodes, TTL=5.0, NODE_TIMEOUT=0.5)
    manager.acquire("warm", timeout=0).release()
    key = f"{manager.config.key_prefix}typed"
    for node in nodes:
        node.client().hset(key, mapping={"f": "v"})
    exc = _typed_failure(manager, "typed")
    assert isinstance(exc, LockNotAcquired) or any("WRONGTYPE" in e for e in exc.errors.values()), (
        exc.errors
    )
    assert all(n.client().hgetall(key) == {b"f": b"v"} for n in nodes)


def test_noperm_reply(redis_node_factory: Nodes, redlock_alias: Alias) -> None:
    """An ACL user without ``HINCRBY`` (which the acquire script needs): the script fails with
    NOPERM on every node, a typed error names it, and no lock key is left."""
    nodes = redis_node_factory(3)
    without_hincrby = " ".join(c for c in ACL_COMMANDS.split() if c != "+hincrby")
    urls = acl_user_urls(nodes, "weak", "pw", "app:", without_hincrby)
    manager = redlock_alias(urls, KEY_PREFIX="app:", TTL=5.0, NODE_TIMEOUT=0.5)
    exc = _typed_failure(manager, "perm")
    # Redis says NOPERM or "can't run this command"; Valkey "has no permissions to run"
    refusals = ("NOPERM", "can't run this command", "has no permissions to run")
    denied = [e for e in exc.errors.values() if any(r in e for r in refusals)]
    assert len(denied) >= 2, exc.errors
    assert lock_keys([n.client() for n in nodes], "app:") == []


def test_oom_reply(redis_node_factory: Nodes, redlock_alias: Alias) -> None:
    """maxmemory 1 byte with noeviction on every node: Redis runs flag-less EVAL scripts even
    out of memory, so the acquisition may succeed (then it releases normally); if it fails,
    the error is typed. Never a raw redis error."""
    nodes = redis_node_factory(3)
    manager = redlock_alias(nodes, TTL=5.0)
    manager.acquire("warm", timeout=0).release()
    for node in nodes:
        node.client().config_set("maxmemory-policy", "noeviction")
        node.client().config_set("maxmemory", 1)
    try:
        try:
            lease = manager.acquire("oom", timeout=0)
        except (LockNotAcquired, NodesUnavailable):
            pass
        else:
            assert lease.release() is True
    finally:
        for node in nodes:
            node.client().config_set("maxmemory", 0)
    assert lock_keys([n.client() for n in nodes], manager.config.key_prefix) == []


def test_readonly_reply(redis_node_factory: Nodes, redlock_alias: Alias) -> None:
    """Every node turned into a replica answers READONLY to the acquire script's writes: a
    typed error naming it, and nothing written on the nodes."""
    nodes = redis_node_factory(3)
    primary = redis_node_factory(1, extra_args=["--repl-diskless-sync-delay", "0"])[0]
    manager = redlock_alias(nodes, TTL=5.0, NODE_TIMEOUT=0.5)
    manager.acquire("warm", timeout=0).release()
    for node in nodes:
        node.client().execute_command("REPLICAOF", "127.0.0.1", primary.port)
    try:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:  # wait for the sync to finish
            if all(n.client().info("replication").get("master_link_status") == "up"
                   for n in nodes):  # fmt: skip
                break
            time.sleep(0.05)
        exc = _typed_failure(manager, "ro")
        assert exc.errors, exc
        assert lock_keys([n.client() for n in nodes], manager.config.key_prefix) == []
    finally:
        for node in nodes:
            node.client().execute_command("REPLICAOF", "NO", "ONE")


def test_busy_reply(redis_node_factory: Nodes, redlock_alias: Alias) -> None:
    """Two of three nodes run an endless script (``busy-reply-threshold`` 50 ms) and answer
    BUSY: the acquisition fails with a typed error naming BUSY; after ``SCRIPT KILL`` the
    lock works again and no key is left."""
    # busy-reply-threshold is Redis 7's name for lua-time-limit
    option = "--busy-reply-threshold" if server_version() >= (7,) else "--lua-time-limit"
    nodes = redis_node_factory(3, extra_args=[option, "50"])
    manager = redlock_alias(nodes, TTL=5.0, NODE_TIMEOUT=0.3)
    manager.acquire("warm", timeout=0).release()

    def spin(node: Any) -> None:
        with contextlib.suppress(redis.RedisError):  # killed by SCRIPT KILL
            node.client(socket_timeout=30).eval("while true do end", 0)

    threads = [threading.Thread(target=spin, args=(node,)) for node in nodes[:2]]
    for thread in threads:
        thread.start()
    try:
        time.sleep(0.3)
        exc = _typed_failure(manager, "busy")
        assert any("BUSY" in e for e in exc.errors.values()), exc.errors
    finally:
        for node in nodes[:2]:
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:
                try:
                    node.client().script_kill()
                    break
                except redis.RedisError as error:
                    if "NOTBUSY" in str(error) or "No scripts" in str(error):
                        break
                    time.sleep(0.05)
        for thread in threads:
            thread.join(10)
    lease = manager.acquire("busy", timeout=5)
    assert lease.release() is True
    assert lock_keys([n.client() for n in nodes], manager.config.key_prefix) == []


# -- release/extend of a lock not held --------------------------------------------------------


def test_release_and_extend_of_a_lock_not_held(
    redis_node_factory: Nodes, redlock_alias: Alias
) -> None:
    """Releasing twice returns False the second time (no exception, no effect); extending a
    released lease raises LockLost; releasing a lease whose lock was force-released and taken
    by someone else returns False and leaves the new holder's key alone."""
    nodes = redis_node_factory(3)
    manager = redlock_alias(nodes, TTL=10.0)
    lease = manager.acquire("held", timeout=0)
    assert lease.release() is True
    assert lease.release() is False
    with pytest.raises(LockLost):
        lease.extend()
    old = manager.acquire("held", timeout=0)
    assert manager.force_release("held") == 3
    newer = manager.acquire("held", timeout=0)
    assert old.release() is False
    info, _ = get_lock(manager.alias, "held")
    assert info is not None and info.token == newer.token and info.nodes_held == 3
    assert newer.release() is True


@pytest.mark.parametrize("count", [1, 3])
def test_a_ttl_shorter_than_the_round_trip_says_so(
    redis_node_factory: Nodes, redlock_alias: Alias, count: int
) -> None:
    """A ttl= that passes the settings' rule but not the round trip (2.03 ms: about 10 us of
    validity, less than any round trip; 2.1 ms left 79 us, which a fast round trip on loopback
    beat now and then): the nodes grant it and the lease is given back at once. The error says
    that, not "busy" (found by an attack), and nothing is left behind."""
    nodes = redis_node_factory(count)
    manager = redlock_alias(nodes)
    with pytest.raises(LockNotAcquired, match="validity ran out") as raised:
        manager.acquire("short", ttl=0.00203, timeout=0)
    assert "busy" not in str(raised.value)
    assert all(node.client().exists(f"{manager.config.key_prefix}short") == 0 for node in nodes)
