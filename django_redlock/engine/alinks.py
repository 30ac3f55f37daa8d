"""The asyncio twin of :mod:`.links`: pipelined calls, one deadline, replies read in order.

redis-py opens the connection (TLS, AUTH/ACL, SELECT, unix sockets) and runs the handshake;
then the transport is handed to a small :class:`asyncio.Protocol` that feeds a ``hiredis``
reader and fills the waiting calls in order as bytes arrive. No task per read, nothing to
cancel half-read: a reply that comes after its deadline is consumed in order like any other.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

import hiredis
from redis.asyncio.connection import AbstractConnection
from redis.exceptions import RedisError

from .links import MAX_UNREAD, RECONNECT_MAX, RECONNECT_MIN, _parse_info, describe
from .plans import Request
from .replies import Call, NodeFailure, Slot, is_noscript
from .scripts import ALL_SCRIPTS, RELEASE

AsyncConnectionFactory = Callable[[], AbstractConnection]


class _Replies(asyncio.Protocol):
    """Receives the bytes of one link's transport once the handshake is done."""

    def __init__(self, link: AsyncLink) -> None:
        self._link = link

    def data_received(self, data: bytes) -> None:
        self._link._received(data)

    def eof_received(self) -> bool:
        return False  # close the transport; connection_lost follows

    def connection_lost(self, exc: Exception | None) -> None:
        self._link._lost(exc)


class AsyncLink:
    """One asyncio connection to one node."""

    def __init__(self, label: str, factory: AsyncConnectionFactory, timeout: float) -> None:
        self.label = label
        self._factory = factory
        self._timeout = timeout
        self._conn: AbstractConnection | None = None
        self._transport: asyncio.WriteTransport | None = None
        self._reader: Any = None
        self._unread: deque[tuple[Slot, _Gather]] = deque()
        self._connecting: asyncio.Task[bool] | None = None
        self._run_id: str | None = None
        self._node_started: float | None = None
        self._backoff = RECONNECT_MIN
        self._retry_at = 0.0
        self._fresh_failure = False
        self.last_error = ""

    @property
    def run_id(self) -> str | None:
        return self._run_id if self._transport is not None else None

    def uptime(self) -> float | None:
        if self._node_started is None:
            return None
        return time.monotonic() - self._node_started

    async def connect(self) -> bool:
        conn = self._factory()
        try:
            await asyncio.wait_for(self._handshake(conn), max(self._timeout * 4, 0.2))
            writer = conn._writer  # redis-py keeps the StreamWriter here
            if writer is None:
                raise ConnectionError("connection has no transport after connecting")
            transport = writer.transport
        except (TimeoutError, RedisError, OSError) as exc:
            await conn.disconnect(nowait=True)
            self._down(describe(exc))
            return False
        if self._transport is not None:  # another connect won the race; keep that one
            await conn.disconnect(nowait=True)
            return True
        self._reader = hiredis.Reader()
        self._unread.clear()
        transport.set_protocol(_Replies(self))
        self._conn = conn
        self._transport = transport
        self._backoff = RECONNECT_MIN
        self.last_error = ""
        return True

    async def _handshake(self, conn: AbstractConnection) -> None:
        await conn.connect()
        commands = [("INFO", "server")] + [("SCRIPT", "LOAD", s.source) for s in ALL_SCRIPTS]
        await conn.send_packed_command(conn.pack_commands(commands), check_health=False)
        info = await conn.read_response()
        for _ in ALL_SCRIPTS:
            await conn.read_response()
        fields = _parse_info(info)
        self._run_id = fields.get("run_id", "")
        self._node_started = time.monotonic() - float(fields.get("uptime_in_seconds", "0"))

    def needs_revive(self) -> bool:
        return self._transport is None and self._fresh_failure and self._connecting is None

    async def revive(self) -> None:
        """Reconnect inline a connection that was healthy until it just broke."""
        if self.needs_revive():
            self._fresh_failure = False
            await self.connect()

    def usable(self) -> bool:
        if self._transport is not None:
            return True
        if time.monotonic() >= self._retry_at and self._connecting is None:
            self._connecting = asyncio.get_running_loop().create_task(self._connect_later())
        return False

    async def _connect_later(self) -> bool:
        try:
            return await self.connect()
        finally:
            self._connecting = None

    def _down(self, reason: str) -> None:
        self.last_error = reason
        self._retry_at = time.monotonic() + self._backoff
        self._backoff = min(RECONNECT_MAX, self._backoff * 2)

    def _drop(self) -> None:
        transport, self._transport = self._transport, None
        conn, self._conn = self._conn, None
        if transport is not None:
            transport.close()
        if conn is not None:  # lets redis-py forget the stream it no longer owns
            conn._reader = conn._writer = None

    def fail(self, reason: str) -> None:
        self._fresh_failure = self._transport is not None and self._backoff == RECONNECT_MIN
        self._drop()
        while self._unread:
            slot, gather = self._unread.popleft()
            slot.fill(NodeFailure(reason))
            gather.check()
        self._down(reason)

    def _received(self, data: bytes) -> None:
        self._reader.feed(data)
        while self._unread:
            try:
                reply = self._reader.gets()
            except hiredis.ProtocolError as exc:
                self.fail(describe(exc))
                return
            if reply is False:
                return
            if isinstance(reply, hiredis.ReplyError):
                reply = NodeFailure(f"ResponseError: {reply}")
            slot, gather = self._unread.popleft()
            slot.fill(reply)
            gather.check()

    def _lost(self, exc: Exception | None) -> None:
        if self._transport is not None:
            self.fail(describe(exc) if exc else "ConnectionError: connection closed by the server")

    def send(self, call: Call, gather: _Gather, *, by_sha: bool = True) -> Slot:
        slot = Slot(call)
        transport = self._transport
        if transport is None:
            slot.fill(NodeFailure(f"down: {self.last_error or 'not connected'}", sent=False))
            return slot
        # A node this far behind (paused, or partitioned) gets no new calls until it catches
        # up, but the connection is kept: closing it would make the node drop, unprocessed, the
        # releases queued behind its late acquires. Releases are always sent, so it runs each
        # one right after the acquire it undoes.
        if len(self._unread) >= MAX_UNREAD and call.script is not RELEASE:
            slot.fill(NodeFailure(f"not answering ({len(self._unread)} calls queued)", sent=False))
            return slot
        self._unread.append((slot, gather))
        transport.write(hiredis.pack_command(call.packed_args(by_sha=by_sha)))  # type: ignore[arg-type]
        return slot

    async def close(self) -> None:
        self._drop()
        self._unread.clear()


class _Gather:
    """The slots of one request: wakes the waiting task once, when they are settled (or all
    done), instead of on every reply; no task or event per wait."""

    __slots__ = ("_future", "_settled", "_slots")

    def __init__(self, slots: list[Slot], settled: Callable[[list[Slot]], bool] | None) -> None:
        self._slots = slots
        self._settled = settled
        self._future: asyncio.Future[None] | None = None

    def _ready(self) -> bool:
        slots = self._slots
        return all(s.done for s in slots) or (self._settled is not None and self._settled(slots))

    def check(self) -> None:
        """Called by a link after it filled one of these slots."""
        future = self._future
        if future is not None and not future.done() and self._ready():
            future.set_result(None)

    async def wait(self, deadline: float) -> None:
        """Until the slots are settled or ``deadline`` (``time.monotonic()``) passes."""
        if self._ready():
            return
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return
        loop = asyncio.get_running_loop()
        future = self._future = loop.create_future()
        timer = loop.call_later(remaining, _finish, future)
        try:
            await future
        finally:
            timer.cancel()
            self._future = None


def _finish(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


class AsyncChannel:
    """One asyncio connection per node, used by one task at a time."""

    def __init__(
        self, labels: Sequence[str], factories: Sequence[AsyncConnectionFactory], timeout: float
    ) -> None:
        self.links = [AsyncLink(lb, f, timeout) for lb, f in zip(labels, factories, strict=True)]
        self.mutex = asyncio.Lock()

    async def connect(self) -> None:
        await asyncio.gather(*(link.connect() for link in self.links))

    async def prepare(self) -> None:
        """Before a plan reads the links: reconnect those the server just closed (the event
        loop already noticed, through ``connection_lost``)."""
        for link in self.links:
            if link.needs_revive():
                await link.revive()

    async def execute(self, request: Request) -> list[Any]:
        slots: list[Slot] = []
        gather = _Gather(slots, request.settled)
        for link, call in zip(self.links, request.calls, strict=True):
            if call is None:
                link.usable()  # a node that is down gets its reconnection started
                slot = Slot(None)
                slot.fill(NodeFailure(f"down: {link.last_error or 'not connected'}", sent=False))
            elif not link.usable():
                slot = Slot(call)
                slot.fill(NodeFailure(f"down: {link.last_error or 'reconnecting'}", sent=False))
            else:
                slot = link.send(call, gather)
            slots.append(slot)
        if not request.wait:
            return [None] * len(slots)
        deadline = time.monotonic() + request.timeout
        await gather.wait(deadline)
        retry = [i for i, s in enumerate(slots) if s.done and is_noscript(s.value)]
        if retry:  # SCRIPT FLUSH on a node: EVAL sends the source and caches it again
            for i in retry:
                call = slots[i].call
                assert call is not None
                slots[i] = self.links[i].send(call, gather, by_sha=False)
            await gather.wait(deadline)
        return [s.result() for s in slots]

    async def close(self) -> None:
        for link in self.links:
            await link.close()
