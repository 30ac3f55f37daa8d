"""Connections to a node whose server is found at connect time (sentinel and cluster nodes).

A located node's ``locate()`` returns the ``(host, port)`` to use now; each new connection asks
it first. The engine drops a connection whose server stopped being the right one (it closed,
answered ``READONLY`` or ``MOVED``), and the next connect locates the server again.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Sequence
from typing import Any

import redis
import redis.asyncio
from redis.backoff import NoBackoff
from redis.retry import Retry

Address = tuple[str, int]


class Declined(Exception):
    """A server answered but its answer must not be followed (e.g. a sentinel that sees its
    master down); the message says why, and the next server is asked."""


class Locator:
    """Asks a list of servers (sentinels, cluster seeds), in order, the last one that answered
    first; subclasses say what to ask. ``last`` is the address found last (for display)."""

    #: what a failure says, e.g. "no sentinel names a master for service 'x'"
    what = "no server answered"

    def __init__(self, urls: Sequence[str], timeout: float) -> None:
        self.urls = list(urls)
        self.timeout = timeout
        self._order = list(range(len(self.urls)))
        self._guard = threading.Lock()
        self.last: Address | None = None

    def ask(self, client: redis.Redis) -> Address | None:
        """The address ``client``'s server gives (None: it does not know; raises
        :class:`Declined` when its answer is not to be followed)."""
        raise NotImplementedError

    def __call__(self) -> Address:
        """Ask each server in turn; the first whose answer is followed wins and is asked first
        next time. Raises ``redis.ConnectionError`` when none answers so."""
        with self._guard:
            order = list(self._order)
        errors: list[str] = []
        for index in order:
            client = redis.Redis.from_url(
                self.urls[index],
                socket_timeout=self.timeout,
                socket_connect_timeout=self.timeout,
                retry=Retry(NoBackoff(), 0),
            )
            try:
                address = self.ask(client)
            except redis.RedisError as exc:
                errors.append(f"{type(exc).__name__}: {str(exc).splitlines()[0][:80]}")
                continue
            except Declined as exc:
                errors.append(str(exc))
                continue
            finally:
                client.close()
                client.connection_pool.disconnect()
            if address is None:
                errors.append("does not know it")
                continue
            with self._guard:
                self._order.remove(index)
                self._order.insert(0, index)
            self.last = address
            return address
        raise redis.ConnectionError(f"{self.what} ({'; '.join(errors)})")


class _Locating:
    """Mixin for a redis-py connection class: connects to what its ``locator`` names."""

    def __init__(self, *, locator: Callable[[], Address], **kwargs: Any) -> None:
        self.locator = locator
        kwargs.setdefault("host", "")
        super().__init__(**kwargs)

    def connect(self) -> None:
        if self._sock is None:  # type: ignore[attr-defined]  # redis-py's connected socket
            self.host, self.port = self.locator()
        super().connect()  # type: ignore[misc]


class _AsyncLocating:
    """Asyncio twin of :class:`_Locating` (the lookup runs in a thread)."""

    def __init__(self, *, locator: Callable[[], Address], **kwargs: Any) -> None:
        self.locator = locator
        kwargs.setdefault("host", "")
        super().__init__(**kwargs)

    async def connect(self) -> None:
        if self._writer is None:  # type: ignore[attr-defined]
            self.host, self.port = await asyncio.to_thread(self.locator)
        await super().connect()  # type: ignore[misc]


class LocatedConnection(_Locating, redis.Connection):
    """A redis-py connection that connects to what its ``locator`` names."""


class LocatedSSLConnection(_Locating, redis.SSLConnection):
    """The TLS twin of :class:`LocatedConnection`."""


class AsyncLocatedConnection(_AsyncLocating, redis.asyncio.Connection):
    """The asyncio twin of :class:`LocatedConnection`."""


class AsyncLocatedSSLConnection(_AsyncLocating, redis.asyncio.SSLConnection):
    """The asyncio twin of :class:`LocatedSSLConnection`."""


#: ``connections`` maps a sync connection class to its asyncio twin by name.
ASYNC_TWINS: dict[str, type[Any]] = {
    "LocatedConnection": AsyncLocatedConnection,
    "LocatedSSLConnection": AsyncLocatedSSLConnection,
}


def located_pool(locator: Locator, *, ssl: bool = False, **kwargs: Any) -> redis.ConnectionPool:
    """A pool whose ``connection_class`` and ``connection_kwargs`` make connections to what
    ``locator`` names (only those two are read from it, as for URL nodes)."""
    cls = LocatedSSLConnection if ssl else LocatedConnection
    return redis.ConnectionPool(connection_class=cls, locator=locator, **kwargs)
