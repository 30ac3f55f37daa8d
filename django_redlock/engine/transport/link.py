"""One node's blocking connection: connect, reconnect in the background, read replies.

A :class:`Link` is the socket of one node in a :class:`~.sync.Channel`; it connects through
redis-py (so every connection option of redis-py works) and then talks to the socket directly
with a ``hiredis`` reader (see :mod:`.redis_py`).
"""

from __future__ import annotations

import math
import socket
import ssl
import threading
import time
from collections.abc import Callable

from redis.connection import AbstractConnection

from .. import starter
from ..replies import Slot
from . import redis_py
from .base import CONNECT_ERRORS, HANDSHAKE, LinkBase, describe

ConnectionFactory = Callable[[], AbstractConnection]

_BUFFER_SIZE = 65536
#: Seconds after which a background reconnect handed to the starter that has not run is
#: handed over again (an interrupt may have lost it; see :meth:`Link.usable`).
REQUEUE_AFTER = 0.5


def _interrupt(exc: BaseException) -> bool:
    """Whether ``exc`` may come from a signal handler (they run in the main thread only):
    anything but an ``Exception`` (``KeyboardInterrupt``), or an ``Exception`` raised in the
    main thread that is not a connection error (Celery's ``SoftTimeLimitExceeded``, an alarm)."""
    if not isinstance(exc, Exception):
        return True
    return threading.current_thread() is threading.main_thread()


class Link(LinkBase):
    """One blocking connection to one node."""

    def __init__(self, label: str, factory: ConnectionFactory) -> None:
        super().__init__(label)
        self._factory = factory
        self._conn: AbstractConnection | None = None
        self._sock: socket.socket | None = None
        self._buffer = bytearray(_BUFFER_SIZE)
        #: the socket's file descriptor while connected, else -1
        self.fd = -1
        #: the reply slot :meth:`Channel.roundtrip` reuses once it is filled
        self.spare = Slot(None)
        self.spare.done = True
        self._reconnecting = False
        #: when a background reconnect was last handed to the starter and has not run yet
        #: (-inf: none waits); see :meth:`usable`
        self._queued_at = -math.inf
        #: held while (re)connecting, so two connects never race. Senders need no lock: a
        #: connect runs only while the link is down, and publishes ``connected`` last
        self.mutex = threading.Lock()

    # -- connecting ----------------------------------------------------------------------
    def connect(self) -> bool:
        """Connect, load the scripts and learn the node's ``run_id``; False on failure, and
        at once, without a socket, for a link whose channel was closed (a reconnect that
        started before the close must not open one outside the connection budget)."""
        if self.retired:
            return False
        conn = None
        try:
            conn = self._factory()
            info, *_ = redis_py.handshake(conn, HANDSHAKE)
            sock = redis_py.connected_socket(conn)
            fd = sock.fileno()
            self._learn(info)  # calls: an interrupt here drops the socket, as above
            self._ready()
        except BaseException as exc:
            if conn is not None:
                conn.disconnect()
            if isinstance(exc, CONNECT_ERRORS) or not _interrupt(exc):
                self._down(describe(exc))  # also a factory that raises (a bad TLS option)
                return False
            # a signal handler's exception: not the node's fault, so the next call
            # reconnects inline again instead of failing "down" until a background retry
            self._fresh_failure = True
            raise
        # stores only from here (no call, so no signal handler's exception lands between)
        self._conn = conn
        self._sock = sock
        self.fd = fd
        self.output = sock.sendall
        self.connected = True  # last: a sender that sees it sees everything above
        if self.retired:  # its channel closed meanwhile (set before that close's drop)
            self._drop()
            return False
        return True

    def revive(self) -> None:
        """Reconnect inline a connection that was healthy until it just broke (on loopback or
        a LAN that costs less than a failed call); later attempts run in the background."""
        if self._sock is None and self._fresh_failure and not self._reconnecting:
            # the flag is cleared after the connect: an interrupt in it leaves the next call
            # to reconnect inline again (cleared first, the link waited for a background
            # retry and its backoff, reported down though the node was healthy)
            self.connect_detached()
            self._fresh_failure = False

    def usable(self) -> bool:
        """True when connected; else start a background reconnect when its time has come.

        One start waits in the starter's queue at a time: a node that is down, asked by
        callers in a tight loop, used to queue one job per call (over a million in two
        seconds under a test's storm, which then took minutes to drain). A start an
        interrupt lost between the record and the hand-over is handed over again
        :data:`REQUEUE_AFTER` seconds later."""
        if self.connected:
            return True
        if self._retry_due() and not self._reconnecting:
            now = time.monotonic()
            if now - self._queued_at >= REQUEUE_AFTER:
                self._queued_at = now
                starter.call_soon(self._start_reconnect)
        return False

    def _start_reconnect(self) -> None:
        """Start a background reconnect unless one runs (in the starter or a non-main thread:
        the flag and the start are never split by a signal handler's exception)."""
        self._queued_at = -math.inf
        if self._reconnecting or not self._retry_due():
            return
        self._reconnecting = True
        try:
            threading.Thread(
                target=self._reconnect, name=f"redlock-connect {self.label}", daemon=True
            ).start()
        except BaseException:
            self._reconnecting = False
            raise

    def _reconnect(self) -> None:
        try:
            self.connect_detached()
        finally:
            self._reconnecting = False

    def connect_detached(self) -> bool:
        """Connect without disturbing a caller that is using the channel right now; a link
        that another reconnect (inline or background) connected meanwhile is kept."""
        with self.mutex:
            return self.connected or self.connect()

    def _drop(self) -> None:
        self.connected, self.output, self.fd = False, None, -1
        conn, self._conn, self._sock = self._conn, None, None
        if conn is not None:
            conn.disconnect()

    # -- replies -------------------------------------------------------------------------
    def is_idle(self) -> bool:
        """Connected with no reply outstanding: if its socket is readable, the server closed
        it (CLIENT KILL, idle timeout, restart)."""
        return self.connected and not self.unread and not self.has_buffered()

    def fileno(self) -> int | None:
        sock = self._sock
        return sock.fileno() if self.connected and sock is not None else None

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
            count = self._receive(sock)
            if count is None:
                return True
            if count < 0 and not self._reader.has_data():  # nothing new, nothing unread
                return False
        return self._read_replies()

    def _receive(self, sock: socket.socket) -> int | None:
        """Read what arrived into the reader: the byte count (-1: nothing yet), or None when
        the connection failed (the link is down and :attr:`last_error` says why)."""
        try:
            count = sock.recv_into(self._buffer)
            if count > 0:
                self._reader.feed(self._buffer, 0, count)
        except (BlockingIOError, ssl.SSLWantReadError):
            return -1
        except OSError as exc:
            self.fail(describe(exc))
            return None
        except BaseException:  # the bytes read may be lost before the reader got them
            self.interrupted()
            raise
        if count == 0:
            self.fail("ConnectionError: connection closed by the server")
            return None
        return count
