"""Redis Sentinel nodes: the master a set of sentinels names, found again on every connect.

A ``{"SENTINELS": [...], "SERVICE": ...}`` node is one lock node whose address moves: each new
connection first asks the sentinels (in order, the last one that answered first) which server
is the master of the service, then connects to it. After a failover the engine's connections
to the old master break (Sentinel kills the clients of a demoted master; a killed master
closes them; a ``READONLY`` reply drops them), and the next connect finds the promoted
replica. That replica has another ``run_id``, so the engine treats it as a restarted node
(SPEC 4, ``engine/trust.py``): it votes only after the quarantine, and tokens never go back.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Sequence
from typing import Any

import redis
import redis.asyncio
from redis.backoff import NoBackoff
from redis.retry import Retry

from .engine import as_text


class MasterNotFound(redis.ConnectionError):
    """No sentinel answered with a master for the service."""


class Sentinels:
    """The sentinels of one service, asked for its master's ``(host, port)``."""

    def __init__(self, urls: Sequence[str], service: str, timeout: float) -> None:
        self.urls = list(urls)
        self.service = service
        self.timeout = timeout
        self._order = list(range(len(self.urls)))
        self._guard = threading.Lock()
        #: the address the last successful lookup gave (shown by the admin and the command)
        self.last_master: tuple[str, int] | None = None

    def master(self) -> tuple[str, int]:
        """Ask each sentinel in turn; the first that names a master wins and is asked first
        next time. Raises :class:`MasterNotFound` (a ``ConnectionError``) when none does."""
        with self._guard:
            order = list(self._order)
        errors: list[str] = []
        for index in order:
            try:
                address = self._ask(self.urls[index])
            except redis.RedisError as exc:
                errors.append(f"{type(exc).__name__}: {str(exc).splitlines()[0][:80]}")
                continue
            if address is None:
                errors.append("does not know the service")
                continue
            with self._guard:
                self._order.remove(index)
                self._order.insert(0, index)
            self.last_master = address
            return address
        raise MasterNotFound(
            f"no sentinel names a master for service {self.service!r} ({'; '.join(errors)})"
        )

    def _ask(self, url: str) -> tuple[str, int] | None:
        client = redis.Redis.from_url(
            url,
            socket_timeout=self.timeout,
            socket_connect_timeout=self.timeout,
            retry=Retry(NoBackoff(), 0),
        )
        try:
            reply = client.execute_command("SENTINEL", "GET-MASTER-ADDR-BY-NAME", self.service)
        finally:
            client.close()
            client.connection_pool.disconnect()
        if not reply:
            return None
        return as_text(reply[0]), int(reply[1])


class SentinelMasterConnection(redis.Connection):
    """A redis-py connection that connects to the master its :class:`Sentinels` name."""

    def __init__(self, *, sentinels: Sentinels, **kwargs: Any) -> None:
        self.sentinels = sentinels
        kwargs.setdefault("host", "")
        super().__init__(**kwargs)  # type: ignore[no-untyped-call]

    def connect(self) -> None:
        if self._sock is None:  # redis-py keeps the connected socket here (see transport)
            self.host, self.port = self.sentinels.master()
        super().connect()  # type: ignore[no-untyped-call]


class AsyncSentinelMasterConnection(redis.asyncio.Connection):
    """The asyncio twin of :class:`SentinelMasterConnection` (the lookup runs in a thread)."""

    def __init__(self, *, sentinels: Sentinels, **kwargs: Any) -> None:
        self.sentinels = sentinels
        kwargs.setdefault("host", "")
        super().__init__(**kwargs)

    async def connect(self) -> None:
        if self._writer is None:
            self.host, self.port = await asyncio.to_thread(self.sentinels.master)
        await super().connect()  # type: ignore[no-untyped-call]


def sentinel_pool(
    urls: Sequence[str],
    service: str,
    timeout: float,
    *,
    db: int = 0,
    username: str | None = None,
    password: str | None = None,
) -> redis.ConnectionPool:
    """A pool whose ``connection_class`` and ``connection_kwargs`` make connections to the
    service's current master (only those two are read from it, as for URL nodes)."""
    return redis.ConnectionPool(
        connection_class=SentinelMasterConnection,
        sentinels=Sentinels(urls, service, timeout),
        db=db,
        username=username,
        password=password,
    )
