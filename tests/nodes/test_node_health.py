"""One reading of node health (``django_redlock.nodes.probe``) behind every report of it: the
health view, ``check --deploy``, ``manage.py redlock nodes`` and the admin's node panel, through
the least-privilege ACL user of docs/algorithm.md (``+info``, no ``+config``), and the probe of
an alias's nodes all at once; real redis-server nodes throughout."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from io import StringIO
from pathlib import Path
from typing import Any, TypeVar

import pytest
import redis
from django.core.management import call_command
from django.test import Client
from django.urls import reverse

from django_redlock import checks, inspection
from django_redlock.contrib.health.report import statuses
from django_redlock.locking.manager import LockManager
from django_redlock.testing import RedisNodes
from tests.support.redis_acl import acl_user_urls

T = TypeVar("T")

PREFIX = "managed:"
EVICTING = ("--maxmemory-policy", "allkeys-lru")


def nodes_command(alias: str) -> list[dict[str, Any]]:
    out = StringIO()
    call_command("redlock", "nodes", "--using", alias, "--json", stdout=out)
    rows: list[dict[str, Any]] = json.loads(out.getvalue())
    return rows


def nodes_table(alias: str) -> str:
    out = StringIO()
    call_command("redlock", "nodes", "--using", alias, stdout=out)
    return out.getvalue()


def deploy_warnings(alias: str) -> list[tuple[str, str]]:
    """``check --deploy``'s messages about ``alias``: (id, message)."""
    return [(m.id or "", m.msg) for m in checks.check_deployment() if repr(alias) in m.msg]


def admin_nodes_panel(client: Client, django_user_model: Any) -> str:
    client.force_login(django_user_model.objects.create_superuser("root", password="pw"))
    page = client.get(reverse("admin:django_redlock_lock_changelist")).content.decode()
    return page[page.index('id="redlock-nodes"') : page.index('id="changelist"')]


def acl_alias(
    nodes: RedisNodes, redlock_alias: Callable[..., LockManager], **options: Any
) -> LockManager:
    """A test alias reaching ``nodes`` as the documented ACL user, which cannot run CONFIG."""
    urls = acl_user_urls(nodes, "locker", "pa55word", PREFIX)
    with pytest.raises(redis.exceptions.NoPermissionError):
        redis.Redis.from_url(urls[0]).config_get("maxmemory-policy")
    return redlock_alias(urls, KEY_PREFIX=PREFIX, NODE_TIMEOUT=0.05, **options)


@pytest.mark.django_db
@pytest.mark.urls("tests.support.health_urls")
def test_evicting_nodes_behind_an_acl_user_without_config_fail_everywhere(
    client: Client,
    django_user_model: Any,
    redis_node_factory: Callable[..., RedisNodes],
    redlock_alias: Callable[..., LockManager],
) -> None:
    """Two allkeys-lru nodes of three, reached as a user with +info and no +config, are
    read as allkeys-lru (not "unknown"): they cannot vote, so the health view answers 503
    naming them, check --deploy warns W004 for each, and `redlock nodes` (table and JSON) and
    the admin's node panel show them as evicting; the noeviction node is not flagged."""
    good = redis_node_factory(1)
    evicting = redis_node_factory(2, extra_args=EVICTING)
    manager = acl_alias(RedisNodes([*good, *evicting]), redlock_alias)

    response = client.get("/health/", {"alias": manager.alias})
    assert response.status_code == 503
    body = response.json()["aliases"][0]
    assert body["problems"] == [
        "node 1 has maxmemory-policy allkeys-lru",
        "node 2 has maxmemory-policy allkeys-lru",
    ]
    assert [(n["eviction_policy"], n["evicts"], n["votes"]) for n in body["nodes"]] == [
        ("noeviction", False, True),
        ("allkeys-lru", True, False),
        ("allkeys-lru", True, False),
    ]
    assert client.get("/ht/", {"format": "json"}).status_code == 500

    warnings = deploy_warnings(manager.alias)
    assert [warning_id for warning_id, _ in warnings] == ["django_redlock.W004"] * 2
    assert all("'allkeys-lru'" in message for _, message in warnings)

    rows = nodes_command(manager.alias)
    assert [(r["up"], r["maxmemory_policy"], r["evicts"], r["role"]) for r in rows] == [
        (True, "noeviction", False, "master"),
        (True, "allkeys-lru", True, "master"),
        (True, "allkeys-lru", True, "master"),
    ]
    table = nodes_table(manager.alias)
    assert table.count("allkeys-lru (evicts lock keys)") == 2 and "unknown" not in table

    panel = admin_nodes_panel(client, django_user_model)
    assert panel.count('class="evicts">allkeys-lru (evicts lock keys)') == 2


@pytest.mark.django_db
@pytest.mark.urls("tests.support.health_urls")
def test_noeviction_nodes_behind_the_same_acl_user_read_healthy(
    client: Client,
    django_user_model: Any,
    redis_node_factory: Callable[..., RedisNodes],
    redlock_alias: Callable[..., LockManager],
) -> None:
    """Three noeviction nodes reached as the same user (after a lock was taken, so the
    run ids are compared with the fence marks) read healthy everywhere: 200 with every node
    voting, no W004/W005/W006, `redlock nodes` and the admin show noeviction, not evicting."""
    manager = acl_alias(redis_node_factory(3), redlock_alias)
    manager.acquire("warm-up", timeout=1).release()

    response = client.get("/health/", {"alias": manager.alias})
    assert response.status_code == 200
    body = response.json()["aliases"][0]
    assert body["voting"] == 3 and body["problems"] == []
    assert deploy_warnings(manager.alias) == []
    rows = nodes_command(manager.alias)
    assert [(r["maxmemory_policy"], r["evicts"]) for r in rows] == [("noeviction", False)] * 3
    assert all(r["run_id"] and len(r["run_id"]) == 40 and not r["error"] for r in rows)
    panel = admin_nodes_panel(client, django_user_model)
    assert panel.count("<td>noeviction</td>") >= 3 and "evicts" not in panel


def test_a_user_denied_info_and_config_reads_unknown(
    redis_node_factory: Callable[..., RedisNodes],
    redlock_alias: Callable[..., LockManager],
) -> None:
    """A user refused INFO memory falls back to CONFIG GET; refused both, the node is up
    with policy "unknown" and the refusal in ``error`` (check --deploy: W006, not W005)."""
    nodes = redis_node_factory(1)
    client = nodes[0].client()
    client.execute_command(
        "ACL", "SETUSER", "blind", "on", ">pw", "~*", "+@all", "-info", "-config"
    )
    client.execute_command("ACL", "SETUSER", "confonly", "on", ">pw", "~*", "+@all", "-info")
    blind = redlock_alias([nodes[0].url.replace("redis://", "redis://blind:pw@")])
    confonly = redlock_alias([nodes[0].url.replace("redis://", "redis://confonly:pw@")])
    (node,) = inspection.node_health([blind.alias])
    assert node.up and node.maxmemory_policy == "unknown"
    assert node.error.startswith("INFO server, memory, replication refused: NoPermissionError")
    (node,) = inspection.node_health([confonly.alias])
    assert node.up and node.maxmemory_policy == "noeviction"
    assert [warning_id for warning_id, _ in deploy_warnings(blind.alias)] == ["django_redlock.W006"]


@pytest.mark.urls("tests.support.health_urls")
def test_replicas_cannot_vote(
    client: Client,
    redis_node_factory: Callable[..., RedisNodes],
    redlock_alias: Callable[..., LockManager],
) -> None:
    """The role is read too: two of three nodes turned into replicas of the first (they
    refuse the lock scripts' writes) cannot vote, so the health view answers 503 naming them,
    and `redlock nodes` shows them as replicas."""
    nodes = redis_node_factory(3)
    for replica in (nodes[1], nodes[2]):
        replica.client().replicaof("127.0.0.1", nodes[0].port)
    manager = redlock_alias(nodes, NODE_TIMEOUT=0.05)
    response = client.get("/health/", {"alias": manager.alias})
    assert response.status_code == 503
    body = response.json()["aliases"][0]
    assert body["problems"] == ["node 1 is a replica", "node 2 is a replica"]
    assert [n["role"] for n in body["nodes"]] == ["master", "slave", "slave"]
    assert [r["role"] for r in nodes_command(manager.alias)] == ["master", "slave", "slave"]
    assert nodes_table(manager.alias).count("up (replica)") == 2


def _client_connections(ports: set[int]) -> int:
    """Established TCP connections to ``ports`` on loopback (the client side: its remote
    port is the node's), from /proc/net/tcp."""
    count = 0
    for line in Path("/proc/self/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        if fields[3] == "01" and int(fields[2].rsplit(":", 1)[1], 16) in ports:
            count += 1
    return count


def _most_at_once(ports: set[int], call: Callable[[], T]) -> tuple[T, int]:
    """Run ``call`` in a thread; returns its result and the most connections to ``ports``
    that were open at one time meanwhile."""
    result: list[T] = []
    worker = threading.Thread(target=lambda: result.append(call()))
    worker.start()
    most = 0
    while worker.is_alive():
        most = max(most, _client_connections(ports))
        worker.join(0.005)
    return result[0], most


@pytest.mark.skipif(not Path("/proc/self/net/tcp").exists(), reason="reads /proc/net/tcp")
def test_paused_nodes_are_probed_at_the_same_time(
    redis_node_factory: Callable[..., RedisNodes], redlock_alias: Callable[..., LockManager]
) -> None:
    """With three of five nodes SIGSTOPped, the health check and `redlock nodes`/the
    admin's reading return, report those three down, and waited on all three at once (three
    connections to the paused nodes open together), so they cost one timeout, not three."""
    nodes = redis_node_factory(5)
    manager = redlock_alias(nodes, NODE_TIMEOUT=0.25)  # a socket timeout of 1 s per probe
    paused = [nodes[1], nodes[2], nodes[3]]
    ports = {node.port for node in paused if node.port is not None}
    for node in paused:
        node.pause()
    try:
        (status,), most = _most_at_once(ports, lambda: statuses([manager.alias]))
        assert not status.healthy and status.voting == 2
        assert status.problems() == [f"node {i} unreachable" for i in (1, 2, 3)]
        assert most >= 3
        report, most = _most_at_once(ports, lambda: inspection.node_health([manager.alias]))
        assert [node.up for node in report] == [True, False, False, False, True]
        assert all("Timeout" in node.error for node in report[1:4])
        assert most >= 3
    finally:
        for node in paused:
            node.resume()
