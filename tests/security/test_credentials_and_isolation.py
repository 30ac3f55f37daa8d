"""Security: credentials, ACL least privilege, prefix isolation, glob injection, owner secrecy.

Real redis-server processes only. Each test says which promise it checks.
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
from collections.abc import Callable, Iterator
from io import StringIO
from typing import Any

import pytest
import redis
from django.conf import settings
from django.core.management import call_command
from django.core.management.base import CommandError

from django_redlock import checks, locks
from django_redlock.exceptions import LockNotAcquired, NodesUnavailable
from django_redlock.inspection import get_lock, list_locks, node_health
from django_redlock.locking.manager import LockManager
from django_redlock.testing import RedisNodes
from tests.support.redis_acl import acl_user_urls
from tests.support.waiting import assert_woken, backing_off, until_waiting

PASSWORD = "Sup3r-Secret-pw"


@pytest.fixture
def aliases() -> Iterator[Callable[..., LockManager]]:
    """``make(name, urls, **options)``: a named test-only alias, removed afterwards."""
    added: list[str] = []

    def make(name: str, urls: list[Any], **options: Any) -> LockManager:
        settings.REDLOCK = {**settings.REDLOCK, name: {"NODES": urls, **options}}
        added.append(name)
        locks.reset()
        return locks[name]

    yield make
    settings.REDLOCK = {k: v for k, v in settings.REDLOCK.items() if k not in added}
    locks.reset()


def test_wrong_password_fails_closed_and_is_masked(
    redis_node_factory: Callable[..., RedisNodes],
    aliases: Callable[..., LockManager],
    caplog: pytest.LogCaptureFixture,
) -> None:
    """AUTH with a wrong password raises NodesUnavailable; neither the wrong nor the right
    password shows in the exception, its errors, the manager's repr or the logs."""
    nodes = redis_node_factory(3)
    for node in nodes:  # after start: the launcher's readiness check pings without AUTH
        node.client().config_set("requirepass", PASSWORD)
    wrong = [u.replace("redis://", "redis://:wr0ng-Passw0rd@") for u in nodes.urls]
    manager = aliases("badauth", wrong, KEY_PREFIX="sec:")
    caplog.set_level(logging.DEBUG, logger="django_redlock")
    with pytest.raises(NodesUnavailable) as info:
        manager.acquire("x", timeout=0)
    shown = " ".join(
        [str(info.value), repr(info.value), repr(info.value.errors), repr(manager), caplog.text]
    )
    assert "wr0ng-Passw0rd" not in shown and PASSWORD not in shown
    good = [u.replace("redis://", f"redis://:{PASSWORD}@") for u in nodes.urls]
    manager = aliases("goodauth", good, KEY_PREFIX="sec:")
    lease = manager.acquire("x", timeout=0)
    assert PASSWORD not in repr(lease) + repr(manager)
    assert lease.release() is True


def test_query_string_password_is_masked_everywhere(
    redis_node_factory: Callable[..., RedisNodes],
    aliases: Callable[..., LockManager],
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A password given as ``?password=`` (the usual form for unix sockets) never shows in
    NodesUnavailable, its errors, log lines, node health (the admin node panel and
    ``redlock nodes``, text and JSON) or check W005; the label shows ``password=***``."""
    nodes = redis_node_factory(1)
    nodes[0].client().config_set("requirepass", PASSWORD)
    (url,) = nodes.urls
    wrong = aliases("qs-wrong", [f"{url}?password=wr0ng-Passw0rd"], KEY_PREFIX="qs:")
    good = aliases("qs-good", [f"{url}?password={PASSWORD}"], KEY_PREFIX="qs:")
    down = aliases("qs-down", ["redis://127.0.0.1:1/0?password=wr0ng-Passw0rd"], KEY_PREFIX="q:")
    caplog.set_level(logging.DEBUG, logger="django_redlock")
    with pytest.raises(NodesUnavailable) as info:
        wrong.acquire("x", timeout=0)
    with pytest.raises(NodesUnavailable) as refused:
        down.acquire("x", timeout=0)
    lease = good.acquire("x", timeout=0)
    assert lease.release() is True
    health = node_health(["qs-wrong", "qs-good", "qs-down"])
    out, as_json = StringIO(), StringIO()
    for options, stdout in (([], out), (["--json"], as_json)):
        with pytest.raises(CommandError):  # two nodes are down: exit status 1
            call_command("redlock", "nodes", *options, stdout=stdout, stderr=StringIO())
    warnings = [m.msg for m in checks.check_deployment()]
    shown = " ".join(
        [str(info.value), repr(info.value.errors), str(refused.value), caplog.text, repr(health),
         out.getvalue(), as_json.getvalue(), *warnings]
    )  # fmt: skip
    assert "wr0ng-Passw0rd" not in shown and PASSWORD not in shown
    assert f"{url}?password=***" in out.getvalue()
    assert "redis://127.0.0.1:1/0?password=***" in " ".join(warnings)


def test_acl_user_limited_to_prefix_runs_the_api_and_cannot_keys(
    redis_node_factory: Callable[..., RedisNodes], aliases: Callable[..., LockManager]
) -> None:
    """An ACL user limited to ``app:*`` and the documented commands acquires, extends,
    releases, force-releases and lists locks (inspection works, so it uses SCAN), while
    KEYS and keys outside the prefix are denied to it."""
    nodes = redis_node_factory(3)
    urls = acl_user_urls(nodes, "locker", "pa55word", "app:")
    manager = aliases("acl", urls, KEY_PREFIX="app:")
    with manager.lock("order:1", ttl=5, timeout=0) as lease:
        lease.extend()
        page = list_locks(using=["acl"])
        assert [info.name for info in page.locks] == ["order:1"] and not page.errors
        info, errors = get_lock("acl", "order:1")
        assert info is not None and info.token == lease.token and not errors
    held = manager.acquire("order:2", ttl=5, timeout=0)
    assert manager.force_release("order:2") == 3
    assert held.release() is False
    user = redis.Redis(host="127.0.0.1", port=nodes[0].port, username="locker",
                       password="pa55word")  # fmt: skip
    with pytest.raises(redis.exceptions.NoPermissionError):
        user.keys("app:*")
    with pytest.raises(redis.exceptions.NoPermissionError):
        user.get("other:secret")


def _hold(manager: LockManager, *names: str) -> list[Any]:
    return [manager.acquire(name, ttl=10, timeout=0) for name in names]


def _names(alias: str, prefix: str = "") -> list[str]:
    return sorted(info.name for info in list_locks(using=[alias], prefix=prefix).locks)


def test_two_projects_on_the_same_nodes_are_isolated(
    redis_node_factory: Callable[..., RedisNodes], aliases: Callable[..., LockManager]
) -> None:
    """Two projects (aliases) with prefixes ``shop:`` and ``blog:`` on the same nodes, holding
    the same names: listing, force-release and ``redlock clear`` of one never see or touch
    the other's locks, and its fence counter is its own."""
    nodes = redis_node_factory(3)
    shop = aliases("shop", nodes.urls, KEY_PREFIX="shop:")
    blog = aliases("blog", nodes.urls, KEY_PREFIX="blog:")
    _hold(shop, "a", "b")
    blog_leases = _hold(blog, "a", "c")
    assert _names("shop") == ["a", "b"] and _names("blog") == ["a", "c"]
    assert shop.force_release("c") == 0
    call_command("redlock", "clear", "--using", "shop", "--yes", stdout=StringIO())
    assert _names("shop") == [] and _names("blog") == ["a", "c"]
    assert all(lease.validity > 0 for lease in blog_leases)
    assert [lease.release() for lease in blog_leases] == [True, True]


def test_nested_prefixes_do_not_see_each_other(
    redis_node_factory: Callable[..., RedisNodes], aliases: Callable[..., LockManager]
) -> None:
    """Prefixes ``app:`` and ``app:v2:`` on the same nodes: ``app`` neither lists nor clears
    the locks of ``app:v2:`` (and ``manage.py check`` reports the pair as E003)."""
    nodes = redis_node_factory(3)
    outer = aliases("outer", nodes.urls, KEY_PREFIX="app:")
    inner = aliases("inner", nodes.urls, KEY_PREFIX="app:v2:")
    _hold(outer, "x")
    inner_lease = _hold(inner, "y")[0]
    page = list_locks(using=["outer"])
    assert [info.name for info in page.locks] == ["x"] and not page.errors, page
    call_command("redlock", "clear", "--using", "outer", "--yes", stdout=StringIO())
    assert inner_lease.release() is True, "clearing 'app:' released the lock of 'app:v2:'"


def test_glob_characters_in_names_cannot_widen_a_scan(
    redis_node_factory: Callable[..., RedisNodes], aliases: Callable[..., LockManager]
) -> None:
    """Names with ``* ? [ ] \\`` are literal: a prefix of ``*``, ``a?``, ``[ab]`` or ``\\``
    lists and clears only names that really start with those characters."""
    nodes = redis_node_factory(1)
    manager = aliases("glob", nodes.urls, KEY_PREFIX="g:")
    names = ["abc", "axc", "*star", "a?x", "[ab]c", "b", "back\\slash"]
    leases = dict(zip(names, _hold(manager, *names), strict=True))
    assert _names("glob", "*") == ["*star"]
    assert _names("glob", "a?") == ["a?x"]
    assert _names("glob", "[ab]") == ["[ab]c"]
    assert _names("glob", "back\\") == ["back\\slash"]
    assert _names("glob", "") == sorted(names)
    call_command("redlock", "clear", "--using", "glob", "--prefix", "*", "--yes",
                 stdout=StringIO())  # fmt: skip
    assert "*star" not in _names("glob") and len(_names("glob")) == len(names) - 1
    assert manager.force_release("a*") == 0  # an exact name, not a pattern
    assert all(leases[n].release() for n in names if n != "*star")


def test_owner_values_never_leak(
    redis_node_factory: Callable[..., RedisNodes],
    aliases: Callable[..., LockManager],
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The owner secret (the only thing that lets a client release or extend a lock) is never
    in the lease's repr, exceptions, logs, the inspection API or ``redlock list/show --json``."""
    nodes = redis_node_factory(3)
    manager = aliases("owner", nodes.urls, KEY_PREFIX="o:")
    caplog.set_level(logging.DEBUG, logger="django_redlock")
    lease = manager.acquire("secret", ttl=10, timeout=0)
    owner = nodes[0].client().get("o:secret").decode().split("|", 1)[0]
    assert len(owner) >= 32
    with pytest.raises(LockNotAcquired) as busy:
        manager.acquire("secret", timeout=0)
    out, shown = StringIO(), StringIO()
    call_command("redlock", "list", "--using", "owner", "--json", stdout=out)
    call_command("redlock", "show", "secret", "--using", "owner", "--json", stdout=shown)
    listed = list_locks(using=["owner"]).locks
    assert json.loads(out.getvalue())[0]["name"] == "secret"  # real output was produced
    assert json.loads(shown.getvalue())
    as_json = json.dumps([i.as_dict() for i in listed], default=str)
    texts = [
        repr(lease), str(lease.__dict__), str(busy.value), repr(busy.value), caplog.text,
        out.getvalue(), shown.getvalue(), repr(listed), as_json,
    ]  # fmt: skip
    lease.release()
    assert not [t for t in texts if owner in t]


def test_tls_fails_closed_on_wrong_ca_or_hostname(
    tls_server: dict[str, Any], aliases: Callable[..., LockManager]
) -> None:
    """``rediss://`` with local certificates: the right CA locks (also through a TLS sentinel
    naming a TLS-only master); a wrong CA, or a server certificate for another hostname,
    fails closed with NodesUnavailable (no plaintext fallback, no lock)."""
    port, certs = tls_server["port"], tls_server["certs"]

    def url(ca: str, port: int = port) -> str:
        return f"rediss://127.0.0.1:{port}/0?ssl_ca_certs={ca}&ssl_cert_reqs=required"

    good = aliases("tls-good", [url(certs["ca"])], KEY_PREFIX="tls:")
    lease = good.acquire("x", timeout=0)
    assert lease.token > 0 and lease.release() is True
    # waiting over TLS too: a waiter blocked in BLPOP is woken by the release, not let in by
    # a backoff step (tests/support/waiting.py)
    holder = good.acquire("w", ttl=30, timeout=0)
    woken: list[Any] = []
    with backing_off(good):
        thread = threading.Thread(target=lambda: woken.append(good.acquire("w", timeout=30)))
        thread.start()
        until_waiting(good, "w")
        holder.release()
        thread.join(30)
    assert woken and woken[0].token > holder.token
    assert_woken(good, "w", holder, woken)
    assert woken[0].release() is True

    async def over_tls() -> None:  # the asyncio lane: its spin never reads a TLS socket
        for i in range(50):
            alease = await good.aacquire(f"a{i}", timeout=0)
            assert await alease.arelease() is True
        assert alease.record.pinned.links[0].spin_fd == -1

    asyncio.run(over_tls())
    # a sentinel node over TLS: the master it names (TLS-only, no plaintext port) is reached
    # over TLS with the sentinels' URL options
    sentinel = url(certs["ca"], tls_server["sentinel_port"]).replace("/0?", "?")
    named = aliases("tls-sentinel", [{"SENTINELS": [sentinel], "SERVICE": "tls-service"}])
    lease = named.acquire("s", timeout=0)
    assert lease.token > 0 and lease.release() is True
    wrong_ca = aliases("tls-wrong-ca", [url(certs["other_ca"])], KEY_PREFIX="tls:")
    with pytest.raises(NodesUnavailable):
        wrong_ca.acquire("x", timeout=0)
    wrong_host = aliases(
        "tls-wrong-host", [url(certs["ca"], tls_server["wrong_host_port"])], KEY_PREFIX="tls:"
    )
    with pytest.raises(NodesUnavailable):
        wrong_host.acquire("x", timeout=0)
