"""The one place that knows redis-py's internals.

redis-py opens each connection (TLS, AUTH/ACL, SELECT, unix sockets) and runs our handshake;
then the engine takes over the socket (sync) or the transport (asyncio) it leaves connected,
because redis-py's per-call bookkeeping (health checks, ``can_read`` peeks) costs more than a
lock call. The private attributes read here (``_sock``, ``_writer``, ``_reader``) are stable
across redis-py 5 to 8; if a release renames them, this module is all that changes.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Sequence
from typing import Any

from redis.asyncio.connection import AbstractConnection as AsyncConnection
from redis.connection import AbstractConnection as SyncConnection

from . import cancels

Command = Sequence[str | int]


def open_socket(conn: SyncConnection) -> socket.socket:
    """Connect ``conn`` and return its socket, in non-blocking mode, for the engine to use."""
    conn.connect()
    return connected_socket(conn)


def handshake(conn: SyncConnection, commands: Sequence[Command]) -> list[Any]:
    """Connect ``conn``, send ``commands`` in one write and return their replies."""
    conn.connect()
    conn.send_packed_command(conn.pack_commands(commands), check_health=False)
    return [conn.read_response() for _ in commands]


async def ahandshake(conn: AsyncConnection, commands: Sequence[Command]) -> list[Any]:
    """Asyncio twin of :func:`handshake`."""
    await conn.connect()
    await conn.send_packed_command(conn.pack_commands(commands), check_health=False)
    return [await conn.read_response() for _ in commands]


async def asend(conn: AsyncConnection, packed: Any) -> None:
    """``conn.send_packed_command(packed)``, with a cancellation it dropped raised again.

    redis-py sends under ``asyncio.wait_for`` when the connection has a socket timeout. Before
    Python 3.12, ``wait_for`` returns the send's result when the caller's task is cancelled in
    the same turn of the event loop as the send completes: the cancel is lost (the task still
    counts it, in ``Task.cancelling()``), and a cancelled waiter went on waiting."""
    before = cancels.counted()
    await conn.send_packed_command(packed, check_health=False)
    cancels.raise_dropped(before)


def connected_socket(conn: SyncConnection) -> socket.socket:
    """The socket of a connected ``conn``, set non-blocking, for the engine to use directly."""
    sock: socket.socket | None = conn._sock  # redis-py keeps the connected socket here
    if sock is None:
        raise ConnectionError("connection has no socket after connecting")
    sock.setblocking(False)
    return sock


def take_transport(conn: AsyncConnection) -> asyncio.WriteTransport:
    """The transport of a connected asyncio ``conn``, for the engine to use directly."""
    writer = conn._writer  # redis-py keeps the StreamWriter here
    if writer is None:
        raise ConnectionError("connection has no transport after connecting")
    return writer.transport


def forget_stream(conn: AsyncConnection) -> None:
    """Let redis-py forget the stream the engine took over (and has closed)."""
    conn._reader = conn._writer = None


def abandon(conn: AsyncConnection) -> None:
    """Close a connection given up mid-handshake (cancelled), or one of an event loop that
    is closed, without awaiting: its transport is closed at once and redis-py forgets it."""
    writer = conn._writer
    if writer is not None:
        close_transport(writer.transport)
    forget_stream(conn)


def close_transport(transport: asyncio.WriteTransport) -> None:
    """``transport.abort()``: the socket closes on the loop's next turn even with bytes
    still buffered (``close()`` would keep it open until they are written, past the turn
    after which its budget slot comes back; the calls behind those bytes are failed by the
    caller). When its event loop is closed, which makes it raise and leave the socket to a
    loop turn that never comes, the socket is closed here."""
    try:
        transport.abort()
    except RuntimeError:
        sock = getattr(transport, "_sock", None)  # where asyncio's socket transports keep it
        if isinstance(sock, socket.socket):
            sock.close()
