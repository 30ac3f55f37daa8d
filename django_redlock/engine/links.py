"""Synchronous node connections with pipelined calls and one deadline for all nodes.

One :class:`Channel` holds one connection per node. A call is written to every node's socket
first, then the replies are read as they arrive (``poll``) against a single deadline, so N nodes
cost one round trip and a paused node costs nothing once a quorum has answered. Replies that
arrive after the deadline are read and dropped later, in order, on the same connection; this is
also why a release sent after a timed-out acquire can never overtake it.

redis-py opens the connection (TLS, AUTH/ACL, SELECT, unix sockets); after that handshake the
lock calls use the socket directly with a ``hiredis`` reader, in non-blocking mode, because
redis-py's per-call bookkeeping (health checks, ``can_read`` peeks) cost more than the call.
"""

from __future__ import annotations

import os
import select
import socket
import ssl
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

import hiredis
from redis.connection import AbstractConnection
from redis.exceptions import RedisError

from .plans import Request
from .replies import Call, NodeFailure, Slot, is_noscript
from .scripts import ALL_SCRIPTS, RELEASE

ConnectionFactory = Callable[[], AbstractConnection]

#: A node with this many unanswered calls gets no new acquisitions until it catches up. Kept
#: small so the calls in flight (a few hundred bytes each) always fit in the kernel's socket
#: buffers: a paused node must receive every release whole, never a truncated one.
MAX_UNREAD = 64
#: First and longest pause between reconnection attempts to a node that is down, seconds.
RECONNECT_MIN = 0.05
RECONNECT_MAX = 2.0
_POLL_EVENTS = select.POLLIN | select.POLLERR | select.POLLHUP
_BUFFER_SIZE = 65536


def describe(exc: BaseException) -> str:
    """A short reason for ``exc``; never includes a URL (and so never a password)."""
    text = str(exc).split("\n", 1)[0]
    return f"{type(exc).__name__}: {text}"[:200]


class Link:
    """One connection to one node, with the queue of calls whose replies are still unread."""

    def __init__(self, label: str, factory: ConnectionFactory) -> None:
        self.label = label
        self._factory = factory
        self._conn: AbstractConnection | None = None
        self._sock: socket.socket | None = None
        self._reader: Any = None
        self._buffer = bytearray(_BUFFER_SIZE)
        self._unread: deque[Slot] = deque()
        self._run_id: str | None = None
        self._node_started: float | None = None
        self._backoff = RECONNECT_MIN
        self._retry_at = 0.0
        self._reconnecting = False
        self._fresh_failure = False
        self._guard = threading.Lock()
        self.last_error = ""

    # -- state seen by plans -------------------------------------------------------------
    @property
    def run_id(self) -> str | None:
        return self._run_id if self._sock is not None else None

    def uptime(self) -> float | None:
        if self._node_started is None:
            return None
        return time.monotonic() - self._node_started

    # -- connecting ----------------------------------------------------------------------
    def connect(self) -> bool:
        """Connect, load the scripts and learn the node's ``run_id``; False on failure."""
        conn = self._factory()
        try:
            conn.connect()
            conn.send_packed_command(
                conn.pack_commands(
                    [("INFO", "server")] + [("SCRIPT", "LOAD", s.source) for s in ALL_SCRIPTS]
                ),
                check_health=False,
            )
            info = conn.read_response()
            for _ in ALL_SCRIPTS:
                conn.read_response()
            sock = conn._sock  # redis-py keeps the connected socket here
            if sock is None:
                raise ConnectionError("connection has no socket after connecting")
            sock.setblocking(False)
        except (RedisError, OSError) as exc:
            conn.disconnect()
            self._down(describe(exc))
            return False
        fields = _parse_info(info)
        self._run_id = fields.get("run_id", "")
        self._node_started = time.monotonic() - float(fields.get("uptime_in_seconds", "0"))
        self._unread.clear()
        self._reader = hiredis.Reader()
        self._conn = conn
        self._sock = sock
        self._backoff = RECONNECT_MIN
        self.last_error = ""
        return True

    def revive(self) -> None:
        """Reconnect inline a connection that was healthy until it just broke (on loopback or
        a LAN that costs less than a failed call); later attempts run in the background."""
        if self._sock is None and self._fresh_failure and not self._reconnecting:
            self._fresh_failure = False
            self.connect_detached()

    def usable(self) -> bool:
        """True when connected; else start a background reconnect when its time has come."""
        if self._sock is not None:
            return True
        if time.monotonic() >= self._retry_at and not self._reconnecting:
            self._reconnecting = True
            threading.Thread(
                target=self._reconnect, name=f"redlock-connect {self.label}", daemon=True
            ).start()
        return False

    def _reconnect(self) -> None:
        try:
            self.connect_detached()
        finally:
            self._reconnecting = False

    def connect_detached(self) -> bool:
        """Connect without disturbing a caller that is using the channel right now."""
        with self._guard:
            return self.connect()

    def _down(self, reason: str) -> None:
        self.last_error = reason
        self._retry_at = time.monotonic() + self._backoff
        self._backoff = min(RECONNECT_MAX, self._backoff * 2)

    def _drop(self) -> None:
        conn, self._conn, self._sock = self._conn, None, None
        if conn is not None:
            conn.disconnect()

    def fail(self, reason: str) -> None:
        """Drop the connection; every unread call fails with ``reason``."""
        self._fresh_failure = self._sock is not None and self._backoff == RECONNECT_MIN
        self._drop()
        while self._unread:
            self._unread.popleft().fill(NodeFailure(reason))
        self._down(reason)

    def close(self) -> None:
        self._drop()
        self._unread.clear()

    # -- calls ---------------------------------------------------------------------------
    def send(self, call: Call, *, by_sha: bool = True) -> Slot:
        slot = Slot(call)
        sock = self._sock
        if sock is None or self._conn is None:
            slot.fill(NodeFailure(f"down: {self.last_error or 'not connected'}", sent=False))
            return slot
        # A node this far behind (paused, or partitioned) gets no new calls until it catches
        # up, but the connection is kept: closing it would make the node drop, unprocessed, the
        # releases queued behind its late acquires. Releases are always sent, so it runs each
        # one right after the acquire it undoes.
        if len(self._unread) >= MAX_UNREAD and call.script is not RELEASE:
            slot.fill(NodeFailure(f"not answering ({len(self._unread)} calls queued)", sent=False))
            return slot
        try:
            sock.sendall(hiredis.pack_command(call.packed_args(by_sha=by_sha)))  # type: ignore[arg-type]
        except OSError as exc:  # includes a full send buffer on this non-blocking socket
            self.fail(describe(exc))
            slot.fill(NodeFailure(f"down: {describe(exc)}"))
            return slot
        self._unread.append(slot)
        return slot

    def is_idle(self) -> bool:
        """Connected with no reply outstanding: if its socket is readable, the server closed
        it (CLIENT KILL, idle timeout, restart)."""
        return self._sock is not None and not self._unread and not self.has_buffered()

    def fileno(self) -> int | None:
        return None if self._sock is None else self._sock.fileno()

    def has_buffered(self) -> bool:
        """True if bytes are already decrypted or parsed on our side (poll would miss them)."""
        sock = self._sock
        if sock is None:
            return False
        return bool(self._reader.has_data()) or (
            isinstance(sock, ssl.SSLSocket) and sock.pending() > 0
        )

    def drain(self, *, receive: bool) -> bool:
        """Fill slots from buffered replies; with ``receive`` read the socket once first.

        Returns True if any slot was filled (or the link failed)."""
        sock = self._sock
        if sock is None:
            return False
        if receive:
            try:
                count = sock.recv_into(self._buffer)
            except (BlockingIOError, ssl.SSLWantReadError):
                count = -1
            except OSError as exc:
                self.fail(describe(exc))
                return True
            if count == 0:
                self.fail("ConnectionError: connection closed by the server")
                return True
            if count > 0:
                self._reader.feed(self._buffer, 0, count)
        progressed = False
        while self._unread:
            try:
                reply = self._reader.gets()
            except hiredis.ProtocolError as exc:
                self.fail(describe(exc))
                return True
            if reply is False:
                break
            if isinstance(reply, hiredis.ReplyError):
                reply = NodeFailure(f"ResponseError: {reply}")
            self._unread.popleft().fill(reply)
            progressed = True
        return progressed


def _parse_info(raw: Any) -> dict[str, str]:
    if isinstance(raw, dict):
        return {str(k): str(v) for k, v in raw.items()}
    text = raw.decode() if isinstance(raw, bytes) else str(raw)
    fields: dict[str, str] = {}
    for line in text.splitlines():
        if ":" in line and not line.startswith("#"):
            k, _, v = line.partition(":")
            fields[k] = v.strip()
    return fields


class Spinner:
    """How long a channel busy-polls for replies before it sleeps in ``poll()``.

    Sleeping and being woken costs more than a fast node's whole answer on loopback or a
    local network (on this project's 2-core VM, ~40 % of a single-node acquire+release).
    So a call first spins on non-blocking reads for up to ``limit`` seconds, yielding the CPU
    between reads. When replies keep arriving later than that (a remote or loaded node), the
    spinning stopped paying and is skipped for the next :attr:`PAUSE` calls, then tried again.
    """

    #: Calls without spinning after :attr:`MISSES` calls in a row spun in vain.
    PAUSE = 64
    MISSES = 4

    __slots__ = ("_limit", "_misses", "_skip")

    def __init__(self, limit: float) -> None:
        self._limit = limit
        self._misses = 0
        self._skip = 0

    @property
    def active(self) -> bool:
        """True when the next call will spin."""
        return self._limit > 0 and not self._skip

    def budget(self) -> float:
        """Seconds to spin on the next call (0: go straight to ``poll()``)."""
        if self._skip:
            self._skip -= 1
            return 0.0
        return self._limit

    def settled(self, in_time: bool) -> None:
        """Report whether the call spun with a budget settled before the budget ran out."""
        if in_time:
            self._misses = 0
            return
        self._misses += 1
        if self._misses >= self.MISSES:
            self._misses = 0
            self._skip = self.PAUSE


class Channel:
    """One connection per node, used by one thread at a time."""

    def __init__(
        self,
        labels: Sequence[str],
        factories: Sequence[ConnectionFactory],
        busy_poll: float = 0.0,
    ) -> None:
        self.links = [Link(label, f) for label, f in zip(labels, factories, strict=True)]
        self.spinner = Spinner(busy_poll)
        self.mutex = threading.RLock()
        self._poller = select.poll()
        threads = [
            threading.Thread(target=link.connect_detached, daemon=True) for link in self.links
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join()

    def prepare(self) -> None:
        """Before a plan reads the links, one zero-timeout poll over all of them: read late
        replies that arrived meanwhile (a resumed node catching up), drop connections the
        server closed while idle, and reconnect those that just broke, so no call is lost."""
        by_fd = {fd: link for link in self.links if (fd := link.fileno()) is not None}
        for fd in by_fd:
            self._poller.register(fd, _POLL_EVENTS)
        try:
            ready = self._poller.poll(0)
        finally:
            for fd in by_fd:
                self._poller.unregister(fd)
        for fd, _ in ready:
            link = by_fd[fd]
            if link.is_idle():  # nothing is expected from an idle link: the server closed it
                link.fail("ConnectionError: connection closed by the server")
            else:
                link.drain(receive=True)
        for link in self.links:
            link.revive()

    def execute(self, request: Request) -> list[Any]:
        """Run one plan request and return one reply (or NodeFailure) per node."""
        slots: list[Slot] = []
        for link, call in zip(self.links, request.calls, strict=True):
            if call is None:
                link.usable()  # a node that is down gets its reconnection started
                slot = Slot(None)
                slot.fill(NodeFailure(f"down: {link.last_error or 'not connected'}", sent=False))
            elif not link.usable():
                slot = Slot(call)
                slot.fill(NodeFailure(f"down: {link.last_error or 'reconnecting'}", sent=False))
            else:
                with link._guard:
                    slot = link.send(call)
            slots.append(slot)
        if not request.wait:
            return [None] * len(slots)
        deadline = time.monotonic() + request.timeout
        self._collect(slots, deadline, request.settled)
        retry = [i for i, s in enumerate(slots) if s.done and is_noscript(s.value)]
        if retry:  # SCRIPT FLUSH on a node: EVAL sends the source and caches it again
            for i in retry:
                call = slots[i].call
                assert call is not None
                slots[i] = self.links[i].send(call, by_sha=False)
            self._collect(slots, deadline, request.settled)
        return [s.result() for s in slots]

    def _collect(
        self,
        slots: list[Slot],
        deadline: float,
        settled: Callable[[list[Slot]], bool] | None,
    ) -> None:
        poller = self._poller
        links = self.links
        budget = self.spinner.budget()
        spin_until = min(time.monotonic() + budget, deadline)
        while True:
            waiting = [links[i] for i, slot in enumerate(slots) if not slot.done]
            if not waiting or (settled is not None and settled(slots)):
                if budget:
                    self.spinner.settled(True)
                return
            if any(link.has_buffered() for link in waiting):
                for link in waiting:
                    link.drain(receive=False)
                continue
            now = time.monotonic()
            if budget:
                if now < spin_until:
                    if not any([link.drain(receive=True) for link in waiting]):
                        os.sched_yield()  # let the node (or anyone) run if it shares our CPU
                    continue
                self.spinner.settled(False)
                budget = 0.0
            remaining = deadline - now
            if remaining <= 0:
                return
            by_fd = {fd: link for link in waiting if (fd := link.fileno()) is not None}
            if not by_fd:
                return
            for fd in by_fd:  # a poll object's registry lives in user space: no syscalls
                poller.register(fd, _POLL_EVENTS)
            try:
                ready = poller.poll(remaining * 1000)
            finally:
                for fd in by_fd:
                    poller.unregister(fd)
            for fd, _ in ready:
                by_fd[fd].drain(receive=True)

    def close(self) -> None:
        for link in self.links:
            link.close()
