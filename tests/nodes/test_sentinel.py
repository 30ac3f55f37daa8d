"""Sentinel nodes: settings, locking through the master the sentinels name, a failover (the
promoted replica quarantined as a restarted node), and a sentinel node in a Redlock set."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from django.core.exceptions import ImproperlyConfigured
from django.test import override_settings

from django_redlock import locks
from django_redlock.conf import parse_alias
from django_redlock.exceptions import LockNotAcquired, NodesUnavailable
from django_redlock.inspection import node_health
from django_redlock.testing.node import RedisNode
from django_redlock.testing.sentinel import SentinelGroup, SentinelProcess

S1, S2 = "redis://127.0.0.1:26001", "redis://127.0.0.1:26002"


@pytest.fixture
def group() -> Iterator[SentinelGroup]:
    """A fresh master, replica and three sentinels (failovers change them)."""
    with SentinelGroup.start() as started:
        yield started


@pytest.fixture(scope="module")
def steady_group() -> Iterator[SentinelGroup]:
    """One group for the module's tests that neither fail it over nor stop any of its
    processes (a group takes seconds to start)."""
    with SentinelGroup.start() as started:
        yield started


def _alias(group: SentinelGroup, **extra: Any) -> dict[str, Any]:
    return {"default": {"NODES": [group.node_setting()], "TTL": 1.0, **extra}}


@pytest.mark.parametrize(
    ("node", "key", "says"),
    [
        ({"SENTINELS": [], "SERVICE": "m"}, ".SENTINELS", "non-empty list"),
        ({"SENTINELS": S1, "SERVICE": "m"}, ".SENTINELS", "non-empty list"),
        (
            {"SENTINELS": [S1, "http://x:1"], "SERVICE": "m"},
            ".SENTINELS[1]",
            "redis:// or rediss:// URL",
        ),
        ({"SENTINELS": [S1, 5], "SERVICE": "m"}, ".SENTINELS[1]", "not 5"),
        ({"SENTINELS": ["redis://h:0"], "SERVICE": "m"}, ".SENTINELS[0]", "port 0"),
        ({"SENTINELS": ["redis://h:1?x=1"], "SERVICE": "m"}, ".SENTINELS[0]", "refused"),
        ({"SENTINELS": [S1]}, ".SERVICE", "must name"),
        ({"SENTINELS": [S1, "rediss://h:2"], "SERVICE": "m"}, ".SENTINELS", "one scheme"),
        ({"SENTINELS": [S1], "SERVICE": ""}, ".SERVICE", "must name"),
        ({"SENTINELS": [S1], "SERVICE": "m", "DB": -1}, ".DB", ">= 0"),
        ({"SENTINELS": [S1], "SERVICE": "m", "DB": "0"}, ".DB", ">= 0"),
        ({"SENTINELS": [S1], "SERVICE": "m", "PASSWORD": 5}, ".PASSWORD", "a str"),
        ({"SENTINELS": [S1], "SERVICE": "m", "HOST": "x"}, ".HOST", "unknown key"),
    ],
)
def test_bad_sentinel_nodes_name_the_alias_and_key(node: Any, key: str, says: str) -> None:
    """Each malformed sentinel entry is ImproperlyConfigured naming the alias and the key."""
    with pytest.raises(ImproperlyConfigured) as info:
        parse_alias("jobs", {"NODES": ["redis://127.0.0.1:7001/0", node]})
    message = str(info.value)
    assert message.startswith(f"REDLOCK['jobs']['NODES[1]{key}']: "), message
    assert says in message


def test_metric_labels_of_sentinel_and_cluster_nodes() -> None:
    """Metrics and traces name a sentinel or cluster node by its label, without credentials
    (was: ``cache:None`` for both)."""
    from django_redlock.contrib.nodes import public_label

    node = {"SENTINELS": ["redis://:sentpw@127.0.0.1:26001"], "SERVICE": "m", "PASSWORD": "pw"}
    seeds = {"CLUSTER": ["redis://u:seedpw@127.0.0.1:7001"]}
    config = parse_alias("x", {"NODES": [node, seeds, S1], "KEY_PREFIX": "{x}:"})
    labels = [public_label(spec) for spec in config.nodes]
    assert labels == ["sentinel:m@localhost:26001/0", "cluster:localhost:7001", "localhost:26001/0"]


def test_prefix_checks_tell_sentinel_services_apart() -> None:
    """E003 sees two sentinel nodes as one node only when they name the same service and db
    (was: every sentinel node looked like the same one)."""
    from django_redlock import checks

    def alias(service: str, prefix: str) -> dict[str, Any]:
        return {"NODES": [{"SENTINELS": [S1], "SERVICE": service}], "KEY_PREFIX": prefix}

    apart = {"a": alias("one", "app:"), "b": alias("two", "app:v2:")}
    with override_settings(REDLOCK=apart):
        assert checks.check_settings() == []
    shared = {"a": alias("one", "app:"), "b": alias("one", "app:v2:")}
    with override_settings(REDLOCK=shared):
        assert [m.id for m in checks.check_settings()] == ["django_redlock.E003"]


def test_sentinel_passwords_never_show() -> None:
    """The master's password and the sentinels' URL passwords are in no label, repr or
    error; the label names the service, the sentinels and the db."""
    node = {
        "SENTINELS": ["redis://:sentpw@127.0.0.1:26001", S2],
        "SERVICE": "mymaster",
        "DB": 2,
        "USERNAME": "locker",
        "PASSWORD": "masterpw",
    }
    config = parse_alias("default", {"NODES": [node]})
    (spec,) = config.nodes
    assert spec.label == "sentinel:mymaster@localhost:26001,localhost:26002/2"
    for shown in (spec.label, repr(spec), repr(config)):
        assert "sentpw" not in shown and "masterpw" not in shown
    bad = {**node, "SENTINELS": ["redis://:sentpw@127.0.0.1:0"]}
    with pytest.raises(ImproperlyConfigured) as info:
        parse_alias("default", {"NODES": [bad]})
    assert "sentpw" not in str(info.value) and ":***@" in str(info.value)


def test_locks_through_the_sentinels_master(steady_group: SentinelGroup) -> None:
    """Single-node mode on a sentinel node: sync and asyncio locks exclude, tokens increase,
    the keys are on the master (and replicated); node health names the master."""
    group = steady_group
    with override_settings(REDLOCK=_alias(group)):
        manager = locks["default"]
        with manager.lock("job", timeout=0) as lease:
            with pytest.raises(LockNotAcquired):
                manager.acquire("job", timeout=0)
            assert group.master.client().exists("lock:job") == 1
            first = lease.token

        async def main() -> int:
            alease = await manager.aacquire("job", timeout=0)
            await alease.arelease()
            return alease.token

        assert asyncio.run(main()) > first
        (health,) = node_health(["default"])
        assert health.up and health.node.startswith("sentinel:mymaster@")
        assert health.master == f"127.0.0.1:{group.master.port}" and health.role == "master"
        assert health.shown.endswith(f"[master 127.0.0.1:{group.master.port}]")


def test_failover_quarantines_the_promoted_replica(group: SentinelGroup) -> None:
    """SIGKILL the master while a lease is held: the sentinels promote the replica, which the
    engine finds again and treats as a restarted node: it grants nothing until the longest TTL
    has passed since it was first seen (not even the held name), then tokens go on above
    every earlier one."""
    with override_settings(REDLOCK=_alias(group)):
        manager = locks["default"]
        held = manager.acquire("held", ttl=1.0, timeout=0)
        group.wait_replicated()  # the replica has the lease and the fence hash
        old = group.kill_master()
        killed = time.monotonic()
        new = group.wait_failover(old)
        assert new is not old
        promoted = time.monotonic()
        outcomes = []
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            try:
                lease = manager.acquire("other", timeout=0)
            except NodesUnavailable as exc:
                outcomes.append(str(exc))
                time.sleep(0.05)
                continue
            break
        else:
            pytest.fail(f"no lock after the failover: {outcomes[-3:]}")
        outage, after = time.monotonic() - killed, time.monotonic() - promoted
        print(f"\nsentinel failover: locks {outage:.2f} s after the kill ({after:.2f} s after)")
        assert outcomes and all("quarantined" in o for o in outcomes), outcomes[-1:]
        assert lease.token > held.token
        lease.release()
        assert after >= 0.9  # the longest TTL (1 s) from when the promoted replica was seen
        again = manager.acquire("held", timeout=0)  # the old lease has expired by now
        assert again.token > lease.token
        again.release()


def _role(node: Any) -> str:
    """The node's replication role; "" while it is switching (it closes its clients then)."""
    try:
        return str(node.client(decode_responses=True).info("replication")["role"])
    except redis.exceptions.ConnectionError:
        return ""


def test_sentinel_failover_command_demotes_without_a_kill(group: SentinelGroup) -> None:
    """``SENTINEL FAILOVER`` demotes a live master: connections to it close (or answer
    READONLY and are dropped) and the engine follows the sentinels to the new master."""
    with override_settings(REDLOCK=_alias(group)):
        manager = locks["default"]
        before = manager.acquire("x", timeout=0)
        before.release()
        old = group.master
        group.sentinels[0].client().execute_command("SENTINEL", "FAILOVER", group.service)
        new = group.wait_failover(old)
        deadline = time.monotonic() + 15  # the sentinels demote the old master after that
        while _role(old) != "slave":
            assert time.monotonic() < deadline, "the old master was never demoted"
            time.sleep(0.05)
        lease = manager.acquire("x", timeout=15)
        assert lease.token > before.token
        assert new.client().exists("lock:x") == 1
        lease.release()


def test_sentinel_node_in_a_redlock_set(group: SentinelGroup, redis_node_factory) -> None:
    """A sentinel node is one of three Redlock nodes: while its master is down and being
    failed over, the two plain nodes are a quorum, so locking never stops."""
    plain = redis_node_factory(2)
    nodes = [group.node_setting(), *plain.urls]
    with override_settings(REDLOCK={"default": {"NODES": nodes, "TTL": 1.0}}):
        manager = locks["default"]
        tokens = [manager.acquire("r", timeout=0)]
        tokens[0].release()
        old = group.kill_master()
        for _ in range(20):
            lease = manager.acquire("r", timeout=1)
            tokens.append(lease)
            lease.release()
            time.sleep(0.1)
        group.wait_failover(old)
        values = [t.token for t in tokens]
        assert values == sorted(set(values))


def test_readonly_reply_drops_the_connection(redis_node_factory) -> None:
    """A master turned replica behind our back (``REPLICAOF``, no client killed) answers
    READONLY: the engine drops that connection, so the next connect asks the sentinels (here a
    plain node: it reconnects to the same address) instead of failing on it forever."""
    nodes = redis_node_factory(2)
    with override_settings(REDLOCK={"default": {"NODES": [nodes[0].url]}}):
        manager = locks["default"]
        manager.acquire("a", timeout=0).release()
        admin = nodes[0].client(decode_responses=True)
        own = admin.client_id()
        before = {c["id"] for c in admin.client_list()} - {str(own)}
        assert before
        admin.replicaof("127.0.0.1", nodes[1].port)
        with pytest.raises(NodesUnavailable, match="READONLY"):
            manager.acquire("b", timeout=0)
        time.sleep(0.2)
        after = {c["id"] for c in admin.client_list() if c["flags"] != "M"} - {str(own)}
        assert not before & after, (before, after)
        admin.replicaof("no", "one")
        manager.acquire("b", timeout=5).release()


def test_deploy_checks_probe_the_sentinels_master(steady_group: SentinelGroup) -> None:
    """``check --deploy`` probes a sentinel node on its current master (W004 for an evicting
    policy there), and warns W007 for a replica named directly as a node."""
    group = steady_group
    from django_redlock import checks

    replica = next(node for node in group.servers if node is not group.master)
    nodes = [group.node_setting(), replica.url]
    master = group.master.client()
    policy = master.config_get("maxmemory-policy")["maxmemory-policy"]
    master.config_set("maxmemory-policy", "allkeys-lru")
    try:
        with override_settings(REDLOCK={"default": {"NODES": nodes, "NODE_TIMEOUT": 0.5}}):
            messages = checks.check_deployment()
    finally:
        master.config_set("maxmemory-policy", policy)  # the group is the module's
    found = {(m.id, m.msg.split(" node ")[1][:9]) for m in messages if " node " in m.msg}
    assert ("django_redlock.W004", "sentinel:") in found
    assert ("django_redlock.W007", "redis://1") in found
    assert "django_redlock.W005" not in {m.id for m in messages}


def test_command_and_admin_show_the_sentinels_master(
    steady_group: SentinelGroup, admin_client: Any
) -> None:
    """``redlock nodes`` and the admin's node table name the master the sentinels gave."""
    group = steady_group
    from io import StringIO

    from django.core.management import call_command
    from django.urls import reverse

    shown = f"[master 127.0.0.1:{group.master.port}]"
    with override_settings(REDLOCK=_alias(group)):
        locks["default"].acquire("seen", timeout=0).release()
        out = StringIO()
        call_command("redlock", "nodes", stdout=out)
        assert "sentinel:mymaster@" in out.getvalue() and shown in out.getvalue()
        html = admin_client.get(reverse("admin:django_redlock_lock_changelist")).content.decode()
        assert shown in html


def _view(sentinel: RedisNode, service: str) -> tuple[int, set[str]]:
    """The master's port and flags as ``sentinel`` sees them."""
    state = sentinel.client().sentinel_master(service)
    flags = state["flags"]
    return int(state["port"]), set(flags.split(",") if isinstance(flags, str) else flags)


def _until(condition: Any, what: str, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


def test_a_stale_sentinel_is_not_followed_to_the_old_master(group: SentinelGroup) -> None:
    """The first listed sentinel is paused across a failover and comes back with the view it
    had (restarted from its own config file: a resumed process would read the others'
    announcements waiting in its sockets at once), while the others stop announcing (as if
    it could not hear them). It still names the killed master, which it sees ``s_down``:
    locks pass it over for a sentinel that names the promoted replica, and tokens go on
    above the ones granted before the failover (was: every connect followed it to the dead
    master, and locking stopped)."""
    stale, *others = group.sentinels
    with override_settings(REDLOCK=_alias(group)):
        before = locks["default"].acquire("job", timeout=0)
        before.release()
    group.wait_replicated()
    stale.pause()
    old = group.kill_master()
    new = group.wait_failover(old)
    _until(lambda: all(_view(s, group.service)[0] == new.port for s in others), "no gossip")
    for sentinel in others:  # they announce the new master no more
        sentinel.client().execute_command("SENTINEL", "DEBUG", "publish-period", 3_600_000)
    stale.restart(keep_data=True)
    _until(lambda: _view(stale, group.service)[1] >= {"master", "s_down"}, "never s_down")
    assert _view(stale, group.service)[0] == old.port
    outcomes = []
    with override_settings(REDLOCK=_alias(group)):
        manager = locks["default"]
        deadline = time.monotonic() + 10
        while True:
            try:
                lease = manager.acquire("job", timeout=0)
                break
            except NodesUnavailable as exc:  # the promoted replica is quarantined for a TTL
                outcomes.append(str(exc))
                assert time.monotonic() < deadline, outcomes[-1]
                time.sleep(0.05)
        assert lease.token > before.token
        assert new.client().exists("lock:job") == 1
        (health,) = node_health(["default"])
        assert health.master == f"127.0.0.1:{new.port}"
        lease.release()
    assert all("quarantined" in o for o in outcomes), outcomes[-1:]
    assert _view(stale, group.service)[0] == old.port  # it was stale all along


def test_a_sentinel_that_knows_too_few_others_is_not_followed(
    steady_group: SentinelGroup, redis_node_factory: Any
) -> None:
    """A sentinel listed first that watches a stray server under the service's name and knows
    no other sentinel (it needs a majority of the listed ones with itself) is passed over: the
    lock is taken on the group's master, never on the stray server (was: granted there, so
    two servers could each grant the name)."""
    group = steady_group
    (stray,) = redis_node_factory(1)
    lonely = SentinelProcess(
        stray.port, group.service, quorum=1, down_after_ms=1000, failover_timeout_ms=4000
    ).start()
    try:
        node = group.node_setting(SENTINELS=[lonely.sentinel_url, *group.sentinel_urls])
        settings = {"default": {"NODES": [node], "TTL": 1.0}}
        with override_settings(REDLOCK=settings), locks["default"].lock("job", timeout=0):
            assert group.master.client().exists("lock:job") == 1
            assert stray.client().exists("lock:job") == 0
    finally:
        lonely.stop()
