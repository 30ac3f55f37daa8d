"""System checks of the ``REDLOCK`` settings (``django_redlock/checks.py``): E001-E005 for bad
or clashing aliases and ``REDLOCK_BUSY_POLL``, the ``--deploy`` warnings, and every id listed
once in ``docs/checks.md``. The per-request lock checks are in
``tests/request_locks/test_request_checks.py``."""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest
from django.core import checks as django_checks
from django.core.exceptions import ImproperlyConfigured
from django.core.management import call_command
from django.test import override_settings

from django_redlock import checks, locks
from django_redlock.testing import RedisNodes
from tests.support.redis_acl import ACL_COMMANDS, acl_user_urls


def _check_ids(messages: list[object]) -> list[str]:
    return [m.id for m in messages]  # type: ignore[attr-defined]


def test_checks_report_bad_settings() -> None:
    """manage.py check reports invalid aliases as django_redlock.E002 (E001 for non-dicts)."""
    with override_settings(REDLOCK={"a": {"TTL": 0}}):
        assert _check_ids(checks.check_settings()) == ["django_redlock.E002"]
    with override_settings(REDLOCK=["x"]):
        assert _check_ids(checks.check_settings()) == ["django_redlock.E001"]


def test_nested_prefixes_on_shared_nodes_are_an_error() -> None:
    """Aliases sharing a node with nested prefixes are reported as E003; disjoint ones are not."""
    node = "redis://127.0.0.1:6399/0"
    nested = {
        "a": {"NODES": [node], "KEY_PREFIX": "app:"},
        "b": {"NODES": [node], "KEY_PREFIX": "app:v2:"},
    }
    with override_settings(REDLOCK=nested):
        assert _check_ids(checks.check_settings()) == ["django_redlock.E003"]
    apart = {
        "a": {"NODES": [node], "KEY_PREFIX": "app:"},
        "b": {"NODES": [node], "KEY_PREFIX": "jobs:"},
    }
    with override_settings(REDLOCK=apart):
        assert checks.check_settings() == []


@pytest.mark.parametrize("value", [-0.001, 0.5, math.inf, "0.0001", True, None])
def test_bad_busy_poll_is_reported_and_refused(value: object) -> None:
    """REDLOCK_BUSY_POLL outside [0, 0.01] seconds (or not a number) is check E004 and stops
    the registry from building a manager; 0 (off) and the default are fine."""
    with override_settings(REDLOCK={"default": {}}, REDLOCK_BUSY_POLL=value):
        assert _check_ids(checks.check_settings()) == ["django_redlock.E004"]
        with pytest.raises(ImproperlyConfigured, match="REDLOCK_BUSY_POLL"):
            locks["default"]
    for good in (0, 0.0, 0.0001, 0.01):
        with override_settings(REDLOCK={"default": {}}, REDLOCK_BUSY_POLL=good):
            assert checks.check_settings() == []
            assert locks["default"].engine.state.busy_poll == good


def test_same_prefix_on_overlapping_node_sets_is_an_error() -> None:
    """E005: one prefix on node sets that overlap without being equal (shared keys and fence
    counters on the common node). The same node list twice, or disjoint lists, are fine."""
    a, b, c = (f"redis://127.0.0.1:{p}/0" for p in (6391, 6392, 6393))
    with override_settings(REDLOCK={"one": {"NODES": [a]}, "three": {"NODES": [a, b, c]}}):
        assert _check_ids(checks.check_settings()) == ["django_redlock.E005"]
    with override_settings(
        REDLOCK={"x": {"NODES": [a, b, c]}, "y": {"NODES": [a, b, c], "NODE_TIMEOUT": 1.0}}
    ):
        assert checks.check_settings() == []
    with override_settings(REDLOCK={"x": {"NODES": [a]}, "y": {"NODES": [b]}}):
        assert checks.check_settings() == []


def test_deploy_checks(redis_node_factory) -> None:
    """--deploy warns about even node counts, duplicates, plaintext remote hosts, evicting
    maxmemory policies and unreachable nodes; a healthy 1-node alias gets no warning."""
    nodes: RedisNodes = redis_node_factory(2)
    nodes[1].client().config_set("maxmemory-policy", "allkeys-lru")
    redlock = {
        "single": {"NODES": [nodes[0].url]},
        "even": {"NODES": [nodes[0].url, nodes[0].url]},
        "remote": {"NODES": ["redis://10.255.255.1:6379/0"], "NODE_TIMEOUT": 0.05},
        "evict": {"NODES": [nodes[1].url]},
    }
    with override_settings(REDLOCK=redlock):
        ids = _check_ids(checks.check_deployment())
    assert sorted(ids) == sorted(
        [
            "django_redlock.W001",
            "django_redlock.W002",
            "django_redlock.W003",
            "django_redlock.W005",
            "django_redlock.W004",
        ]
    )
    with override_settings(REDLOCK={"default": {"NODES": [nodes[0].url]}}):
        assert checks.check_deployment() == []
        call_command("check", "--deploy", "--fail-level", "ERROR")


def test_check_ids_unique_and_documented() -> None:
    """Every check id in the package is listed exactly once in docs/checks.md."""
    package = Path(checks.__file__).parent
    source = "".join(p.read_text() for p in package.glob("*.py"))
    ids = set(re.findall(r"django_redlock\.([EW]\d{3})", source))
    ids |= set(re.findall(r'"([EW]\d{3})":', source))
    assert {"E001", "E002", "W001", "W005"} <= ids
    docs = (package.parent / "docs" / "checks.md").read_text()
    table_ids = re.findall(r"^\| `django_redlock\.([EW]\d{3})`", docs, re.MULTILINE)
    assert len(table_ids) == len(set(table_ids)), "an id is listed twice"
    assert ids <= set(table_ids), ids - set(table_ids)


def _pair(url_a: object, url_b: object, prefix_b: str = "x:y:") -> dict[str, object]:
    return {
        "a": {"NODES": [url_a], "KEY_PREFIX": "x:"},
        "b": {"NODES": [url_b], "KEY_PREFIX": prefix_b},
    }


@pytest.mark.parametrize(
    ("a", "b"),
    [
        ("redis://127.0.0.1:7301/0", "redis://localhost:7301/0"),
        ("redis://127.0.0.1:7301/0", "redis://[::1]:7301"),
        ("redis://LOCALHOST:7301/0", "redis://127.0.0.1:7301/0?db=0"),
        ("redis://127.0.0.1:6379/0", "redis://localhost"),
        ("unix:///run/redis/redis.sock", "unix:///run/redis/../redis/redis.sock?db=0"),
        ("redis://127.0.0.1:7301/2", {"CACHE": "locks"}),
    ],
)
def test_e003_sees_one_server_behind_two_spellings(a: object, b: object) -> None:
    """The same server reached as localhost, 127.0.0.1 or ::1 (or as a django-redis
    CACHES alias on the same URL) is one node for E003 (was: nested prefixes missed)."""
    caches = {
        "default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"},
        "locks": {
            "BACKEND": "django_redis.cache.RedisCache",
            "LOCATION": "redis://localhost:7301/2",
        },
    }
    with override_settings(CACHES=caches, REDLOCK=_pair(a, b)):
        assert _check_ids(checks.check_settings()) == ["django_redlock.E003"]


@pytest.mark.parametrize(
    ("a", "b"),
    [
        ("redis://127.0.0.1:7301/0", "redis://127.0.0.1:7301/1"),
        ("redis://127.0.0.1:7301/0", "redis://localhost:7301?db=3"),
        ("unix:///run/redis.sock?db=1", "unix:///run/redis.sock"),
        ("redis://127.0.0.1:7301/0", "redis://127.0.0.1:7302/0"),
    ],
)
def test_e003_and_e005_ignore_aliases_on_different_dbs(a: str, b: str) -> None:
    """Different DB numbers of one server share no keys: no E003 for nested prefixes,
    no E005 for one prefix on overlapping server lists (was: a spurious E003)."""
    with override_settings(REDLOCK=_pair(a, b)):
        assert checks.check_settings() == []
    c = "redis://127.0.0.1:7309/0"
    with override_settings(REDLOCK={"p": {"NODES": [a]}, "q": {"NODES": [b, c, c]}}):
        assert checks.check_settings() == []


def test_e005_sees_one_server_behind_two_spellings() -> None:
    """E005 uses the same node identity: localhost and 127.0.0.1 overlap."""
    a, b = "redis://127.0.0.1:7301/0", "redis://127.0.0.1:7302/0"
    same = {"p": {"NODES": [a]}, "q": {"NODES": [a.replace("127.0.0.1", "localhost"), b, b]}}
    with override_settings(REDLOCK=same):
        assert _check_ids(checks.check_settings()) == ["django_redlock.E005"]


def test_e002_and_w005_mask_query_passwords() -> None:
    """A password given as ``?password=`` or ``unix://:pw@`` is masked in E002 and W005."""
    bad = {
        "a": {"NODES": ["unix://:supersecret@"]},
        "b": {"NODES": ["redis://127.0.0.1:0/0?password=supersecret"]},
    }
    with override_settings(REDLOCK=bad):
        messages = checks.check_settings()
    assert _check_ids(messages) == ["django_redlock.E002"] * 2
    assert not [m.msg for m in messages if "supersecret" in m.msg]
    down = {"c": {"NODES": ["redis://127.0.0.1:1/0?password=supersecret"], "NODE_TIMEOUT": 0.05}}
    with override_settings(REDLOCK=down):
        (warning,) = checks.check_deployment()
    assert warning.id == "django_redlock.W005" and "supersecret" not in warning.msg
    assert "redis://127.0.0.1:1/0?password=***" in warning.msg


def test_check_deploy_never_crashes() -> None:
    """A node URL redis-py rejects is E002 under ``check`` (was: missed, then
    ``check --deploy`` crashed with ValueError), and a node whose probe raises anything (here a
    CACHE alias whose server is down) is a W005 naming the node; a CACHE alias that is not a
    Redis cache is an E002 naming the alias and the key."""
    bad = {"default": {"NODES": ["redis://127.0.0.1:7301/0?socket_timeout=abc"]}}
    with override_settings(REDLOCK=bad):
        assert _check_ids(checks.check_settings()) == ["django_redlock.E002"]
        messages = django_checks.run_checks(include_deployment_checks=True)
        assert "django_redlock.E002" in _check_ids(messages)
    with override_settings(REDLOCK={"default": {"NODES": [{"CACHE": "default"}]}}):
        messages = django_checks.run_checks(include_deployment_checks=True)
    (error,) = [m for m in messages if m.id == "django_redlock.E002"]
    assert "REDLOCK['default']['NODES[0]']: CACHES['default'] has BACKEND" in error.msg
    assert "does not talk to Redis" in error.msg
    caches = {
        "default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"},
        "down": {
            "BACKEND": "django.core.cache.backends.redis.RedisCache",
            "LOCATION": "redis://127.0.0.1:1/0",
        },
    }
    alias = {"default": {"NODES": [{"CACHE": "down"}], "NODE_TIMEOUT": 0.05}}
    with override_settings(CACHES=caches, REDLOCK=alias):
        messages = django_checks.run_checks(include_deployment_checks=True)
    (warning,) = [m for m in messages if m.id == "django_redlock.W005"]
    assert "node cache:down cannot be reached: ConnectionError" in warning.msg


def test_deploy_checks_with_the_documented_acl_user(redis_node_factory) -> None:
    """The ACL user of docs/algorithm.md (no CONFIG) gets no W005 "cannot be reached" from
    a node that answers: its policy is read from INFO memory (W004 if it evicts). A user denied
    INFO and CONFIG gets W006 (reachable, policy unknown), not W005."""
    nodes: RedisNodes = redis_node_factory(2)
    nodes[1].client().config_set("maxmemory-policy", "allkeys-lru")
    (fine, evicting) = acl_user_urls(nodes, "locker", "pa55word", "app:")
    with override_settings(REDLOCK={"a": {"NODES": [fine]}, "b": {"NODES": [evicting]}}):
        assert _check_ids(checks.check_deployment()) == ["django_redlock.W004"]
    without_info = " ".join(c for c in ACL_COMMANDS.split() if c != "+info")
    (blind, _) = acl_user_urls(nodes, "blind", "pa55word", "app:", without_info)
    with override_settings(REDLOCK={"a": {"NODES": [blind]}}):
        (warning,) = checks.check_deployment()
    assert warning.id == "django_redlock.W006", warning
    assert "pa55word" not in warning.msg and "cannot be reached" not in warning.msg


@pytest.mark.parametrize(
    ("name", "hint"),
    [
        ("REDLOCK_REQUEST_LOCK", "Did you mean REDLOCK_REQUEST_LOCKS?"),
        ("REDLOCK_BUSY_STATS", "Did you mean REDLOCK_BUSY_STATUS?"),
        ("REDLOCKS", "Did you mean REDLOCK?"),
        ("REDLOCK_TTL", "TTL is a key of each alias"),
    ],
)
def test_unknown_redlock_settings_are_w009(name: str, hint: str) -> None:
    """A ``REDLOCK*`` setting the app does not read (Django ignores it silently, so a misspelt
    ``REDLOCK_REQUEST_LOCK`` leaves every rule unapplied) is warned about by
    ``manage.py check``, with a hint naming the closest known setting."""
    with override_settings(**{name: [{"URL_NAME": "x", "KEY": "k"}]}):
        messages = [m for m in checks.check_settings() if m.id == "django_redlock.W009"]
        assert len(messages) == 1 and name in messages[0].msg
        assert hint in (messages[0].hint or "")
        assert isinstance(messages[0], django_checks.Warning)
    with override_settings(REDLOCK_BUSY_STATUS=409, REDLOCK_BUSY_POLL=0, REDLOCK_REQUEST_LOCKS=[]):
        assert "django_redlock.W009" not in _check_ids(checks.check_settings())
