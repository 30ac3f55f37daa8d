"""An ACL user allowed ``EVALSHA`` but refused ``EVAL``, after ``SCRIPT FLUSH``: every call
gets ``NOSCRIPT``, then ``NOPERM`` on the ``EVAL`` fallback. Nothing may be reported done
that did not run: no confirmed release, no grant, no renewal."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest

from django_redlock.exceptions import LockError, NodesUnavailable
from django_redlock.testing import RedisNodes
from tests.support.redis_acl import ACL_COMMANDS, acl_user_urls

#: the documented ACL user's commands without ``EVAL`` (``EVALSHA`` and ``SCRIPT LOAD`` kept)
WITHOUT_EVAL = " ".join(c for c in ACL_COMMANDS.split() if c != "+eval")
#: what the nodes answer the ``EVAL`` fallback (Redis and Valkey alike)
REFUSED = "'eval' command"


def _flush(nodes: RedisNodes) -> None:
    for node in nodes:
        node.client().script_flush()


def _holding(nodes: RedisNodes, key: str) -> int:
    return sum(node.client().exists(key) for node in nodes)


@pytest.mark.parametrize("count", [1, 3])
def test_a_release_refused_after_script_flush_is_unconfirmed_and_says_why(
    redis_node_factory: Any, redlock_alias: Any, caplog: pytest.LogCaptureFixture, count: int
) -> None:
    """release() is False (its compare-and-delete ran nowhere), the lease says
    ``release_unconfirmed``, and check()'s error and the give-back's warning name the
    refused command instead of a broken connection."""
    nodes = redis_node_factory(count)
    manager = redlock_alias(
        acl_user_urls(nodes, "noeval", "pw", "acl:", WITHOUT_EVAL),
        KEY_PREFIX="acl:",
        NODE_TIMEOUT=2.0,  # refusals are what it tests, not a slow node (a loaded machine)
    )
    lease = manager.acquire("n", ttl=5, timeout=0)
    _flush(nodes)
    with caplog.at_level(logging.WARNING, logger="django_redlock"):
        assert lease.release() is False
    assert _holding(nodes, "acl:n") == count  # the key stays: nothing may say it is gone
    assert lease.release_unconfirmed
    with pytest.raises(LockError, match="NOPERM") as info:
        lease.check()
    assert REFUSED in str(info.value)
    warned = [r.getMessage() for r in caplog.records if "not confirmed" in r.getMessage()]
    assert warned and "NOPERM" in warned[0] and REFUSED in warned[0]


def test_acquire_and_extend_refused_after_script_flush_are_not_granted(
    redis_node_factory: Any, redlock_alias: Any
) -> None:
    """On 3 nodes: an acquire gets no grant (NodesUnavailable naming the refusal, no key
    written), an extend no renewal (NodesUnavailable, the keys keep their TTL), sync and
    asyncio alike; an asyncio release is unconfirmed too, or, where a connection opened
    meanwhile loaded the scripts again, really released (never True with the keys left)."""
    nodes = redis_node_factory(3)
    manager = redlock_alias(
        acl_user_urls(nodes, "noeval", "pw", "acl:", WITHOUT_EVAL),
        KEY_PREFIX="acl:",
        NODE_TIMEOUT=2.0,  # refusals are what it tests, not a slow node (a loaded machine)
    )
    held = manager.acquire("e", ttl=5, timeout=0)
    _flush(nodes)
    with pytest.raises(NodesUnavailable, match="NOPERM"):
        manager.acquire("m", ttl=5, timeout=0)
    assert _holding(nodes, "acl:m") == 0
    with pytest.raises(NodesUnavailable, match="NOPERM"):
        held.extend(60)
    assert all(0 < node.client().pttl("acl:e") <= 5000 for node in nodes)

    async def asyncio_calls() -> bool:
        lease = await manager.aacquire("a", ttl=5, timeout=0)
        _flush(nodes)
        with pytest.raises(NodesUnavailable, match="NOPERM"):
            await manager.aacquire("am", ttl=5, timeout=0)
        with pytest.raises(NodesUnavailable, match="NOPERM"):
            await lease.aextend(60)
        released = await lease.arelease()
        assert released or lease.release_unconfirmed
        return released

    released = asyncio.run(asyncio_calls())
    assert _holding(nodes, "acl:am") == 0
    if released:  # a connection opened meanwhile (on a loaded machine) loaded the scripts
        assert _holding(nodes, "acl:a") < 2  # again: then the release really ran, on a quorum
    else:  # unconfirmed: the keys stay for their TTL
        assert _holding(nodes, "acl:a") == 3
