"""Nodes given as unix:// URLs, URLs with ACL users, and CACHES aliases (django-redis and
Django's own RedisCache)."""

from __future__ import annotations

import asyncio

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.test import override_settings

from django_redlock import locks
from django_redlock.conf import parse_alias
from django_redlock.exceptions import LockNotAcquired, NodesUnavailable
from django_redlock.testing import RedisNodes
from tests.support.redis_acl import acl_user_urls


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


def test_django_redis_cache_node(redis_node_factory) -> None:
    """A {"CACHE": alias} node may be Django's own RedisCache: its first server (the one it
    writes to) is the node, with the password of its URL; locks exclude, tokens increase."""
    nodes = redis_node_factory(2)
    (url,) = acl_user_urls(RedisNodes([nodes[0]]), "cacheuser", "s3cret-pw", "")
    caches = {
        "default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"},
        "builtin": {
            "BACKEND": "django.core.cache.backends.redis.RedisCache",
            "LOCATION": f"{url};{nodes[1].url}",
        },
    }
    alias = {"default": {"NODES": [{"CACHE": "builtin"}]}}
    with override_settings(CACHES=caches, REDLOCK=alias):
        first = _round_trip()
        assert _round_trip() > first
        with locks["default"].lock("held", timeout=0), pytest.raises(LockNotAcquired):
            locks["default"].acquire("held", timeout=0)
        assert nodes[0].client().exists("lock:__fence__") == 1
        assert nodes[1].client().exists("lock:__fence__") == 0


def test_cache_node_must_be_a_redis_cache() -> None:
    """A CACHE node naming a cache that does not talk to Redis, or whose BACKEND cannot be
    imported, is refused at parse time, naming the alias and the key."""
    caches = {
        "default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"},
        "nowhere": {"BACKEND": "no.such.Backend"},
    }
    with override_settings(CACHES=caches):
        with pytest.raises(ImproperlyConfigured, match=r"\['NODES\[0\]'\].*does not talk"):
            parse_alias("x", {"NODES": [{"CACHE": "default"}]})
        with pytest.raises(ImproperlyConfigured, match="cannot be imported"):
            parse_alias("x", {"NODES": [{"CACHE": "nowhere"}]})


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


MISREAD_URLS = {
    "port-0": ("redis://10.0.0.5:0/0?password=s3cret", "port 0"),
    "db-not-a-number": ("redis://10.0.0.5:6380/O?password=s3cret", "'O'"),
    "db-negative-path": ("redis://10.0.0.5:6380/-1", "'-1'"),
    "db-two-segments": ("redis://10.0.0.5:6380/0/1", "'0/1'"),
    "db-negative-query": ("unix:///run/redis.sock?db=-2&password=s3cret", "db -2"),
    "db-query-not-a-number": ("unix:///run/redis.sock?db=O", "'db'"),
    "socket-timeout-abc": ("redis://127.0.0.1:7301/0?socket_timeout=abc", "'socket_timeout'"),
    "unknown-key": ("redis://127.0.0.1:7301/0?sockettimeout=1", "'sockettimeout'"),
    "ssl-key-on-plain": ("redis://127.0.0.1:7301/0?ssl_cert_reqs=none", "'ssl_cert_reqs'"),
    "ssl-cert-reqs-bogus": ("rediss://127.0.0.1:7306/0?ssl_cert_reqs=bogus", "bogus"),
    "protocol-4": ("redis://127.0.0.1:7301/0?protocol=4", "protocol"),
}


@pytest.mark.parametrize(("url", "says"), list(MISREAD_URLS.values()), ids=list(MISREAD_URLS))
def test_urls_redis_py_would_misread_or_reject_are_refused(url: str, says: str) -> None:
    """A URL that redis-py would silently rewrite (port 0 -> 6379, a db path that is not a
    number -> db 0) or reject later (bad or unknown query parameters) is ImproperlyConfigured
    at parse time, naming the alias, ``NODES[i]`` and the problem, never the password."""
    with pytest.raises(ImproperlyConfigured) as info:
        parse_alias("x", {"NODES": ["redis://127.0.0.1:6379/0", url]})
    message = str(info.value)
    assert message.startswith("REDLOCK['x']['NODES[1]']: ") and says in message, message
    assert "s3cret" not in message


@pytest.mark.parametrize(
    "url",
    [
        "redis://h",
        "redis://h/",
        "redis://h:6379/15",
        "redis://[::1]:6379/0",
        "redis://u:p%40ss@h/0?socket_keepalive=true&health_check_interval=5",
        "rediss://h/0?ssl_cert_reqs=none&ssl_check_hostname=false",
        "unix:///run/redis.sock?db=2&password=pw",
        "unix://user:pw@/run/redis.sock",
    ],
)
def test_urls_redis_py_reads_as_written_are_accepted(url: str) -> None:
    """The forms redis-py documents (and reads as written) still parse."""
    assert parse_alias("x", {"NODES": [url]}).nodes[0].url == url
