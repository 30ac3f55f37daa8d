"""Settings validation, the alias registry, system checks and bad input to the lock API."""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.core.management import call_command
from django.test import override_settings

from django_redlock import checks, locks
from django_redlock.conf import mask_url, parse_alias
from django_redlock.testing import RedisNodes


@pytest.mark.parametrize(
    ("raw", "key"),
    [
        ({"TLL": 3}, "TLL"),
        ({"TTL": 0}, "TTL"),
        ({"TTL": -1}, "TTL"),
        ({"TTL": math.nan}, "TTL"),
        ({"TTL": 1e300}, "TTL"),
        ({"TTL": "30"}, "TTL"),
        ({"TTL": True}, "TTL"),
        ({"NODES": []}, "NODES"),
        ({"NODES": "redis://127.0.0.1"}, "NODES"),
        ({"NODES": ["http://127.0.0.1:6379"]}, "NODES[0]"),
        ({"NODES": ["redis://127.0.0.1:99999"]}, "NODES[0]"),
        ({"NODES": [{"CACHE": "nope"}]}, "NODES[0]"),
        ({"NODES": [{"CACHE": "default", "X": 1}]}, "NODES[0]"),
        ({"NODES": [42]}, "NODES[0]"),
        ({"KEY_PREFIX": 3}, "KEY_PREFIX"),
        ({"KEY_PREFIX": "a*"}, "KEY_PREFIX"),
        ({"NODE_TIMEOUT": 0}, "NODE_TIMEOUT"),
        ({"DRIFT_FACTOR": 1.5}, "DRIFT_FACTOR"),
        ({"TIMEOUT": -1}, "TIMEOUT"),
    ],
)
def test_bad_settings_name_alias_and_key(raw: dict[str, object], key: str) -> None:
    """Each bad setting raises ImproperlyConfigured naming the alias and the key."""
    with pytest.raises(ImproperlyConfigured) as info:
        parse_alias("main", raw)
    assert "'main'" in str(info.value) and f"'{key}'" in str(info.value)


def test_defaults_fill_missing_keys() -> None:
    """Missing keys take the documented defaults, TIMEOUT and NODES included."""
    config = parse_alias("x", {})
    assert config.ttl == 30.0 and config.timeout == 10.0 and config.key_prefix == "lock:"
    assert config.node_timeout == 0.05 and config.retry_delay == 0.2
    assert config.drift_factor == 0.01
    assert [n.url for n in config.nodes] == ["redis://127.0.0.1:6379/0"]


def test_password_is_masked_in_errors_and_labels() -> None:
    """A password in a node URL never appears in an error or a node label."""
    with pytest.raises(ImproperlyConfigured) as info:
        parse_alias("x", {"NODES": ["redis://user:s3cret@127.0.0.1:notaport"]})
    assert "s3cret" not in str(info.value)
    assert mask_url("rediss://user:s3cret@h:6380/0") == "rediss://user:***@h:6380/0"
    config = parse_alias("x", {"NODES": ["redis://:s3cret@127.0.0.1:6379/0"]})
    assert "s3cret" not in config.nodes[0].label


def test_unknown_alias_names_it() -> None:
    """locks['nope'] raises ImproperlyConfigured naming the alias."""
    with pytest.raises(ImproperlyConfigured, match="'nope'"):
        locks["nope"]


def test_override_settings_resets_registry(redis_node) -> None:
    """override_settings(REDLOCK=...) gives a fresh manager on the new nodes."""
    with override_settings(REDLOCK={"default": {"NODES": [redis_node.url], "TTL": 7}}):
        manager = locks["default"]
        assert manager.config.ttl == 7
        manager.acquire("override", timeout=0).release()
    assert locks["default"].config.ttl == 5.0


@pytest.mark.parametrize(
    ("name", "exc"),
    [
        ("", ValueError),
        (None, TypeError),
        (b"x", TypeError),
        ("x" * 513, ValueError),
        (3, TypeError),
    ],
)
def test_bad_names_fail_before_any_call(name: object, exc: type[Exception]) -> None:
    """Bad names raise TypeError/ValueError; the 512 limit excludes the prefix."""
    with pytest.raises(exc):
        locks["default"].acquire(name, timeout=0)  # type: ignore[arg-type]
    lease = locks["default"].acquire("y" * 512, timeout=0)
    assert lease.release() is True


@pytest.mark.parametrize(
    ("kwargs", "exc"),
    [
        ({"ttl": 0}, ValueError),
        ({"ttl": -1}, ValueError),
        ({"ttl": "5"}, TypeError),
        ({"ttl": True}, TypeError),
        ({"ttl": math.inf}, ValueError),
        ({"timeout": -1}, ValueError),
        ({"timeout": "1"}, TypeError),
        ({"max_hold": 0}, ValueError),
    ],
)
def test_bad_ttl_and_timeout(kwargs: dict[str, object], exc: type[Exception]) -> None:
    """ttl/timeout/max_hold of the wrong type or range fail before any network call."""
    with pytest.raises(exc):
        locks["default"].acquire("bad-args", **kwargs)  # type: ignore[arg-type]


def test_unreachable_nodes_raise_nodes_unavailable_not_redis_errors(redlock_alias) -> None:
    """With no node listening, the API raises NodesUnavailable carrying per-node reasons."""
    from django_redlock.exceptions import NodesUnavailable

    manager = redlock_alias(["redis://127.0.0.1:1/0"], NODE_TIMEOUT=0.05)
    with pytest.raises(NodesUnavailable) as info:
        manager.acquire("x", timeout=0)
    assert info.value.errors and info.value.quorum == 1


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
