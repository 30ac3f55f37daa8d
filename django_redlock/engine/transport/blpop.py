"""Wake one waiter when a lock is released, instead of polling or waking everybody.

A release that finds a live waiter registered for the name pushes one element onto
``<prefix>__wake__:<name>`` on one node picked by the name's hash (:func:`..keyspace.wake_node`);
every waiter of the name blocks in ``BLPOP`` on that list, so each release wakes exactly one of
them; the others sleep on. A release that happens between a failed attempt and the ``BLPOP`` is
not lost: its element is still in the list. When the node is down or slow, waiting falls back
to a plain sleep of the same length, so a lost wake-up costs latency (bounded by the backoff),
never correctness.
"""

from __future__ import annotations

import asyncio
import contextlib
import select
import ssl
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import hiredis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ResponseError

from ..keyspace import wake_node
from ..pools.budget import Budget
from . import redis_py
from .base import CONNECT_ERRORS, pack, texts

#: Waits shorter than this just sleep: a BLPOP round trip would cost more than it saves.
MIN_BLOCK = 0.003
#: Extra time a node gets to answer a BLPOP after its own timeout, seconds. A server ends a
#: blocked client's timeout on its event loop's next turn, at least every ``1000 / hz`` ms
#: (100 ms at the default ``hz 10``), so its nil comes up to that late on an idle node; a
#: reply later than this is given up on, and its connection closed, not reused.
SLACK = 0.25


def blpop_command(key: str, seconds: float) -> tuple[str, str, str]:
    """``BLPOP key seconds`` (ms precision, at least 1 ms: 0 would block forever)."""
    return ("BLPOP", key, f"{max(seconds, 0.001):.3f}")


class _BlockingConnection:
    """One connection for ``BLPOP``: redis-py connects it (TLS, AUTH, SELECT), then the call
    is written to the socket and its reply read with a ``hiredis`` reader after one ``poll``,
    like the lock calls (:mod:`.sync`): less work between a release and the woken waiter's
    acquire than redis-py's generic read path."""

    def __init__(self, conn: Any) -> None:
        self._conn = conn
        self._sock = sock = redis_py.open_socket(conn)
        self._reader = hiredis.Reader()
        self._poller = select.poll()
        self._poller.register(sock.fileno(), select.POLLIN | select.POLLERR | select.POLLHUP)
        #: when it last went back to the idle pool (``time.monotonic()``)
        self.idle_since = 0.0

    def blpop(
        self, key: str, seconds: float, deadline: float, before: tuple[str | int, ...] | None
    ) -> bool:
        """True if an element was popped; False when BLPOP timed out on the server. Raises
        ``TimeoutError`` when no reply came by ``deadline`` (``time.monotonic()``).
        ``before``: a command sent ahead of the BLPOP in the same write (registering the
        waiter)."""
        commands = [before] if before else []
        commands.append(blpop_command(key, seconds))
        self._sock.sendall(b"".join(pack(c) for c in commands))
        for _ in commands[:-1]:
            self._read(deadline)
        return self._read(deadline) is not None

    def _read(self, deadline: float) -> Any:
        while True:
            reply = self._reader.gets()
            if reply is not False:
                if isinstance(reply, hiredis.ReplyError):
                    raise ResponseError(str(reply))
                return reply
            if not (isinstance(self._sock, ssl.SSLSocket) and self._sock.pending()):
                remaining = deadline - time.monotonic()
                if remaining <= 0 or not self._poller.poll(remaining * 1000):
                    raise TimeoutError("no BLPOP reply in time")
            try:
                data = self._sock.recv(65536)
            except (BlockingIOError, ssl.SSLWantReadError):
                continue
            if not data:
                raise ConnectionError("connection closed by the server")
            self._reader.feed(data)

    def close(self) -> None:
        self._conn.disconnect()


#: What a wait's connection raises when the node or the network is at fault; anything else (a
#: signal handler's exception) is the caller's.
NODE_ERRORS: tuple[type[Exception], ...] = (*CONNECT_ERRORS, hiredis.ProtocolError)


class ReleaseWaiter:
    """Blocks waiters on the wake-up list of a name (sync and asyncio). Each ``BLPOP``
    connection takes a blocking slot of ``budget`` on its node; a waiter refused one polls:
    its wait is a plain sleep (a backoff step, from ``RETRY_DELAY``), then it attempts again."""

    def __init__(
        self,
        factories: Sequence[Callable[[], Any]],
        async_factories: Sequence[Callable[[], Any]],
        budget: Budget,
        opened: Callable[[], None] = lambda: None,
    ) -> None:
        self._factories = list(factories)
        self._async_factories = list(async_factories)
        self._budget = budget
        self._opened = opened
        self._idle: list[list[Any]] = [[] for _ in self._factories]
        self._mutex = threading.Lock()
        #: how many sync ``BLPOP`` connections are open (idle or blocking)
        self.open = 0

    # -- sync ------------------------------------------------------------------------------
    def wait(
        self, key: str, name: str, seconds: float, before: tuple[str | int, ...] | None = None
    ) -> bool:
        """Return True when a release woke us, False after ``seconds``; ``before``: a command
        to send ahead of the BLPOP (see :meth:`_BlockingConnection.blpop`)."""
        if seconds < MIN_BLOCK:
            time.sleep(max(seconds, 0.0))
            return False
        started = time.monotonic()
        node = wake_node(name, len(self._factories))
        with self._mutex:
            idle = self._idle[node]
            conn = None
            if idle:  # subscripts, no call: an interrupt cannot strand it between them
                conn = idle[-1]
                del idle[-1]
            if conn is None and self._budget.take((node,), blocking=True):
                self.open += 1
                opened = True
            else:
                opened = conn is not None
        if not opened:  # no blocking connection to be had: wait without a wake-up
            self._budget.make_room((node,))  # a later wait blocks
            time.sleep(seconds)
            return False
        held = True  # this call holds the slot (and ``conn``, if any): an interrupt gives both
        try:
            if conn is None:
                self._opened()
            for _ in range(2):
                pooled = conn is not None
                try:
                    if conn is None:
                        conn = _BlockingConnection(self._factories[node]())
                    left = seconds - (time.monotonic() - started)
                    popped = conn.blpop(key, left, started + seconds + SLACK, before)
                    conn.idle_since = time.monotonic()
                    with self._mutex:
                        self._idle[node].append(conn)
                    held = False
                    return popped
                except TimeoutError:  # no answer in time: a late reply must never be misread
                    if conn is not None:
                        conn.close()
                        conn = None
                    break
                except NODE_ERRORS:  # the node's or the network's
                    if conn is not None:
                        conn.close()
                        conn = None
                    if not pooled:
                        break
                    # the pooled connection had gone stale (idle timeout, CLIENT KILL,
                    # restart): one more try on a fresh one, not a whole wait asleep
            self._closed(node)
            held = False  # a store after the return: no interrupt between
        finally:
            if held:  # the caller's exception (a signal handler's): it goes on
                if conn is not None:
                    conn.close()
                self._closed(node)
        time.sleep(max(0.0, seconds - (time.monotonic() - started)))
        return False

    def _closed(self, node: int) -> None:
        with self._mutex:
            self.open -= 1
        self._budget.give((node,), blocking=True)

    def reap(self, idle_before: float, *, one: bool = False) -> float | None:
        """Close the idle connections idle since before ``idle_before`` (with ``one``: only
        the first of them; ``math.inf``: however recent); returns the oldest ``idle_since``
        left."""
        closed: list[tuple[int, Any]] = []
        oldest: float | None = None
        with self._mutex:
            for node, conns in enumerate(self._idle):
                for conn in list(conns):
                    if conn.idle_since < idle_before and not (one and closed):
                        conns.remove(conn)
                        closed.append((node, conn))
                    elif oldest is None or conn.idle_since < oldest:
                        oldest = conn.idle_since
        for node, conn in closed:
            conn.close()
            self._closed(node)
        return oldest

    def close(self) -> None:
        with self._mutex:
            idle, self._idle = self._idle, [[] for _ in self._factories]
        for node, conns in enumerate(idle):
            for conn in conns:
                conn.close()
                self._closed(node)

    # -- async -----------------------------------------------------------------------------
    async def await_release(
        self,
        key: str,
        name: str,
        seconds: float,
        idle: list[list[Any]],
        before: tuple[str | int, ...] | None = None,
    ) -> bool:
        """Asyncio twin of :meth:`wait`; ``idle`` holds this event loop's connections."""
        if seconds < MIN_BLOCK:
            await asyncio.sleep(max(seconds, 0.0))
            return False
        started = time.monotonic()
        node = wake_node(name, len(self._async_factories))
        pooled = bool(idle[node])
        conn: Any = idle[node].pop() if pooled else None
        if conn is None and not self._budget.take((node,), blocking=True):
            self._budget.make_room((node,))  # a later wait blocks
            await asyncio.sleep(seconds)  # no blocking connection to be had: no wake-up
            return False
        for _ in range(2):
            try:
                if conn is None:
                    conn = self._async_factories[node]()
                left = seconds - (time.monotonic() - started)
                commands = [before] if before else []
                commands.append(blpop_command(key, left))
                packed = conn.pack_commands([texts(c) for c in commands])
                await redis_py.asend(conn, packed)
                for _ in commands[:-1]:
                    await conn.read_response(timeout=left + SLACK)
                until = time.monotonic() + left + SLACK
                popped = await conn.read_response(timeout=left + SLACK)
                if popped is None and time.monotonic() >= until:
                    # redis-py answers a read that timed out with None, as it answers the
                    # server's nil: the BLPOP's reply is still due on this connection, so it
                    # must not be reused (the next wait would read this one's reply)
                    raise TimeoutError("BLPOP's reply came later than its timeout")
                conn.idle_since = time.monotonic()
                idle[node].append(conn)
                return popped is not None
            except asyncio.CancelledError:  # mid-BLPOP: a late reply must never be misread
                # closed without an await (a second cancel cannot come between the close and
                # the give-back); the slot comes back once the transport closed its socket
                if conn is not None:
                    with contextlib.suppress(Exception):
                        redis_py.abandon(conn)
                self._budget.give_after_close((node,), blocking=True)
                raise
            except Exception as exc:  # RedisError, OSError, TimeoutError, a raising factory
                if conn is not None:
                    with contextlib.suppress(Exception):
                        await conn.disconnect(nowait=True)
                stale = isinstance(exc, RedisConnectionError | ConnectionError)
                if not (pooled and stale):
                    break
                # the pooled connection had gone stale: one more try on a fresh one
                pooled, conn = False, None
        self._budget.give_after_close((node,), blocking=True)
        await asyncio.sleep(max(0.0, seconds - (time.monotonic() - started)))
        return False

    def new_idle(self) -> list[list[Any]]:
        return [[] for _ in self._async_factories]
