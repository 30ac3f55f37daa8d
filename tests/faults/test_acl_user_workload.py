"""The whole shop workload under least privilege: an ACL user limited to the alias's key
prefix and the documented commands runs the multi-process workload; ``KEYS`` is denied to it
while inspection (``list_locks``) works as that user, so inspection uses SCAN.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest
import redis

from django_redlock.inspection import list_locks
from django_redlock.locking.manager import LockManager
from django_redlock.testing import RedisNodes
from tests.faults.conftest import DURATION, TTL, WORKERS, Shop, assert_all_oracles
from tests.support.redis_acl import acl_user_urls

Nodes = Callable[..., RedisNodes]
Alias = Callable[..., LockManager]

USER, PASSWORD = "shopper", "Sh0p-pa55"


def test_acl_user_limited_to_prefix_runs_the_whole_workload(
    shop: Shop,
    redis_node_factory: Nodes,
    redlock_alias: Alias,
    report: Callable[..., None],
) -> None:
    """8 worker processes whose NODES are ``redis://shopper:...@`` URLs of a user limited to
    ``~<prefix>*``, no channels and the documented ACL_COMMANDS run the whole workload: every
    oracle holds and no command is refused (a NOPERM would be a raw error or a failure
    reason). ``KEYS *`` as that user is NoPermissionError, while ``list_locks`` as that user,
    in this process during and after the run, answers without errors: inspection uses SCAN.
    A control shows the user really is confined (a key outside the prefix is denied)."""
    nodes = redis_node_factory(3)
    urls = acl_user_urls(nodes, USER, PASSWORD, shop.prefix)
    user = redis.Redis(host="127.0.0.1", port=nodes[0].port, username=USER, password=PASSWORD)
    with pytest.raises(redis.exceptions.NoPermissionError):
        user.get("other:secret")  # control: the ACL confines this user
    admins = [node.client() for node in nodes]
    assert admins[0].execute_command("ACL", "LOG")  # ...and denials are logged
    for admin in admins:
        admin.execute_command("ACL", "LOG", "RESET")
    inspector = redlock_alias(urls, KEY_PREFIX=shop.prefix, TTL=TTL, NODE_TIMEOUT=1.0)
    pages: list[Any] = []
    as_user: set[str] = set()

    def inspect_during(pool: Any) -> None:
        deadline = time.monotonic() + DURATION
        while time.monotonic() < deadline:
            pages.append(list_locks(using=[inspector.alias]))
            as_user.update(c["addr"] for c in admins[0].client_list() if c.get("user") == USER)
            time.sleep(0.1)

    run = shop.run(shop.settings(urls), during=inspect_during)
    listed = sum(len(page.locks) for page in pages)
    report("ACL user", run, inspections=len(pages), listed=listed, connections=len(as_user))
    failures = [e["error"] for e in run.history.of("fail")]
    assert not [f for f in failures if "NOPERM" in f or "NoPermission" in f], failures[:3]
    assert_all_oracles(run, nodes, shop.prefix, TTL + 2.0)
    assert len(as_user) > WORKERS // 2, as_user  # the workers really connected as the user
    assert [a.execute_command("ACL", "LOG") for a in admins] == [[], [], []]  # nothing denied
    assert pages and not [page.errors for page in pages if page.errors]
    assert all(info.name.startswith("product:") for page in pages for info in page.locks)
    after = list_locks(using=[inspector.alias])
    assert after.locks == [] and not after.errors
    with pytest.raises(redis.exceptions.NoPermissionError):
        user.keys("*")
    with pytest.raises(redis.exceptions.NoPermissionError):
        user.keys(f"{shop.prefix}*")
