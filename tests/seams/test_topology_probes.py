"""Probes of Sentinel discovery and of the test launchers' ``ports=``, written from
docs/topologies.md and docs/testing.md only. Real redis-server and sentinel processes."""

from __future__ import annotations

import contextlib
import os
import socket
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from django_redlock.exceptions import LockNotAcquired, NodesUnavailable
from django_redlock.locking.manager import LockManager
from django_redlock.testing import ClusterGroup, RedisNodes, SentinelGroup

Nodes = Callable[..., RedisNodes]
Alias = Callable[..., LockManager]


def _children() -> set[int]:
    """PIDs of this process's child processes (Linux)."""
    found: set[int] = set()
    for task in Path(f"/proc/{os.getpid()}/task").iterdir():
        with contextlib.suppress(FileNotFoundError):  # a thread that ended meanwhile
            found.update(int(pid) for pid in (task / "children").read_text().split())
    return found


@pytest.fixture
def busy_port() -> Iterator[int]:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(1)
    yield sock.getsockname()[1]
    sock.close()


def _free_ports(count: int, below: int = 65536) -> list[int]:
    """``count`` distinct ports below ``below`` that are free now."""
    ports: list[int] = []
    while len(ports) < count:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = int(sock.getsockname()[1])
        if port < below and port not in ports:
            ports.append(port)
    return ports


@pytest.mark.skipif(not Path("/proc/self/task").exists(), reason="Linux /proc")
@pytest.mark.parametrize(
    ("ports", "error"),
    [
        ([7000, 7001], ValueError),  # count: 1 + 1 + 3 = 5 wanted
        ([0, 7001, 7002, 7003, 7004], ValueError),
        ([65536, 7001, 7002, 7003, 7004], ValueError),
        ([-1, 7001, 7002, 7003, 7004], ValueError),
        ([7000, 7000, 7002, 7003, 7004], ValueError),
        ([True, 7001, 7002, 7003, 7004], (ValueError, TypeError)),
        (["7000", 7001, 7002, 7003, 7004], (ValueError, TypeError)),
        ([7000.0, 7001, 7002, 7003, 7004], (ValueError, TypeError)),
        ("70007", (ValueError, TypeError)),
        (7000, (ValueError, TypeError)),
    ],
)
def test_sentinel_group_ports_misuse_fails_before_any_process(ports: Any, error: Any) -> None:
    before = _children()
    with pytest.raises(error):
        SentinelGroup.start(replicas=1, sentinels=3, ports=ports)
    assert _children() == before


@pytest.mark.skipif(not Path("/proc/self/task").exists(), reason="Linux /proc")
@pytest.mark.parametrize(
    ("ports", "error"),
    [
        ([7000, 7001], ValueError),
        ([55536, 7001, 7002], ValueError),
        ([0, 7001, 7002], ValueError),
        ([7000, 7000, 7002], ValueError),
        ([7000, 17000, 7002], ValueError),  # 7000's bus port is another node's port
        ([True, 7001, 7002], (ValueError, TypeError)),
        ([7000.5, 7001, 7002], (ValueError, TypeError)),
    ],
)
def test_cluster_group_ports_misuse_fails_before_any_process(ports: Any, error: Any) -> None:
    before = _children()
    with pytest.raises(error):
        ClusterGroup.start(3, ports=ports)
    assert _children() == before


def test_ports_in_use_name_the_port(busy_port: int) -> None:
    before = _children()
    free = _free_ports(4)
    with pytest.raises(OSError, match=str(busy_port)):
        SentinelGroup.start(replicas=1, sentinels=3, ports=[*free, busy_port])
    assert _children() == before
    if busy_port > 10000:
        # a cluster port whose bus port (port + 10000) is the busy one
        with pytest.raises(OSError, match=str(busy_port)):
            ClusterGroup.start(3, ports=[busy_port - 10000, *_free_ports(2, below=45000)])
        assert _children() == before


def test_sentinels_that_are_no_sentinels_fail_clearly(
    redis_node_factory: Nodes, redlock_alias: Alias
) -> None:
    """A SENTINELS list of two plain redis-servers and a closed port: a lock call fails at
    once (no hang, no stray exception type), and its reason lists why each of the three was
    passed over (none cut off)."""
    plain = redis_node_factory(2)
    urls = [node.url.rsplit("/", 1)[0] for node in plain]
    manager = redlock_alias(
        [], NODES=[{"SENTINELS": [*urls, "redis://127.0.0.1:1"], "SERVICE": "mymaster"}]
    )
    started = time.monotonic()
    with pytest.raises(NodesUnavailable) as caught:
        manager.acquire("x", timeout=0)
    assert time.monotonic() - started < 5
    reason = str(caught.value)
    assert reason.count("ResponseError") == 2, reason
    assert "ConnectionError: Error 111" in reason, reason


def _flags(group: SentinelGroup) -> list[str]:
    views = []
    for watcher in group.sentinels:
        client = watcher.client(decode_responses=True)
        try:
            views.append(str(client.sentinel_master(group.service)["flags"]))
        finally:
            client.close()
    return views


def test_all_sentinels_see_the_master_down(redlock_alias: Alias) -> None:
    """No replica, the master paused past down-after: every sentinel sees it s_down, so a new
    connect follows none of them: a fresh alias fails at once listing their views. After the
    resume both the old alias and a fresh one lock again."""
    with SentinelGroup.start(replicas=0, sentinels=3, down_after_ms=300) as group:
        old = redlock_alias([], NODES=[group.node_setting()], NODE_TIMEOUT=0.1)
        old.acquire("warm", timeout=0).release()
        master = group.master
        master.pause()
        try:
            deadline = time.monotonic() + 10
            while not all("s_down" in f for f in _flags(group)):
                assert time.monotonic() < deadline, _flags(group)
                time.sleep(0.1)
            fresh = redlock_alias([], NODES=[group.node_setting()], NODE_TIMEOUT=0.1)
            started = time.monotonic()
            with pytest.raises(NodesUnavailable) as caught:
                fresh.acquire("y", timeout=0)
            assert time.monotonic() - started < 2
        finally:
            master.resume()
        assert str(caught.value).count("s_down") == 3, str(caught.value)
        deadline = time.monotonic() + 10
        for manager in (old, fresh):
            while True:
                try:
                    manager.acquire("z", timeout=1).release()
                    break
                except (NodesUnavailable, LockNotAcquired):
                    assert time.monotonic() < deadline, "never recovered after the resume"
                    time.sleep(0.2)
