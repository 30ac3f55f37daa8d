"""Nodes given as unix:// URLs, URLs with ACL users, and django-redis CACHES aliases."""

from __future__ import annotations

import asyncio

import pytest
from django.test import override_settings

from django_redlock import locks
from django_redlock.exceptions import NodesUnavailable
from django_redlock.testing import RedisNodes

#: The commands an ACL user of django-redlock needs (docs/algorithm.md repeats this list).
ACL_COMMANDS = (
    "+@connection +info +evalsha +eval +script|load +scan +blpop +rpush "
    "+get +set +del +exists +pttl +pexpire +hget +hmget +hset +hincrby +hexists"
)


def acl_user_urls(
    nodes: RedisNodes, user: str, password: str, prefix: str, commands: str = ACL_COMMANDS
) -> list[str]:
    """Create ``user`` on every node, confined to keys under ``prefix``, no pub/sub channels
    and ``commands``; returns the nodes' URLs with its credentials."""
    for node in nodes:
        node.client().execute_command(
            "ACL", "SETUSER", user, "on", f">{password}", f"~{prefix}*", "resetchannels",
            *commands.split(),
        )  # fmt: skip
    return [url.replace("redis://", f"redis://{user}:{password}@") for url in nodes.urls]


def _round_trip(alias: str = "default") -> int:
    lease = locks[alias].acquire("url-check", timeout=0)
    token = lease.token
    assert lease.release() is True

    async def main() -> None:
        alease = await locks[alias].aacquire("url-check", timeout=0)
        assert await alease.arelease() is True

    asyncio.run(main())
    return token


def test_unix_socket_node(redis_node_factory) -> None:
    """A unix:// node locks in sync and async code."""
    nodes = redis_node_factory(1, unix=True)
    assert nodes[0].url.startswith("unix://")
    with override_settings(REDLOCK={"default": {"NODES": nodes.urls}}):
        assert _round_trip() > 0


def test_cache_alias_node(redis_node) -> None:
    """A {"CACHE": alias} node reuses a django-redis cache's server and credentials."""
    caches = {
        "default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"},
        "locks": {"BACKEND": "django_redis.cache.RedisCache", "LOCATION": redis_node.url},
    }
    with override_settings(CACHES=caches, REDLOCK={"default": {"NODES": [{"CACHE": "locks"}]}}):
        assert _round_trip() > 0
        assert redis_node.client().exists("lock:__fence__") == 1


def test_acl_user_with_password(redis_node) -> None:
    """An ACL user limited to the key prefix and the commands the engine needs can lock;
    a wrong password fails with NodesUnavailable and the password never shows."""
    (good,) = acl_user_urls(RedisNodes([redis_node]), "locker", "pa55word", "app:")
    port = redis_node.port
    with override_settings(REDLOCK={"default": {"NODES": [good], "KEY_PREFIX": "app:"}}):
        assert _round_trip() > 0
    bad = f"redis://locker:wrong-secret@127.0.0.1:{port}/0"
    with override_settings(REDLOCK={"default": {"NODES": [bad], "KEY_PREFIX": "app:"}}):
        with pytest.raises(NodesUnavailable) as info:
            locks["default"].acquire("x", timeout=0)
        assert "wrong-secret" not in str(info.value)
        assert "wrong-secret" not in repr(info.value.errors)
