"""``RedisNodes``: independent ``redis-server`` nodes started together.

``RedisNode`` (one node), ``RedisNodeError`` and the launcher's constants live in
:mod:`.node`, :mod:`.server` and :mod:`.wire`; they are re-exported here.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator, Sequence
from typing import overload

from django_redlock.testing.node import (
    START_TIMEOUT,
    STOP_GRACE,
    RedisNode,
    RedisNodeError,
    StopOnExit,
)
from django_redlock.testing.server import PERSISTENCE_MODES, find_redis_server
from django_redlock.testing.wire import HOST

__all__ = [
    "HOST",
    "PERSISTENCE_MODES",
    "START_TIMEOUT",
    "STOP_GRACE",
    "RedisNode",
    "RedisNodeError",
    "RedisNodes",
]


class RedisNodes(StopOnExit, Sequence[RedisNode]):
    """Independent nodes started together; a sequence of ``RedisNode`` and a context manager."""

    def __init__(self, nodes: Iterable[RedisNode]) -> None:
        self._nodes = list(nodes)

    @classmethod
    def start(
        cls,
        count: int = 3,
        *,
        unix: bool = False,
        persistence: str | None = None,
        extra_args: Iterable[str] = (),
        base_dir: str | os.PathLike[str] | None = None,
        ports: Sequence[int] | None = None,
        server: str | None = None,
        timeout: float = START_TIMEOUT,
    ) -> RedisNodes:
        """Spawn ``count`` nodes, then wait for all of them (a failure stops those started)."""
        if count < 1:
            raise ValueError("count must be at least 1")
        if ports is not None and len(ports) != count:
            raise ValueError(f"{len(ports)} ports given for {count} nodes")
        server = server or find_redis_server()
        extra = tuple(extra_args)
        nodes = cls(
            RedisNode(
                port=None if ports is None else ports[i],
                unix=unix,
                persistence=persistence,
                extra_args=extra,
                base_dir=base_dir,
                server=server,
            )
            for i in range(count)
        )
        try:
            for node in nodes:
                node.spawn()
            for node in nodes:
                node.wait_started(timeout)
        except BaseException:
            nodes.stop()
            raise
        return nodes

    @property
    def urls(self) -> list[str]:
        """The nodes' URLs, in order."""
        return [node.url for node in self._nodes]

    @property
    def pids(self) -> list[int | None]:
        """The nodes' PIDs (None for a node that is not running)."""
        return [node.pid for node in self._nodes]

    def stop(self) -> None:
        """Stop every node (terminate all first, then reap, so it takes one grace at most)."""
        for node in self._nodes:
            node.signal_stop()
        for node in self._nodes:
            node.stop()

    @overload
    def __getitem__(self, index: int) -> RedisNode: ...
    @overload
    def __getitem__(self, index: slice) -> RedisNodes: ...
    def __getitem__(self, index: int | slice) -> RedisNode | RedisNodes:
        if isinstance(index, slice):
            return RedisNodes(self._nodes[index])
        return self._nodes[index]

    def __len__(self) -> int:
        return len(self._nodes)

    def __iter__(self) -> Iterator[RedisNode]:
        return iter(self._nodes)

    def __repr__(self) -> str:
        return f"RedisNodes({self._nodes!r})"

    def __enter__(self) -> RedisNodes:
        return self
