"""The inspection module against real nodes: listing, merging, search, paging, health."""

from __future__ import annotations

import datetime
import json
import os
import socket
import time
from collections.abc import Callable
from typing import Any

import pytest

from django_redlock import inspection as inspect
from django_redlock import locks
from django_redlock.locking.manager import LockManager
from django_redlock.testing import RedisNode, RedisNodes


def owner_of(lease: object) -> str:
    owner: str = lease.record.owner  # type: ignore[attr-defined]
    return owner


def bulk_locks(client: Any, prefix: str, count: int) -> None:
    """``count`` lock values ``<prefix>bulk:<i>`` written in one pipeline, then the node's
    command statistics reset."""
    pipe = client.pipeline(transaction=False)
    for i in range(count):
        pipe.set(f"{prefix}bulk:{i}", f"{'ab' * 16}|{i}|0|h|1", px=30_000)
    pipe.execute()
    client.config_resetstat()


def test_escape_glob() -> None:
    assert inspect.escape_glob("a*b?c[d]e\\f:") == "a\\*b\\?c\\[d\\]e\\\\f:"


@pytest.mark.parametrize(
    ("tokens", "lease_token"),
    [
        ([11, 11, 11], 11),  # the common case: every node granted the same token
        ([12, 12, 11, 11, 11], 11),  # interleaved grants: the token a quorum gave
        ([12, 10, 11], 12),  # no quorum agrees: the highest (the others were raised)
    ],
    ids=["agreed", "quorum-below-the-highest", "highest"],
)
def test_a_lease_is_listed_with_the_token_its_acquire_chose(
    tokens: list[int], lease_token: int
) -> None:
    """The listed token is the lease's, by the acquire's own rule: the highest token a quorum
    of nodes gave, else the highest. Nodes that granted from further on keep their own,
    higher token in the value (listing the highest showed a token no lease had)."""
    from django_redlock.engine import LockValue
    from django_redlock.inspection.records import merge

    per_node = [(LockValue.parse(f"{'ab' * 16}|{token}|0|h|1"), 5000) for token in tokens]
    info = merge("default", "n", len(tokens), per_node)
    assert info is not None and info.token == lease_token
    assert info.holders[0]["token"] == lease_token


@pytest.mark.parametrize("alias", ["default", "multi", "five"])
def test_held_lock_is_listed_merged_and_masked(alias: str, unique_name: str) -> None:
    lease = locks[alias].acquire(unique_name, ttl=30, timeout=0)
    try:
        page = inspect.list_locks([alias], prefix=unique_name)
        assert page.errors == []
        assert [info.name for info in page.locks] == [unique_name]
        info = page.locks[0]
        total = len(locks[alias].config.nodes)
        assert (info.alias, info.nodes_held, info.nodes_total) == (alias, total, total)
        assert 25_000 < info.ttl_ms <= 30_000
        assert abs(info.token - lease.token) < 1000  # exact: see test_listed_token_is_exact
        owner = owner_of(lease)
        assert info.owner == owner[:4] + "…"
        assert info.lease_id == inspect.lease_id(owner) and len(info.lease_id) == 16
        assert (info.host, info.pid) == (socket.gethostname(), os.getpid())
        assert info.acquired_at is not None
        now = datetime.datetime.now(datetime.UTC)
        assert abs((now - info.acquired_at).total_seconds()) < 5
        for text in (repr(info), str(info), json.dumps(info.as_dict())):
            assert owner not in text
    finally:
        lease.release()
    assert inspect.list_locks([alias], prefix=unique_name).locks == []


def test_listed_token_is_exact(unique_name: str) -> None:
    """The token listed for a held lock is exactly the lease's token (no float rounding)."""
    with locks["multi"].lock(unique_name, ttl=30, timeout=0) as lease:
        info, _ = inspect.get_lock("multi", unique_name)
        assert info is not None and info.token == lease.token


def test_internal_keys_are_not_listed(unique_name: str) -> None:
    lease = locks["multi"].acquire(unique_name, ttl=30, timeout=0)
    try:
        names = [info.name for info in inspect.list_locks(["multi"], limit=10_000).locks]
        assert unique_name in names
        assert not [n for n in names if n.startswith("__")]
    finally:
        lease.release()


def test_search_prefix_is_literal_not_a_glob(unique_name: str) -> None:
    manager = locks["default"]
    names = [f"{unique_name}:[a]*?", f"{unique_name}:a*?", f"{unique_name}:\\x"]
    leases = [manager.acquire(name, ttl=30, timeout=0) for name in names]
    try:
        found = inspect.list_locks(["default"], prefix=f"{unique_name}:[a]").locks
        assert [info.name for info in found] == [names[0]]
        found = inspect.list_locks(["default"], prefix=f"{unique_name}:a*").locks
        assert [info.name for info in found] == [names[1]]
        found = inspect.list_locks(["default"], prefix=f"{unique_name}:\\").locks
        assert [info.name for info in found] == [names[2]]
    finally:
        for lease in leases:
            lease.release()


def test_pages_cover_every_lock_once(
    redis_node: RedisNode, redlock_alias: Callable[..., LockManager]
) -> None:
    manager = redlock_alias([redis_node.url])
    leases = [manager.acquire(f"job:{i}", ttl=30, timeout=0) for i in range(7)]
    seen: list[str] = []
    pages = []
    for number in range(3):
        page = inspect.list_locks([manager.alias], offset=number * 3, limit=3)
        pages.append(page)
        seen.extend(info.name for info in page.locks)
    assert [len(p.locks) for p in pages] == [3, 3, 1]
    assert [p.has_more for p in pages] == [True, True, False]
    assert sorted(seen) == sorted(lease.name for lease in leases)


@pytest.fixture
def large_keyspace(monkeypatch: pytest.MonkeyPatch) -> None:
    """Nodes of over 1,000 keys count as too large to sort (3,000 keys stand for millions)."""
    monkeypatch.setattr("django_redlock.inspection.reader.SORTED_LISTING_MAX_KEYS", 1000)


@pytest.mark.usefixtures("large_keyspace")
def test_scan_stops_when_the_page_is_full(
    redis_node: RedisNode, redlock_alias: Callable[..., LockManager]
) -> None:
    """5 locks out of 3,000 keys take one SCAN call, not a walk over the whole keyspace."""
    manager = redlock_alias([redis_node.url])
    client = redis_node.client()
    bulk_locks(client, manager.config.key_prefix, 3000)
    page = inspect.list_locks([manager.alias], limit=5)
    assert len(page.locks) == 5 and page.has_more
    stats = client.info("commandstats")
    assert stats["cmdstat_scan"]["calls"] == 1
    assert "cmdstat_keys" not in stats
    assert stats["cmdstat_get"]["calls"] == 5


def test_every_node_is_scanned_and_pages_come_in_node_order(
    redis_nodes: RedisNodes, redlock_alias: Callable[..., LockManager]
) -> None:
    """Names held only on a later node are listed too, after the earlier nodes' names; pages
    cover every name once and match the one-pass listing."""
    manager = redlock_alias(redis_nodes)
    prefix = manager.config.key_prefix
    for index, node in enumerate(redis_nodes):
        client = node.client()
        for i in range(4):
            client.set(f"{prefix}n{index}:{i}", f"{'ab' * 16}|{i}|0|h|1", px=30_000)
        client.close()
    seen: list[str] = []
    for number in range(3):
        page = inspect.list_locks([manager.alias], offset=number * 5, limit=5)
        assert page.has_more == (number < 2)
        seen.extend(info.name for info in page.locks)
        assert {(info.nodes_held, info.nodes_total) for info in page.locks} == {(1, 3)}
    assert [sorted(seen[i : i + 4]) for i in (0, 4, 8)] == [
        [f"n{index}:{i}" for i in range(4)] for index in range(3)
    ]
    infos, errors = inspect.all_locks(manager.alias)
    assert [info.name for info in infos] == seen and errors == []
    infos, _ = inspect.all_locks(manager.alias, prefix="n2:", batch=3)
    assert sorted(info.name for info in infos) == [f"n2:{i}" for i in range(4)]


@pytest.mark.usefixtures("large_keyspace")
def test_first_page_takes_one_scan_per_node_and_a_walk_few_calls(
    redis_nodes: RedisNodes, redlock_alias: Callable[..., LockManager]
) -> None:
    """A full first page takes at most one SCAN call on each node; a prefix that matches
    nothing walks each node's whole keyspace with COUNT doubling, in fewer calls than a fixed
    COUNT."""
    manager = redlock_alias(redis_nodes)
    clients = [node.client() for node in redis_nodes]
    for client in clients:
        bulk_locks(client, manager.config.key_prefix, 3000)
    page = inspect.list_locks([manager.alias], limit=5)
    assert len(page.locks) == 5 and page.has_more
    calls = [c.info("commandstats").get("cmdstat_scan", {"calls": 0})["calls"] for c in clients]
    assert calls[0] == 1 and max(calls) == 1  # later nodes stop once node 0 gave the page
    for client in clients:
        client.config_resetstat()
    assert inspect.list_locks([manager.alias], prefix="nothing").locks == []
    for client in clients:
        calls = client.info("commandstats")["cmdstat_scan"]["calls"]
        assert 1 < calls < 3000 // inspect.SCAN_COUNT
        client.close()


def test_pages_stay_stable_while_other_keys_come_and_go(
    redis_nodes: RedisNodes, redlock_alias: Callable[..., LockManager]
) -> None:
    """Names come in name order, so paging through them while unrelated keys are added and
    removed (the node's hash table grows and shrinks, which reorders SCAN) shows each name
    exactly once (in SCAN order, page 2 repeated a name of page 1 on Valkey)."""
    manager = redlock_alias(redis_nodes)
    prefix = manager.config.key_prefix
    names = [f"held:{i:02d}" for i in range(12)]
    for node in redis_nodes:
        client = node.client()
        for name in names:
            client.set(f"{prefix}{name}", f"{'ab' * 16}|1|0|h|1", px=30_000)
    churn = [node.client() for node in redis_nodes]
    seen: list[str] = []
    for number in range(4):
        page = inspect.list_locks([manager.alias], offset=number * 3, limit=3)
        seen.extend(info.name for info in page.locks)
        for client in churn:  # grow, then shrink, the nodes' tables between pages
            pipe = client.pipeline(transaction=False)
            for i in range(4000):
                if number % 2 == 0:
                    pipe.set(f"churn:{i}", "x")
                else:
                    pipe.delete(f"churn:{i}")
            pipe.execute()
        time.sleep(0.3)  # the server resizes its tables in its cron
    assert sorted(seen) == names, seen  # each once
    assert seen == names  # in name order
    for client in churn:
        client.delete(*[f"churn:{i}" for i in range(4000)])
        client.close()


def _scan_calls(clients: list[Any]) -> list[int]:
    return [c.info("commandstats").get("cmdstat_scan", {"calls": 0})["calls"] for c in clients]


def test_a_whole_listing_scans_enough_trusted_nodes_to_meet_every_quorum(
    redis_node_factory: Any, redlock_alias: Callable[..., LockManager]
) -> None:
    """A whole listing (``all_locks``, ``list`` without ``--limit``) of 5 nodes scans 3 (any
    quorum of 3 meets them) and reads the names' values from all 5 (node counts stay exact);
    a page still scans all 5. Nodes that restarted since (untrusted: they may have lost a
    valid lease's key) are not counted: a lease whose keys survive on 2 nodes beside 2
    restarted ones is still found (scanning the first 3 nodes would miss it)."""
    nodes = redis_node_factory(5)
    manager = redlock_alias(nodes)
    prefix = manager.config.key_prefix
    lease = manager.acquire("kept", ttl=60, timeout=0)
    extra = manager.acquire("everywhere", ttl=60, timeout=0)
    clients = [node.client() for node in nodes]
    for client in clients:
        client.config_resetstat()
    infos, errors = inspect.all_locks(manager.alias)
    assert errors == [] and [i.name for i in infos] == ["everywhere", "kept"]
    assert [(i.nodes_held, i.nodes_total) for i in infos] == [(5, 5), (5, 5)]
    assert _scan_calls(clients) == [1, 1, 1, 0, 0]
    for client in clients:
        client.config_resetstat()
    page = inspect.list_locks([manager.alias])
    assert [i.name for i in page.locks] == ["everywhere", "kept"]
    assert _scan_calls(clients) == [1, 1, 1, 1, 1]
    # "kept" was granted by nodes 2-4; nodes 0 and 1 restart empty; node 2 loses the key
    nodes[0].restart()
    nodes[1].restart()
    clients[2].delete(f"{prefix}kept")
    clients = [node.client() for node in nodes]
    for client in clients:
        client.config_resetstat()
    infos, errors = inspect.all_locks(manager.alias)
    assert errors == []
    assert [(i.name, i.nodes_held) for i in infos] == [("everywhere", 3), ("kept", 2)]
    assert _scan_calls(clients) == [0, 0, 1, 1, 1]
    assert infos[1].lease_id == inspect.lease_id(owner_of(lease))
    nodes[3].kill()  # fewer than 3 trusted nodes: every node is scanned
    for client in clients:
        if client is not clients[3]:
            client.config_resetstat()
    infos, errors = inspect.all_locks(manager.alias)
    assert [(i.name, i.nodes_held) for i in infos] == [("everywhere", 2), ("kept", 1)]
    assert [e.node for e in errors] == [manager.config.nodes[3].label]
    assert _scan_calls([c for i, c in enumerate(clients) if i != 3]) == [1, 1, 1, 1]
    extra.release()


def test_node_down_is_reported_and_locks_still_listed(
    redis_nodes: RedisNodes, redlock_alias: Callable[..., LockManager]
) -> None:
    manager = redlock_alias(redis_nodes)
    lease = manager.acquire("report", ttl=30, timeout=0)
    redis_nodes[0].kill()
    page = inspect.list_locks([manager.alias])
    assert [(i.name, i.nodes_held, i.nodes_total) for i in page.locks] == [("report", 2, 3)]
    assert [e.node for e in page.errors] == [manager.config.nodes[0].label]
    assert page.locks[0].lease_id == inspect.lease_id(owner_of(lease))
    health = inspect.node_health([manager.alias])
    assert [h.up for h in health] == [False, True, True]
    assert health[0].error
    for node in health[1:]:
        assert node.latency_ms is not None and node.latency_ms >= 0
        assert node.run_id and len(node.run_id) == 40
        assert node.uptime_s is not None and node.uptime_s >= 0
        assert node.maxmemory_policy == "noeviction"
        assert node.used_memory and node.used_memory > 0


def test_policy_read_from_info_when_acl_denies_config(
    redis_node: RedisNode, redlock_alias: Callable[..., LockManager]
) -> None:
    """A user denied CONFIG still gets the policy, from INFO memory (it was "unknown")."""
    manager = redlock_alias([redis_node.url])
    redis_node.client().acl_setuser(
        "default",
        enabled=True,
        nopass=True,
        keys=["*"],
        channels=["*"],
        commands=["+@all", "-config"],
    )
    [node] = inspect.node_health([manager.alias])
    assert node.up and node.maxmemory_policy == "noeviction" and node.run_id


def test_force_release_checks_the_token(unique_name: str) -> None:
    manager = locks["multi"]
    with pytest.raises(inspect.NotHeld):
        inspect.force_release("multi", unique_name, 1)
    lease = manager.acquire(unique_name, ttl=30, timeout=0)
    listed, _ = inspect.get_lock("multi", unique_name)
    assert listed is not None
    with pytest.raises(inspect.HolderChanged):
        inspect.force_release("multi", unique_name, listed.token - 1)
    with pytest.raises(inspect.HolderChanged):
        inspect.force_release("multi", unique_name, lease="0" * 16)
    still, _ = inspect.get_lock("multi", unique_name)
    assert still is not None and still.lease_id == listed.lease_id
    deleted, info = inspect.force_release("multi", unique_name, listed.token, listed.lease_id)
    assert (deleted, info.lease_id, info.token) == (3, listed.lease_id, listed.token)
    assert inspect.get_lock("multi", unique_name) == (None, [])
    again = manager.acquire(unique_name, ttl=30, timeout=0)
    assert again.token > lease.token
    assert lease.release() is False
    again.release()


def test_force_release_with_per_node_tokens(
    redis_nodes: RedisNodes, redlock_alias: Callable[..., LockManager]
) -> None:
    """Each node stores its own token in the value: every copy of the lease is released."""
    manager = redlock_alias(redis_nodes)
    lease = manager.acquire("split", ttl=30, timeout=0)
    key = manager.config.key_prefix + "split"
    owner = owner_of(lease)
    for offset, node in enumerate(redis_nodes):
        node.client().set(key, f"{owner}|{lease.token - offset}|1|host|7", px=30_000)
    info, _ = inspect.get_lock(manager.alias, "split")
    assert info is not None and (info.nodes_held, info.token) == (3, lease.token)
    assert info.acquired_at == datetime.datetime(1970, 1, 1, 0, 0, 0, 1000, tzinfo=datetime.UTC)
    deleted, _ = inspect.force_release(manager.alias, "split", lease.token)
    assert deleted == 3
    assert all(node.client().exists(key) == 0 for node in redis_nodes)


def test_waiters_counts_registrations_still_ahead_over_the_nodes(
    redis_nodes: RedisNodes, redlock_alias: Callable[..., LockManager]
) -> None:
    """``waiters`` is, per node, how many registrations in the name's waiter set have a
    deadline still ahead on that node's clock, and the largest count over the nodes: lapsed
    registrations and a key that is not a sorted set count nothing. A page of locks reads it
    in its one round trip per node (one EVAL for the whole page)."""
    manager = redlock_alias(redis_nodes)
    prefix = manager.config.key_prefix
    leases = [manager.acquire(name, ttl=30, timeout=0) for name in ("w", "x")]
    clients = [node.client() for node in redis_nodes]

    def ahead(client: object, ms: int) -> int:
        seconds, micros = client.time()  # type: ignore[attr-defined]
        return int(seconds) * 1000 + int(micros) // 1000 + ms

    first, second, third = clients
    first.zadd(f"{prefix}__waiters__:w", {"a": ahead(first, 60_000), "b": ahead(first, 60_000)})
    first.zadd(f"{prefix}__waiters__:w", {"lapsed": ahead(first, -1)})
    second.zadd(f"{prefix}__waiters__:w", {"a": ahead(second, 60_000), "c": ahead(second, -5)})
    third.set(f"{prefix}__waiters__:w", "not a sorted set")
    third.zadd(f"{prefix}__waiters__:x", {"lapsed": ahead(third, -1)})
    try:
        for client in clients:
            client.config_resetstat()
        page = inspect.list_locks([manager.alias])
        assert sorted((i.name, i.waiters) for i in page.locks) == [("w", 2), ("x", 0)]
        for client in clients:
            stats = client.info("commandstats")
            assert (stats["cmdstat_eval"]["calls"], stats["cmdstat_get"]["calls"]) == (1, 2)
        info, errors = inspect.get_lock(manager.alias, "w")
        assert info is not None and not errors
        assert json.loads(json.dumps(info.as_dict()))["waiters"] == 2
    finally:
        for lease in leases:
            lease.release()
