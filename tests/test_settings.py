"""Settings validation, the alias registry and bad input to the lock API (system checks:
``tests/test_checks.py``)."""

from __future__ import annotations

import math

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.test import override_settings

from django_redlock import locks
from django_redlock.conf import mask_url, parse_alias


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


@pytest.mark.parametrize(
    ("url", "masked"),
    [
        ("redis://127.0.0.1:6379/0?password=s3cret", "redis://127.0.0.1:6379/0?password=***"),
        ("unix:///run/redis.sock?db=1&password=s3cret", "unix:///run/redis.sock?db=1&password=***"),
        ("unix://:s3cret@/run/redis.sock", "unix://:***@/run/redis.sock"),
        ("rediss://user:s3cret@h:6380/0", "rediss://user:***@h:6380/0"),
        ("rediss://h/0?username=u&password=s3cret", "rediss://h/0?username=u&password=***"),
        ("rediss://h/0?ssl_password=s3cret&Password=s3cret", "rediss://h/0?ssl_password=***&Password=***"),
        ("redis://u:p@ss:s3cret@h/0", "redis://u:***@h/0"),
        ("redis://127.0.0.1:6379/0", "redis://127.0.0.1:6379/0"),
        ("unix:///run/re@dis.sock", "unix:///run/re@dis.sock"),
    ],
)  # fmt: skip
def test_query_and_userinfo_passwords_are_masked(url: str, masked: str) -> None:
    """``?password=`` (and ``ssl_password``), ``unix://:pw@`` and ``user:pw@`` are masked
    by the one masking function, so node labels never show them."""
    assert mask_url(url) == masked
    if "Password" not in url:  # redis-py rejects that key (see test_node_urls.py)
        config = parse_alias("x", {"NODES": [url]})
        assert config.nodes[0].label == masked
        assert "s3cret" not in repr(config)  # a debug page or Sentry shows locals' reprs


@pytest.mark.parametrize(
    "url",
    [
        "unix://:s3cret@",  # names no socket path
        "redis://127.0.0.1:notaport/0?password=s3cret",  # bad port
        "http://127.0.0.1:6379/0?password=s3cret",  # not a redis URL
        "redis://?password=s3cret",  # names no host
        "redis://[::1/0?password=s3cret",  # unparseable: urlsplit raises
    ],
)
def test_bad_url_errors_mask_passwords(url: str) -> None:
    """The ImproperlyConfigured of a bad URL names the alias and key without the password."""
    with pytest.raises(ImproperlyConfigured) as info:
        parse_alias("x", {"NODES": [url]})
    assert "s3cret" not in str(info.value) and "'NODES[0]'" in str(info.value)


REFUSED = {
    "ttl-2ms": ({"TTL": 0.002}, "TTL", "2 ms"),
    "ttl-1ms": ({"TTL": 0.001}, "TTL", "2 ms"),
    "drift-0.9999": ({"DRIFT_FACTOR": 0.9999, "TTL": 10}, "DRIFT_FACTOR", "0.5"),
    "drift-0.6": ({"DRIFT_FACTOR": 0.6}, "DRIFT_FACTOR", "0.5"),
    "ttl-vs-drift": ({"DRIFT_FACTOR": 0.5, "TTL": 0.004}, "TTL", "DRIFT_FACTOR"),
    "node-timeout-1e-9": ({"NODE_TIMEOUT": 1e-9}, "NODE_TIMEOUT", "0.001"),
    "node-timeout-0.5ms": ({"NODE_TIMEOUT": 0.0005}, "NODE_TIMEOUT", "0.001"),
    "node-timeout-1e300": ({"NODE_TIMEOUT": 1e300}, "NODE_TIMEOUT", "60"),
    "node-timeout-61": ({"NODE_TIMEOUT": 61}, "NODE_TIMEOUT", "60"),
    "retry-delay-1e-12": ({"RETRY_DELAY": 1e-12}, "RETRY_DELAY", "0.001"),
    "retry-delay-0.9ms": ({"RETRY_DELAY": 0.0009}, "RETRY_DELAY", "0.001"),
}


@pytest.mark.parametrize(("raw", "key", "rule"), list(REFUSED.values()), ids=list(REFUSED))
def test_settings_that_cannot_grant_or_that_hammer_redis_are_refused(
    raw: dict[str, object], key: str, rule: str
) -> None:
    """A TTL at or below its drift allowance (TTL * DRIFT_FACTOR + 2 ms), a DRIFT_FACTOR
    above 0.5, NODE_TIMEOUT outside [1 ms, 60 s] and RETRY_DELAY below 1 ms are refused at
    parse time, naming the alias and key and stating the rule."""
    with pytest.raises(ImproperlyConfigured) as info:
        parse_alias("main", raw)
    message = str(info.value)
    assert f"REDLOCK['main']['{key}']" in message and rule in message, message


def test_bounds_themselves_are_accepted() -> None:
    """The bounds are inclusive where they are stated as "at least"/"at most"."""
    config = parse_alias(
        "x", {"TTL": 0.003, "NODE_TIMEOUT": 0.001, "RETRY_DELAY": 0.001, "DRIFT_FACTOR": 0.0}
    )
    assert (config.ttl, config.node_timeout, config.retry_delay) == (0.003, 0.001, 0.001)
    assert parse_alias("x", {"NODE_TIMEOUT": 60, "DRIFT_FACTOR": 0.5}).node_timeout == 60


@pytest.mark.parametrize("ttl", [0.002, 0.001, 0.0001])
def test_ttl_argument_without_validity_is_refused(ttl: float) -> None:
    """A ttl= at or below its drift allowance can never be granted: ValueError stating the
    rule, before any network call (was: a "busy (1/1 votes)" on a free name)."""
    with pytest.raises(ValueError, match=r"TTL \* DRIFT_FACTOR \+ 2 ms"):
        locks["default"].acquire("no-validity", ttl=ttl, timeout=0)
    lease = locks["default"].acquire("no-validity", ttl=0.05, timeout=0)
    lease.release()


def test_nodes_unavailable_hint_names_every_cause_of_quarantine() -> None:
    """A node is quarantined not only after a restart but also after FLUSHALL, REPLICAOF
    or eviction of its fence hash (allkeys-lru); the hint says so and points at check W004
    (was: "a restarted node votes again one lease TTL after its restart")."""
    from django_redlock.exceptions import NodesUnavailable

    exc = NodesUnavailable("x", answered=0, quorum=1, total=1, errors={"n": "quarantined"})
    assert "restarted, wiped or evicted" in str(exc) and "W004" in str(exc), str(exc)
