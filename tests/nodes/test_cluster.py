"""Cluster nodes: settings, every primitive on the master of the alias's slot, node health
with the slot and the cluster's coverage, a slot migration followed through MOVED; a spread
alias (no hash tag in KEY_PREFIX): locks over every master, a bounded set of fence counters,
every primitive, lock_many within a hash tag, the listing and force-release over its shards."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.test import override_settings

from django_redlock import locks
from django_redlock.conf import hash_tag, parse_alias
from django_redlock.exceptions import LockError, LockNotAcquired, NodesUnavailable
from django_redlock.inspection import list_locks, node_health
from django_redlock.locking.manager import LockManager
from django_redlock.nodes.cluster import SHARDS, shard_of, slot_of
from django_redlock.testing.cluster import ClusterGroup
from django_redlock.testing.server import server_version

PREFIX = "{lock}:"
SEED = "redis://127.0.0.1:7001"


@pytest.fixture(scope="module")
def cluster() -> Iterator[ClusterGroup]:
    """Three masters, no replicas (the fault suite fails masters over)."""
    with ClusterGroup.start(3) as started:
        yield started


#: The spread-alias tests open 16 shards' connections and hold hundreds of names at once: they
#: test where locks land, not timing, so a loaded CI machine's pause (a collection in this
#: big test process, other nodes' work) must not fail an attempt at the default 50 ms.
SPREAD_NODE_TIMEOUT = 0.5


def _alias(cluster: ClusterGroup, prefix: str = PREFIX, **extra: Any) -> dict[str, Any]:
    return {"default": {"NODES": [cluster.node_setting()], "KEY_PREFIX": prefix, **extra}}


@pytest.mark.parametrize(
    ("raw", "key", "says"),
    [
        ({"NODES": [{"CLUSTER": [SEED]}], "KEY_PREFIX": "{}:"}, "KEY_PREFIX", "no hash tag"),
        ({"NODES": [{"CLUSTER": [SEED]}], "KEY_PREFIX": "a{b:"}, "KEY_PREFIX", "no hash tag"),
        ({"NODES": [{"CLUSTER": []}], "KEY_PREFIX": PREFIX}, "NODES[0].CLUSTER", "non-empty"),
        ({"NODES": [{"CLUSTER": SEED}], "KEY_PREFIX": PREFIX}, "NODES[0].CLUSTER", "non-empty"),
        (
            {"NODES": [{"CLUSTER": [SEED, "unix:///x.sock"]}], "KEY_PREFIX": PREFIX},
            "NODES[0].CLUSTER[1]",
            "redis://",
        ),
        (
            {"NODES": [{"CLUSTER": [f"{SEED}/2"]}], "KEY_PREFIX": PREFIX},
            "NODES[0].CLUSTER[0]",
            "only database 0",
        ),
        (
            {"NODES": [{"CLUSTER": [SEED], "DB": 0}], "KEY_PREFIX": PREFIX},
            "NODES[0].DB",
            "unknown key",
        ),
        (
            {"NODES": [{"CLUSTER": [SEED], "ADDRESS_REMAP": "x"}], "KEY_PREFIX": PREFIX},
            "NODES[0].ADDRESS_REMAP",
            "must be a callable",
        ),
        (
            {"NODES": [{"CLUSTER": [SEED], "ADDRESS_REMAP": {}}], "KEY_PREFIX": PREFIX},
            "NODES[0].ADDRESS_REMAP",
            "non-empty dict",
        ),
        (
            {"NODES": [{"CLUSTER": [SEED], "ADDRESS_REMAP": {"a:1": "b"}}], "KEY_PREFIX": PREFIX},
            "NODES[0].ADDRESS_REMAP",
            "host:port",
        ),
        (
            {"NODES": [{"CLUSTER": [SEED], "ADDRESS_REMAP": {"a:0": "b:1"}}], "KEY_PREFIX": PREFIX},
            "NODES[0].ADDRESS_REMAP",
            "port 1-65535",
        ),
    ],
)
def test_bad_cluster_nodes_name_the_alias_and_key(raw: Any, key: str, says: str) -> None:
    """A cluster node needs seed URLs and a KEY_PREFIX with a hash tag or no braces at all;
    each mistake is ImproperlyConfigured naming the alias and the key."""
    with pytest.raises(ImproperlyConfigured) as info:
        parse_alias("c", raw)
    assert str(info.value).startswith(f"REDLOCK['c']['{key}']: "), str(info.value)
    assert says in str(info.value)


def test_prefix_checks_tell_clusters_apart() -> None:
    """E003 sees two cluster nodes as one node only when they name the same seeds (was: every
    cluster node looked like the same one)."""
    from django_redlock import checks

    def alias(seed: str, prefix: str) -> dict[str, Any]:
        return {"NODES": [{"CLUSTER": [seed]}], "KEY_PREFIX": prefix}

    other = "redis://127.0.0.1:7101"
    with override_settings(REDLOCK={"a": alias(SEED, "{a}:"), "b": alias(other, "{a}:b:")}):
        assert checks.check_settings() == []
    with override_settings(REDLOCK={"a": alias(SEED, "{a}:"), "b": alias(SEED, "{a}:b:")}):
        assert [m.id for m in checks.check_settings()] == ["django_redlock.E003"]


def test_hash_tag_is_what_redis_cluster_hashes() -> None:
    """The tag is between the first ``{`` and the next ``}``, as Redis Cluster reads it; all
    of an alias's keys land in that tag's slot."""
    assert hash_tag("{lock}:") == "lock"
    assert hash_tag("app:{jobs}:x{y}") == "jobs"
    assert hash_tag("a{}b{c}") is None and hash_tag("lock:") is None
    prefix = "app:{jobs}:"
    keys = [f"{prefix}name", f"{prefix}__fence__", f"{prefix}__waiters__:name"]
    assert {slot_of(key) for key in keys} == {slot_of(prefix)}


def _locks_semaphores_and_rwlocks(manager: LockManager) -> None:
    """A lock (sync, then asyncio with a higher token), a semaphore and a read-write lock."""
    with manager.lock("a", timeout=0) as first, pytest.raises(LockNotAcquired):
        manager.acquire("a", timeout=0)

    async def main() -> int:
        lease = await manager.aacquire("a", timeout=0)
        await lease.arelease()
        return lease.token

    assert asyncio.run(main()) > first.token
    permit = manager.semaphore("pool", 2, timeout=0)
    with permit, manager.semaphore("pool", 2, timeout=0), pytest.raises(LockNotAcquired):
        manager.acquire("pool", permits=2, timeout=0)
    reader = manager.read_lock("doc", timeout=0)
    with reader, manager.read_lock("doc", timeout=0), pytest.raises(LockNotAcquired):
        manager.acquire("doc", rw="write", timeout=0)


def test_every_primitive_on_a_cluster_node(cluster: ClusterGroup) -> None:
    """Locks (sync and asyncio), semaphores, read-write locks and lock_many work on a
    cluster node: every key sits on the master serving the prefix's slot, one fence hash."""
    with override_settings(REDLOCK=_alias(cluster)):
        manager = locks["default"]
        _locks_semaphores_and_rwlocks(manager)
        with manager.lock_many(["x", "y", "z"], timeout=0) as held:
            assert sorted(held.tokens) == ["x", "y", "z"]
            master = cluster.master_of(slot_of(PREFIX))
            assert master.client().exists(f"{PREFIX}x", f"{PREFIX}y", f"{PREFIX}z") == 3
            assert sorted(i.name for i in list_locks(["default"]).locks) == ["x", "y", "z"]
        slot = slot_of(PREFIX)
        assert master.client().exists(f"{PREFIX}__fence__") == 1
        others = [n for n in cluster.nodes if n is not master]
        assert [n.client().execute_command("CLUSTER", "COUNTKEYSINSLOT", slot) for n in others] == [
            0,
            0,
        ]


def test_cluster_node_health_shows_slot_and_coverage(cluster: ClusterGroup) -> None:
    """``redlock nodes`` and the admin show the slot, its master and the slot coverage."""
    with override_settings(REDLOCK=_alias(cluster)):
        locks["default"].acquire("h", timeout=0).release()
        (health,) = node_health(["default"])
    master = cluster.master_of(slot_of(PREFIX))
    assert health.up and health.node.startswith("cluster:localhost:")
    assert health.master == (
        f"slot {slot_of(PREFIX)} on 127.0.0.1:{master.port}; 3 masters, 16384/16384 slots covered"
    )
    assert health.shown.endswith(f"[{health.master}]")


def test_slot_migration_is_followed(cluster: ClusterGroup) -> None:
    """The alias's slot (with its lock and fence keys) is migrated to another master: the
    old owner answers MOVED, the engine connects to the new one, which, holding a fence
    marker of another server, is quarantined for the longest TTL; then tokens go on
    increasing. The held lock's key moved with its TTL."""
    prefix = "{migrate}:"
    slot = slot_of(prefix)
    with override_settings(REDLOCK=_alias(cluster, prefix, TTL=1.0)):
        manager = locks["default"]
        before = manager.acquire("before", timeout=0)
        held = manager.acquire("held", timeout=0)
        source = cluster.master_of(slot)
        target = next(m for m in cluster.masters() if m is not source)
        cluster.migrate_slot(slot, target)
        assert 0 < target.client().pttl(f"{prefix}held") <= 1000
        with pytest.raises(NodesUnavailable, match="MOVED"):  # the old owner redirects
            manager.acquire("after", timeout=0)
        with pytest.raises(NodesUnavailable, match="quarantined"):  # the new one waits a TTL
            manager.acquire("after", timeout=0)
        after = manager.acquire("after", timeout=5)
        assert after.token > max(before.token, held.token)
        assert target.client().exists(f"{prefix}after") == 1
        after.release()


def test_deploy_checks_of_a_cluster_node(cluster: ClusterGroup) -> None:
    """``check --deploy`` reads maxmemory-policy on every master (W004 for the one that
    evicts, even if it does not serve the alias's slot), and warns W008 when a master of the
    cluster is also another node of the Redlock set."""
    from django_redlock import checks

    serving = cluster.master_of(slot_of(PREFIX))
    other = next(m for m in cluster.masters() if m is not serving)
    other.client().config_set("maxmemory-policy", "allkeys-lru")
    try:
        nodes = [cluster.node_setting(), other.url, "redis://127.0.0.1:1/0"]
        config = {"default": {"NODES": nodes, "KEY_PREFIX": PREFIX, "NODE_TIMEOUT": 0.5}}
        with override_settings(REDLOCK=config):
            messages = checks.check_deployment()
    finally:
        other.client().config_set("maxmemory-policy", "noeviction")
    by_id = {
        m.id: m.msg for m in messages if m.id in ("django_redlock.W004", "django_redlock.W008")
    }
    assert (
        f"cluster master 127.0.0.1:{other.port} has maxmemory-policy"
        in by_id["django_redlock.W004"]
    )
    assert f"its master localhost:{other.port} is also another node" in by_id["django_redlock.W008"]


def _keys_per_master(cluster: ClusterGroup, pattern: str) -> list[int]:
    return [len(list(m.client().scan_iter(match=pattern, count=1000))) for m in cluster.masters()]


def test_a_spread_alias_puts_locks_on_every_master(cluster: ClusterGroup) -> None:
    """KEY_PREFIX without a hash tag: 300 names held at once land on all three masters (none
    holds more than half), with at most 16 fence hashes whatever the number of names; every
    name's tokens increase; a name's keys share its shard's slot."""
    with override_settings(REDLOCK=_alias(cluster, "spread:", NODE_TIMEOUT=SPREAD_NODE_TIMEOUT)):
        manager = locks["default"]
        assert len(manager.shards) == SHARDS
        held = [manager.acquire(f"order:{i}", ttl=30, timeout=0) for i in range(300)]
        per_master = _keys_per_master(cluster, "spread:{*}:order:*")
        assert sum(per_master) == 300 and max(per_master) <= 150, per_master
        again = []
        for lease in held:
            assert lease.release() is True
            again.append(manager.acquire(lease.name, ttl=30, timeout=0))
        assert all(a.token > b.token for a, b in zip(again, held, strict=True))
        for lease in again:
            lease.release()
        fences = _keys_per_master(cluster, "spread:{*}:__fence__")
        assert 0 < sum(fences) <= SHARDS and min(fences) > 0, fences
        for lease in again[:5]:
            shard = manager.config.shards[shard_of(lease.name, SHARDS)]
            assert slot_of(shard) == slot_of(f"{shard}{lease.name}")


def test_every_primitive_on_a_spread_alias(cluster: ClusterGroup) -> None:
    """Locks (sync and asyncio), semaphores, read-write locks, lock_many of names with one
    hash tag; lock_many across shards is refused before any network call, naming the rule."""
    with override_settings(REDLOCK=_alias(cluster, "spread:", NODE_TIMEOUT=SPREAD_NODE_TIMEOUT)):
        manager = locks["default"]
        _locks_semaphores_and_rwlocks(manager)
        cart = ["{cart:7}book", "{cart:7}pen", "{cart:7}ink"]
        with manager.lock_many(cart, timeout=0) as held:
            assert sorted(held.tokens) == sorted(cart)
            with pytest.raises(LockNotAcquired):
                manager.acquire("{cart:7}pen", timeout=0)
        names = [f"item:{i}" for i in range(40)]  # 40 names over 16 shards: several shards
        assert len({shard_of(n, SHARDS) for n in names}) > 1
        with pytest.raises(LockError, match=r"needs names of one shard.*common hash tag"):
            manager.acquire_many(names, timeout=0)
        assert list_locks(["default"]).locks == []  # nothing was taken
        (health,) = node_health(["default"])
        assert health.master == f"{SHARDS} shards over 3 masters, 16384/16384 slots covered"


def test_listing_and_force_release_over_the_shards(cluster: ClusterGroup) -> None:
    """The listing reads every shard (name order, pages covering each name once), ``get_lock``
    and force-release find a name's shard, and the held lease then learns it was lost."""
    from django_redlock import inspection as inspect

    with override_settings(REDLOCK=_alias(cluster, "spread:", NODE_TIMEOUT=SPREAD_NODE_TIMEOUT)):
        manager = locks["default"]
        names = [f"job:{i:02d}" for i in range(12)]
        held = {name: manager.acquire(name, ttl=30, timeout=0) for name in names}
        assert [i.name for i in list_locks(["default"]).locks] == names
        paged = [
            info.name
            for page in range(3)
            for info in list_locks(["default"], offset=page * 5, limit=5).locks
        ]
        assert paged == names
        infos, errors = inspect.all_locks("default")
        assert [i.name for i in infos] == names and errors == []
        info, _ = inspect.get_lock("default", "job:07")
        assert info is not None and info.token == held["job:07"].token
        deleted, _ = inspect.force_release("default", "job:07", token=held["job:07"].token)
        assert deleted == 1
        assert held["job:07"].release() is False
        assert [i.name for i in list_locks(["default"]).locks] == [
            n for n in names if n != "job:07"
        ]
        for name, lease in held.items():
            if name != "job:07":
                lease.release()


def test_the_health_check_of_a_spread_alias_sees_every_shard(cluster: ClusterGroup) -> None:
    """A shard whose master's fence mark names another server (a failed-over master, before
    its quarantine ends) makes the cluster node "in the restart quarantine", whichever shard
    it is (the check used to look at the first shard only)."""
    from django_redlock.contrib.health.report import alias_status

    with override_settings(REDLOCK=_alias(cluster, "health:")):
        manager = locks["default"]
        for i in range(200):  # a grant in every shard
            manager.acquire(f"h{i}", timeout=0).release()
        assert alias_status("default").healthy
        last = manager.config.shards[-1]
        master = cluster.master_of(slot_of(last))
        master.client().hset(f"{last}__fence__", "run_id", "0" * 40)
        status = alias_status("default")
    assert not status.healthy
    assert status.problems() == ["node 0 in the restart quarantine"]


# -- one-node cluster: the empty host, CLUSTER SHARDS, address remapping


@pytest.fixture(scope="module")
def lone() -> Iterator[ClusterGroup]:
    """A one-node cluster: its node never met another, so it does not know its own IP."""
    with ClusterGroup.start(1) as started:
        yield started


def _lone_alias(lone: ClusterGroup, **node: Any) -> dict[str, Any]:
    return {"default": {"NODES": [{**lone.node_setting(), **node}], "KEY_PREFIX": PREFIX}}


def _commands(lone: ClusterGroup) -> dict[str, Any]:
    return lone.nodes[0].client(decode_responses=True).info("commandstats")


def test_a_one_node_cluster_names_its_master_with_an_empty_host(lone: ClusterGroup) -> None:
    """The node of a one-node cluster announces its slots with an empty host, which means "the
    address you asked": locks work, and the health report names the seed's host (was: a
    connect to host "" that failed with "Name or service not known")."""
    (node,) = lone.nodes
    assert node.client().execute_command("CLUSTER", "SLOTS")[0][2][0] == b""
    with override_settings(REDLOCK=_lone_alias(lone)):
        lease = locks["default"].acquire("one", timeout=0)
        assert node.client().exists("{lock}:one") == 1
        lease.release()
        (health,) = node_health(["default"])
    assert health.master is not None
    assert health.master.startswith(f"slot {slot_of(PREFIX)} on 127.0.0.1:{node.port}; 1 masters")


@pytest.mark.skipif(server_version() < (7,), reason="CLUSTER SHARDS is new in Redis 7")
def test_cluster_shards_is_asked_on_redis_7(lone: ClusterGroup) -> None:
    """On Redis 7+ the seeds are asked ``CLUSTER SHARDS``, not the deprecated ``CLUSTER SLOTS``
    (was: always CLUSTER SLOTS)."""
    lone.nodes[0].client().config_resetstat()
    with override_settings(REDLOCK=_lone_alias(lone)):
        locks["default"].acquire("shards", timeout=0).release()
    stats = _commands(lone)
    assert stats["cmdstat_cluster|shards"]["calls"] >= 1
    assert "cmdstat_cluster|slots" not in stats


def test_cluster_slots_when_shards_is_refused(lone: ClusterGroup) -> None:
    """A seed that refuses ``CLUSTER SHARDS`` (a server before Redis 7; here an ACL user
    without it) is asked ``CLUSTER SLOTS`` instead."""
    admin = lone.nodes[0].client()
    rules = ["on", ">pw", "~*", "+@all", "-cluster|shards"]
    admin.execute_command("ACL", "SETUSER", "noshards", *rules)
    admin.config_resetstat()
    seed = f"redis://noshards:pw@127.0.0.1:{lone.nodes[0].port}"
    try:
        with override_settings(REDLOCK=_lone_alias(lone, CLUSTER=[seed])):
            locks["default"].acquire("a", timeout=0).release()
        assert _commands(lone)["cmdstat_cluster|slots"]["calls"] >= 1
    finally:
        admin.execute_command("ACL", "DELUSER", "noshards")


def test_address_remap_reaches_announced_hostnames(lone: ClusterGroup) -> None:
    """The node announces a hostname this process cannot resolve (as behind NAT, or Docker
    service names): locks fail without ``ADDRESS_REMAP``, work with it as a callable or as a
    dict, and a remap that returns no ``(host, port)`` is a clear error."""
    (node,) = lone.nodes
    port = node.port
    assert port is not None
    admin = node.client()
    admin.config_set("cluster-announce-hostname", "lone.redlock.invalid")
    admin.config_set("cluster-preferred-endpoint-type", "hostname")
    try:
        with (
            override_settings(REDLOCK=_lone_alias(lone)),
            pytest.raises(NodesUnavailable, match=r"lone\.redlock\.invalid"),
        ):
            locks["default"].acquire("r", timeout=0)

        def to_loopback(host: str, port: int) -> tuple[str, int]:
            return ("127.0.0.1", port) if host.endswith(".redlock.invalid") else (host, port)

        mapping = {f"lone.redlock.invalid:{port}": f"127.0.0.1:{port}"}
        for remap in (to_loopback, mapping):
            with override_settings(REDLOCK=_lone_alias(lone, ADDRESS_REMAP=remap)):
                with locks["default"].lock("r", timeout=0):
                    assert node.client().exists("{lock}:r") == 1
                (health,) = node_health(["default"])
                assert health.master is not None and f"127.0.0.1:{port}" in health.master
        broken = _lone_alias(lone, ADDRESS_REMAP=lambda host, port: f"{host}:{port}")
        with (
            override_settings(REDLOCK=broken),
            pytest.raises(NodesUnavailable, match="ADDRESS_REMAP turned"),
        ):
            locks["default"].acquire("r", timeout=0)
    finally:
        admin.config_set("cluster-preferred-endpoint-type", "ip")
        admin.config_set("cluster-announce-hostname", "")
