"""What the sync and the asyncio transport share: one link's reconnection backoff, its queue
of calls whose replies are unread, reading replies in order, and a request's per-node slots.

Replies are read in order on each connection: a reply that arrives after its call's deadline
is read and dropped later, which is also why a release sent after a timed-out acquire can
never overtake it.
"""

from __future__ import annotations

import contextlib
import functools
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

import hiredis
from redis.exceptions import RedisError

from ..replies import (
    NOT_INVOLVED,
    Call,
    NodeFailure,
    Request,
    Slot,
    failed_slot,
    is_noscript,
)
from ..scripts import ALL_SCRIPTS, RELEASE

#: A node with this many unanswered calls gets no new acquisitions until it catches up. Kept
#: small so the calls in flight (a few hundred bytes each) always fit in the kernel's socket
#: buffers: a paused node must receive every release whole, never a truncated one.
MAX_UNREAD = 64
#: First and longest pause between reconnection attempts to a node that is down, seconds.
RECONNECT_MIN = 0.05
RECONNECT_MAX = 2.0
#: Error prefixes that mean "this server is no longer the right one": a write refused by a
#: replica (a master demoted by a failover), a cluster slot served elsewhere now.
RELOCATE = ("READONLY", "MOVED")
#: How late a node whose ``hz`` is unknown may end a timed-out ``BLPOP`` (Redis's default
#: ``hz`` is 10), seconds.
DEFAULT_TICK = 0.1
#: Sent on every new connection in one write: learn the node's incarnation, load the scripts.
HANDSHAKE: list[tuple[str, ...]] = [("INFO", "server")] + [
    ("SCRIPT", "LOAD", script.source) for script in ALL_SCRIPTS
]


#: What connecting to a node raises when the node or the network is at fault (or the
#: connection's settings are: a bad TLS option, a port out of range). Anything else (a signal
#: handler's exception, Celery's ``SoftTimeLimitExceeded``) is the caller's, and goes on.
CONNECT_ERRORS: tuple[type[Exception], ...] = (
    OSError,
    RedisError,
    EOFError,
    ValueError,
    TypeError,
    OverflowError,
)


def texts(command: Sequence[Any]) -> tuple[Any, ...]:
    """``command`` with every number turned to text. hiredis turns numbers to text itself,
    and when a signal handler raises during that conversion (CPython runs handlers there)
    it crashes the process instead of raising; done here, the handler's exception is raised
    like anywhere else."""
    # a list, then a tuple: a generator would be resumed (a Python call) once per argument
    return tuple([a if type(a) is str or type(a) is bytes else str(a) for a in command])


def pack(command: Sequence[Any]) -> bytes:
    """One command in the Redis protocol (see :func:`texts`)."""
    return hiredis.pack_command(texts(command))  # type: ignore[no-any-return]


def script_calls(sha: str, tails: Sequence[tuple[str, ...]]) -> list[bytes]:
    """``EVALSHA sha`` with each of ``tails`` (key count, keys and arguments, all text: see
    :func:`texts`), packed again only where a tail is another object than the one before: a
    release sends one tail to every node but the one waiters block on."""
    calls = []
    last: tuple[str, ...] | None = None
    call = b""
    for tail in tails:
        if tail is not last:
            call = hiredis.pack_command(("EVALSHA", sha, *tail))  # type: ignore[arg-type]
            last = tail
        calls.append(call)
    return calls


#: Longest reason :func:`describe` gives: room for every view of a list of sentinels or seeds
#: that all declined (about 65 characters each), yet bounded for a huge error text.
REASON_MAX = 1000


def socket_timeout(node_timeout: float) -> float:
    """How long one socket operation (connecting, the handshake) may block: four node
    timeouts, at least 0.2 s. Calls have their own, shorter deadlines."""
    return max(node_timeout * 4, 0.2)


def describe(exc: BaseException) -> str:
    """``ExceptionName: message`` on one line (whitespace runs collapsed), at most
    :data:`REASON_MAX` characters: the one way every report shows an error. redis-py's
    messages never include a URL, and so never a password."""
    text = " ".join(str(exc).split())
    return (f"{type(exc).__name__}: {text}" if text else type(exc).__name__)[:REASON_MAX]


def parse_info(raw: Any) -> dict[str, str]:
    """The fields of an ``INFO`` reply (a dict from RESP3, text from RESP2)."""
    if isinstance(raw, dict):
        return {str(k): str(v) for k, v in raw.items()}
    text = raw.decode() if isinstance(raw, bytes) else str(raw)
    fields: dict[str, str] = {}
    for line in text.splitlines():
        if ":" in line and not line.startswith("#"):
            k, _, v = line.partition(":")
            fields[k] = v.strip()
    return fields


class LinkBase:
    """One connection to one node: its state as plans see it (:class:`~..state.NodeView`),
    the calls whose replies are still unread, and when to try reconnecting."""

    def __init__(self, label: str) -> None:
        self.label = label
        #: True while a connection is up (a plain attribute: read on every call)
        self.connected = False
        #: writes bytes to the connection (``socket.sendall`` or ``transport.write``) while up
        self.output: Callable[[bytes], object] | None = None
        #: the calls sent whose replies are not read yet, oldest first
        self.unread: deque[Slot] = deque()
        self._reader: Any = None
        self._run_id: str | None = None
        self._node_started: float | None = None
        #: see :attr:`~..state.NodeView.tick` (learned from ``INFO server`` on connecting)
        self.tick = DEFAULT_TICK
        self._backoff = RECONNECT_MIN
        self._retry_at = 0.0
        self._fresh_failure = False
        self.last_error = ""
        #: closed for good with its channel: never reconnects (see :meth:`close_link`)
        self.retired = False

    # -- what the transport implements ---------------------------------------------------
    def _drop(self) -> None:
        """Close the connection (if any) without touching the unread calls."""
        raise NotImplementedError

    # -- state seen by plans -------------------------------------------------------------
    @property
    def run_id(self) -> str | None:
        return self._run_id if self.connected else None

    def uptime(self) -> float | None:
        if self._node_started is None:
            return None
        return time.monotonic() - self._node_started

    # -- connecting ----------------------------------------------------------------------
    def _learn(self, info: Any) -> None:
        """Remember the node's incarnation from its ``INFO server`` reply."""
        fields = parse_info(info)
        self._run_id = fields.get("run_id", "")
        self._node_started = time.monotonic() - float(fields.get("uptime_in_seconds", "0"))
        # the configured hz: with dynamic-hz the server may run faster, never slower
        hz = fields.get("configured_hz") or fields.get("hz") or ""
        self.tick = 1 / int(hz) if hz.isdigit() and int(hz) > 0 else DEFAULT_TICK

    def _ready(self) -> None:
        """A new connection is up: nothing unread, a fresh reader, no backoff."""
        self.unread.clear()
        self._reader = hiredis.Reader()
        self._backoff = RECONNECT_MIN
        self.last_error = ""

    def _down(self, reason: str) -> None:
        self.last_error = reason
        self._retry_at = time.monotonic() + self._backoff
        self._backoff = min(RECONNECT_MAX, self._backoff * 2)

    @property
    def revives_inline(self) -> bool:
        """True when the next call reconnects this connection itself (it was healthy until it
        just broke): a background reconnect started meanwhile would make that call skip it
        and fail "down" (see :func:`..pools.pick.reconnect_down`)."""
        return self._fresh_failure

    def _retry_due(self) -> bool:
        return not self.retired and time.monotonic() >= self._retry_at

    def never(self, reason: str) -> None:
        """Stay down with ``reason``, never trying to connect (a stand-in channel)."""
        self.last_error = reason
        self._retry_at = float("inf")

    def fail(self, reason: str) -> None:
        """Drop the connection; every unread call fails with ``reason``."""
        self._fresh_failure = self.connected and self._backoff == RECONNECT_MIN
        self._drop()
        while self.unread:
            self.unread.popleft().fill(NodeFailure(reason))
        self._down(reason)

    def close_link(self) -> None:
        """Close the connection for good (its channel is closed): it never reconnects, and a
        connect still in flight drops what it makes, so a closed channel holds no socket
        outside the connection budget. Its unread calls fail ("closed"), so a
        fire-and-forget give-back among them is reported unanswered and sent again
        elsewhere (a blocking connection closed while blocked: the server drops what came
        after the ``BLPOP``)."""
        self.retired = True
        self.never("closed")
        self._fresh_failure = False
        self._drop()
        while self.unread:
            slot = self.unread.popleft()
            with contextlib.suppress(RuntimeError):  # a waiter's event loop closed already
                slot.fill(NodeFailure("closed"))

    # -- calls ---------------------------------------------------------------------------
    def send(
        self, call: Call, *, by_sha: bool = True, notify: Callable[[], None] | None = None
    ) -> Slot:
        """Write ``call``; its slot is filled when the reply is read (or the link fails)."""
        if not self.connected:
            return failed_slot(call, f"down: {self.last_error or 'not connected'}")
        # A node this far behind (paused, or partitioned) gets no new calls until it catches
        # up, but the connection is kept: closing it would make the node drop, unprocessed, the
        # releases queued behind its late acquires. Releases are always sent, so it runs each
        # one right after the acquire it undoes.
        if len(self.unread) >= MAX_UNREAD and call.script is not RELEASE:
            return failed_slot(call, f"not answering ({len(self.unread)} calls queued)")
        slot = Slot(call, notify)
        assert self.output is not None
        packed = pack(call.packed_args(by_sha=by_sha))
        if call.before:
            packed = b"".join([*map(pack, call.before), packed])
        try:
            self.output(packed)
            if call.before:
                slot.ahead = tuple(Slot(None) for _ in call.before)
                self.unread.extend(slot.ahead)
            self.unread.append(slot)
        except OSError as exc:  # includes a full send buffer on a non-blocking socket
            self.fail(describe(exc))
            slot.fill(NodeFailure(f"down: {describe(exc)}"))
            return slot
        except BaseException:
            self.interrupted()
            raise
        return slot

    def pending(self) -> bool:
        """True while a call sent on this connection has no reply read yet."""
        return bool(self.unread)

    @property
    def behind(self) -> bool:
        return bool(self.unread)

    def _read_replies(self) -> bool:
        """Fill unread slots, in order, from what the reader has parsed; True if any was
        filled (or the link failed on a protocol error)."""
        progressed = demoted = False
        try:
            while self.unread:
                try:
                    reply = self._reader.gets()
                except hiredis.ProtocolError as exc:
                    self.fail(describe(exc))
                    return True
                if reply is False:
                    break
                if isinstance(reply, hiredis.ReplyError):
                    demoted = demoted or str(reply).startswith(RELOCATE)
                    reply = NodeFailure(f"ResponseError: {reply}")
                self.unread.popleft().fill(reply)
                progressed = True
        except BaseException:  # between taking a reply and filling its slot, maybe
            self.interrupted()
            raise
        if demoted:  # reconnecting finds the new master or slot owner (or fails meanwhile)
            self.fail("ConnectionError: the node is a replica now, or no longer has the keys")
        return progressed

    def interrupted(self) -> None:
        """An exception (a signal handler's, a worker timeout) interrupted writing a call or
        matching a reply to its call: whether the node got the call, or which call a reply
        was for, is unknown, so this connection's replies can no longer be paired with their
        calls. It is dropped (every unread call fails); the next call connects afresh."""
        self.fail("ConnectionError: interrupted while a call was written or a reply read")


def request_slots(
    links: Sequence[Any], request: Request, send: Callable[[Any, Call], Slot]
) -> list[Slot]:
    """Send each node's call of ``request`` with ``send(link, call)``; a node that is down
    (or has no call) gets a failed slot, and its reconnection is started."""
    slots: list[Slot] = []
    for link, call in zip(links, request.calls, strict=True):
        if call is None:
            # a node that is down gets its reconnection started
            reason = (
                NOT_INVOLVED if link.usable() else f"down: {link.last_error or 'not connected'}"
            )
            slots.append(failed_slot(None, reason))
        elif link.connected:  # the common case, without the call below
            slots.append(send(link, call))
        else:
            slots.append(_send_one(link, call, send))
    return slots


def _send_one(link: Any, call: Call, send: Callable[[Any, Call], Slot]) -> Slot:
    if not link.usable():
        return failed_slot(call, f"down: {link.last_error or 'reconnecting'}")
    return send(link, call)


def hold_for_later(request: Request, slots: list[Slot]) -> set[int]:
    """Put a still-to-answer placeholder (a slot without a call, see
    :func:`~..replies.result_of`) in the slots of ``request.later``'s nodes; returns them."""
    later = request.later_nodes()
    for i in later:
        slots[i] = Slot(None)
    return later


def send_later(
    links: Sequence[Any], request: Request, slots: list[Slot], send: Callable[[Any, Call], Slot]
) -> None:
    """Send the hedge calls of ``request`` (their placeholders replaced by real slots)."""
    for i, call in enumerate(request.later or ()):
        if call is not None:
            slots[i] = _send_one(links[i], call, send)


def resend_unknown_scripts(
    links: Sequence[LinkBase], slots: list[Slot], notify: Callable[[], None] | None = None
) -> bool:
    """After ``SCRIPT FLUSH`` on a node: send the calls it refused again with ``EVAL`` (which
    caches the script again); True if any was."""
    retry = [
        i for i, s in enumerate(slots) if isinstance(s.value, NodeFailure) and is_noscript(s.value)
    ]
    for i in retry:
        call, ahead = slots[i].call, slots[i].ahead
        assert call is not None
        slots[i] = links[i].send(replace(call, before=()), by_sha=False, notify=notify)
        slots[i].ahead = ahead  # what ran ahead of it ran once, the first time
    return bool(retry)


def watch_unanswered(request: Request, slots: Sequence[Slot]) -> None:
    """For a fire-and-forget ``request`` with ``unanswered``: report each call that failed at
    once now, and each one whose reply turns out to be a failure (its connection broke before
    the reply was read) when its slot is filled."""
    hook = request.unanswered
    if hook is None:
        return
    for index, slot in enumerate(slots):
        if slot.call is None:
            continue
        if slot.done:
            _report(hook, index, slot)
        else:
            slot.notify = functools.partial(_report, hook, index, slot)


def _report(hook: Callable[[int], None], index: int, slot: Slot) -> None:
    if isinstance(slot.value, NodeFailure):
        hook(index)
