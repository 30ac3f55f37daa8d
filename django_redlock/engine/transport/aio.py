"""The asyncio transport: pipelined calls, one deadline, replies read in order.

After redis-py's handshake the transport is handed to a small :class:`asyncio.Protocol` that
feeds a ``hiredis`` reader and fills the waiting calls in order as bytes arrive. No task per
read, nothing to cancel half-read: a reply that comes after its deadline is consumed in order
like any other.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import hiredis
from redis.asyncio.connection import AbstractConnection

from ..replies import Call, NodeFailure, Request, Slot, is_noscript, result_of
from ..scripts import Script
from . import redis_py
from .base import (
    CONNECT_ERRORS,
    HANDSHAKE,
    MAX_UNREAD,
    LinkBase,
    describe,
    hold_for_later,
    pack,
    request_slots,
    resend_unknown_scripts,
    script_calls,
    send_later,
    socket_timeout,
    watch_unanswered,
)
from .loop_time import within_loop_time
from .spinner import Spinner

#: Bytes a spinning lane call reads from its socket at once (its reply is a few dozen).
_SPIN_READ = 4096
#: Lane calls in a row a channel may settle by spinning before it yields to its event loop
#: once (other tasks' I/O and timers are only seen when the loop polls).
SPUN_BEFORE_YIELD = 8

AsyncConnectionFactory = Callable[[], AbstractConnection]
S = TypeVar("S", bound=Slot)


class _Replies(asyncio.Protocol):
    """Receives the bytes of one link's transport once the handshake is done."""

    def __init__(self, link: AsyncLink) -> None:
        self._link = link

    def data_received(self, data: bytes) -> None:
        self._link.received(data)

    def eof_received(self) -> bool:
        return False  # close the transport; connection_lost follows

    def connection_lost(self, exc: Exception | None) -> None:
        self._link.lost(exc)


class AsyncLink(LinkBase):
    """One asyncio connection to one node."""

    def __init__(self, label: str, factory: AsyncConnectionFactory, timeout: float) -> None:
        super().__init__(label)
        self._factory = factory
        self._timeout = timeout
        self._conn: AbstractConnection | None = None
        self._transport: asyncio.WriteTransport | None = None
        self._connecting: asyncio.Task[bool] | None = None
        #: the socket's descriptor for a lane call's own reads while it spins (see
        #: :meth:`spin_read`): a plain (not TLS) socket transport's, else -1
        self.spin_fd = -1
        self._spin_buffer: bytearray | None = None

    async def connect(self) -> bool:
        if self.retired:  # its channel was closed: no socket outside the connection budget
            return False
        conn = None
        try:
            conn = self._factory()
            replies = await within_loop_time(
                redis_py.ahandshake(conn, HANDSHAKE), socket_timeout(self._timeout)
            )
            transport = redis_py.take_transport(conn)
        except asyncio.CancelledError:  # given up mid-handshake: never leave it open
            if conn is not None:
                redis_py.abandon(conn)
            # the caller's doing, not the node's: inline again (never for a closed link)
            self._fresh_failure = not self.retired
            raise
        except CONNECT_ERRORS as exc:  # also a factory that raises (bad TLS option, overflow)
            if conn is not None:
                await conn.disconnect(nowait=True)
            self._down(describe(exc))
            return False
        if self.retired or self._transport is not None:
            # its channel closed meanwhile, or another connect won the race (keep that one)
            await conn.disconnect(nowait=True)
            return self._transport is not None
        self._learn(replies[0])
        self._ready()
        transport.set_protocol(_Replies(self))
        self._conn = conn
        self._transport = transport
        self.spin_fd = _plain_fd(transport)
        self.output = transport.write
        self.connected = True
        return True

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
        if self._retry_due() and self._connecting is None:
            self._connecting = asyncio.get_running_loop().create_task(self._connect_later())
        return False

    async def _connect_later(self) -> bool:
        try:
            return await self.connect()
        finally:
            self._connecting = None

    def stop_connecting(self) -> asyncio.Task[bool] | None:
        """Cancel a reconnect running in the background; returns it (to await) if any. A
        reconnect left pending when its loop closes would leak its half-made socket."""
        task, self._connecting = self._connecting, None
        if task is None or task.done():
            return None
        task.cancel()
        return task

    def _drop(self) -> None:
        self.connected, self.output, self.spin_fd = False, None, -1
        transport, self._transport = self._transport, None
        conn, self._conn = self._conn, None
        if transport is not None:
            redis_py.close_transport(transport)
        if conn is not None:
            redis_py.forget_stream(conn)

    def received(self, data: bytes) -> None:
        self._reader.feed(data)
        self._read_replies()

    def spin_read(self) -> None:
        """Read what has arrived on the socket, without the event loop (a lane call spinning
        for its reply): a plain socket in non-blocking mode, read in stream order with the
        transport's own reads, which find nothing where this took it. A failed or closed
        connection fails the link, as the transport would."""
        buffer = self._spin_buffer
        if buffer is None:
            buffer = self._spin_buffer = bytearray(_SPIN_READ)
        try:
            count = os.readv(self.spin_fd, (buffer,))
            if count > 0:
                self._reader.feed(buffer, 0, count)
        except BlockingIOError:
            return
        except OSError as exc:
            self.fail(describe(exc))
            return
        except BaseException:  # the bytes read may be lost before the reader got them
            self.interrupted()
            raise
        if count == 0:
            self.fail("ConnectionError: connection closed by the server")
            return
        self._read_replies()

    def lost(self, exc: Exception | None) -> None:
        if self._transport is not None:
            self.fail(describe(exc) if exc else "ConnectionError: connection closed by the server")


class _Gather:
    """The slots of one request: wakes the waiting task once, when they are settled (or all
    done), instead of on every reply; no task or event per wait."""

    __slots__ = ("_future", "_settled", "skip", "slots")

    def __init__(self, settled: Callable[[list[Slot]], bool] | None) -> None:
        self.slots: list[Slot] = []
        self._settled = settled
        self._future: asyncio.Future[None] | None = None
        #: hedge nodes not asked yet: not waited for
        self.skip: set[int] = set()

    def settled(self) -> bool:
        return self._settled is not None and self._settled(self.slots)

    def _ready(self) -> bool:
        skip = self.skip
        return all(s.done for i, s in enumerate(self.slots) if i not in skip) or self.settled()

    def check(self) -> None:
        """Called by a slot after it was filled."""
        future = self._future
        if future is not None and not future.done() and self._ready():
            future.set_result(None)

    def send(self, link: AsyncLink, call: Call) -> Slot:
        return link.send(call, notify=self.check)

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


def _plain_fd(transport: asyncio.WriteTransport) -> int:
    """The descriptor of a plain socket transport, -1 for TLS (its bytes are the TLS
    layer's to read) or a transport without a socket."""
    sock = transport.get_extra_info("socket")
    if sock is None or transport.get_extra_info("sslcontext") is not None:
        return -1
    if transport.get_extra_info("ssl_object") is not None:
        return -1
    return int(sock.fileno())


class _Reply(Slot):
    """The slot of one lane call: its fill resolves the future its caller awaits, if it
    waits (no ``notify`` callable per call; no future for a reply read while spinning)."""

    __slots__ = ("future",)

    def __init__(self) -> None:
        super().__init__(None)
        self.future: asyncio.Future[None] | None = None

    def fill(self, value: Any) -> None:
        self.value = value
        self.done = True
        future = self.future
        if future is not None and not future.done():
            future.set_result(None)


def _written(link: AsyncLink, packed: bytes, notify: Callable[[], None]) -> Slot:
    """Write ``packed`` (one call) on ``link``; its slot is filled when the reply is read."""
    return _write(link, packed, Slot(None, notify))


def _write(link: AsyncLink, packed: bytes, slot: S) -> S:
    """Write ``packed`` on ``link``, ``slot`` to be filled with its reply."""
    try:
        link.output(packed)  # type: ignore[misc]
        link.unread.append(slot)  # a reply that comes too late is dropped in order
    except BaseException:  # transport.write raises nothing of the node's: ours
        link.interrupted()
        raise
    return slot


def _send(link: AsyncLink, call: Call) -> Slot:
    return link.send(call)


async def _awaited(reply: _Reply, timeout: float) -> None:
    """Wait until ``reply`` is filled or ``timeout`` seconds pass (one future, one timer)."""
    if reply.done:
        return
    future = reply.future = asyncio.get_running_loop().create_future()
    timer = asyncio.get_running_loop().call_later(max(timeout, 0.0), _finish, future)
    try:
        await future
    finally:
        timer.cancel()


def _finish(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


class AsyncChannel:
    """One asyncio connection per node, used by one task at a time (hold :attr:`mutex`)."""

    def __init__(
        self,
        labels: Sequence[str],
        factories: Sequence[AsyncConnectionFactory],
        timeout: float,
        unavailable: str = "",
        busy_poll: float = 0.0,
    ) -> None:
        self.links = [AsyncLink(lb, f, timeout) for lb, f in zip(labels, factories, strict=True)]
        #: how long a lane call spins for its reply before it awaits it (see :meth:`roundtrip`)
        self.spinner = Spinner(busy_poll)
        #: lane calls settled by spinning since this channel last yielded to its event loop
        self._spun = 0
        self.mutex = asyncio.Lock()
        #: the replies of the last ``before`` commands sent (see :class:`~..replies.Call`)
        self.ahead: list[Any] = []
        #: when it last went back to its pool (``time.monotonic()``)
        self.idle_since = 0.0
        #: the wake-up of the task this channel was handed to as it came back (see
        #: :meth:`..pools.loop_channels.LoopChannels._areturn`); no other task takes it
        self.reserved: asyncio.Future[None] | None = None
        for link in self.links if unavailable else ():  # a stand-in that never connects
            link.never(unavailable)

    async def connect(self) -> None:
        await asyncio.gather(*(link.connect() for link in self.links))

    async def prepare(self) -> None:
        """Before a plan reads the links: reconnect those the server just closed (the event
        loop already noticed, through ``connection_lost``)."""
        for link in self.links:
            if link.needs_revive():
                await link.revive()

    def send_now(self, request: Request) -> None:
        """Send a fire-and-forget request at once, without awaiting anything; a call that
        fails (its connection dropped, say by an interrupt as the reply was read) is reported
        to the request's ``unanswered``, as :meth:`execute` reports it (a give-back that
        could not go out is then owed, and sent from the background)."""
        watch_unanswered(request, request_slots(self.links, request, _send))

    async def execute(self, request: Request) -> list[Any]:
        """Run one plan request and return one reply (or NodeFailure) per node."""
        gather = _Gather(request.settled)
        gather.slots = slots = request_slots(self.links, request, gather.send)
        if not request.wait:
            watch_unanswered(request, slots)
            return [None] * len(slots)
        deadline = time.monotonic() + request.timeout
        if request.later:
            gather.skip = hold_for_later(request, slots)
            await gather.wait(min(deadline, time.monotonic() + request.hedge))
            gather.skip = set()
            if not gather.settled():
                send_later(self.links, request, slots, gather.send)
        await gather.wait(deadline)
        if resend_unknown_scripts(self.links, slots, gather.check):
            await gather.wait(deadline)
        expired = time.monotonic() >= deadline
        for i, slot in enumerate(slots):
            if slot.ahead:
                self.ahead = [s.result(expired=expired) for s in slot.ahead]
                request.ahead = {**(request.ahead or {}), i: self.ahead}
        watch_unanswered(request, slots)  # a waited give-back: its failures are owed
        return [result_of(s, expired=expired) for s in slots]

    def pending(self) -> bool:
        """True while a call sent on this channel has no reply read yet."""
        return any(link.pending() for link in self.links)

    # -- the single-node lane (see ..alane) ----------------------------------------------
    def lane_link(self) -> AsyncLink | None:
        """The only link of a one-node channel when the lane may use it as it is: connected
        and no reply due (the event loop has read whatever arrived). None otherwise: the
        general path's :meth:`prepare` deals with it."""
        link = self.links[0]
        return link if link.connected and not link.unread else None

    async def roundtrip(
        self, link: AsyncLink, script: Script, tail: tuple[str, ...], timeout: float
    ) -> Any:
        """Asyncio twin of :meth:`.sync.Channel.roundtrip`: one script call on ``link`` (from
        :meth:`lane_link`), by its SHA and once more in full if the node lost its scripts;
        its reply, or ``NodeFailure(TIMED_OUT)`` after ``timeout`` seconds. One future and
        one timer per call, no task. Cancelled while it waits, the call stays queued: its
        reply is read in order and dropped.

        When the event loop has nothing else ready, it first spins for the reply (the
        channel's :class:`.spinner.Spinner`, ``REDLOCK_BUSY_POLL``), reading the socket
        itself (:meth:`AsyncLink.spin_read`): a fast node's reply is then read without the
        loop's poll and wake-up, and the call returns without suspending. After
        :data:`SPUN_BEFORE_YIELD` such calls in a row it yields to the loop once, so a task
        that locks in a loop never starves the others' I/O and timers."""
        # every argument of ``tail`` is text (see .base.texts): packed as it is
        packed = hiredis.pack_command(("EVALSHA", script.sha, *tail))  # type: ignore[arg-type]
        by_sha = True
        loop = asyncio.get_running_loop()
        while True:
            slot = _write(link, packed, _Reply())
            spinner = self.spinner
            if link.spin_fd >= 0 and spinner.active and not getattr(loop, "_ready", True):
                self._spin(link, slot, spinner)
            if slot.done:
                self._spun += 1
                if self._spun >= SPUN_BEFORE_YIELD:
                    self._spun = 0
                    await asyncio.sleep(0)
            else:
                self._spun = 0
                future = slot.future = loop.create_future()
                timer = loop.call_later(timeout, _finish, future)
                try:
                    await future
                finally:
                    timer.cancel()
                if not slot.done and link.spin_fd >= 0:
                    link.spin_read()  # a last read at the deadline, as the blocking lane's
            # timed out: the slot (this call's own) stays queued for the late reply, which the
            # next call on the connection reads; the plans settle a release with it
            # (``late_answers``) instead of sending it again
            reply = slot.value if slot.done else slot.result(expired=True)
            if by_sha and type(reply) is NodeFailure and is_noscript(reply) and link.connected:
                by_sha = False  # the node lost its scripts: send this one in full
                packed = hiredis.pack_command(("EVAL", script.source, *tail))  # type: ignore[arg-type]
                continue
            return reply

    async def piped_call(
        self,
        link: AsyncLink,
        ahead: Sequence[Sequence[str | int]],
        script: Script,
        tail: tuple[str, ...],
        timeout: float,
    ) -> tuple[list[Any], Any]:
        """Asyncio twin of :meth:`.sync.Channel.piped_call`: ``script`` with ``tail`` on
        ``link`` (from :meth:`lane_link`) behind the commands ``ahead``, in one write, its
        reply awaited without spinning (one future, one timer) until ``timeout`` seconds
        pass; the replies of the commands ahead and the script's."""
        call = hiredis.pack_command(("EVALSHA", script.sha, *tail))  # type: ignore[arg-type]
        packed = b"".join([*map(pack, ahead), call])
        slots = [Slot(None) for _ in ahead]
        reply = _Reply()
        try:
            link.output(packed)  # type: ignore[misc]
            link.unread.extend(slots)
            link.unread.append(reply)
        except BaseException:  # transport.write raises nothing of the node's: ours
            link.interrupted()
            raise
        deadline = time.monotonic() + timeout
        await _awaited(reply, timeout)
        if reply.done and is_noscript(reply.value) and link.connected:
            full = hiredis.pack_command(("EVAL", script.source, *tail))  # type: ignore[arg-type]
            reply = _write(link, full, _Reply())
            await _awaited(reply, deadline - time.monotonic())
        expired = not reply.done
        return [s.result(expired=expired) for s in slots], reply.result(expired=True)

    # -- the lane for a set of nodes (see ..afan_lane) ----------------------------------
    def fan_links(self) -> list[AsyncLink] | None:
        """Every link of the channel when the lane may use them as they are: connected and
        not far behind (the event loop has read whatever arrived). None otherwise: the
        general path's :meth:`prepare` deals with it."""
        links = self.links
        for link in links:
            if not link.connected or len(link.unread) >= MAX_UNREAD:
                return None
        return links

    async def fan_call(
        self,
        links: Sequence[AsyncLink],
        script: Script,
        tails: Sequence[tuple[str, ...]],
        timeout: float,
        decided: Callable[[list[Slot]], bool],
    ) -> list[Any]:
        """Asyncio twin of :meth:`.sync.Channel.fan_call`: ``script`` with ``tails[i]`` on
        ``links[i]``, every call written before the one wait (one future, one timer) that
        ends once ``decided`` says yes or ``timeout`` seconds pass; a node that lost its
        scripts gets it once more in full. A reply or a NodeFailure per link."""
        gather = _Gather(decided)
        calls = script_calls(script.sha, tails)
        gather.slots = slots = [
            _written(link, call, gather.check) for link, call in zip(links, calls, strict=True)
        ]
        deadline = time.monotonic() + timeout
        await gather.wait(deadline)
        for i, slot in enumerate(slots):
            if slot.done and is_noscript(slot.value) and links[i].connected:
                full = ("EVAL", script.source, *tails[i])
                slots[i] = _written(links[i], hiredis.pack_command(full), gather.check)  # type: ignore[arg-type]
                await gather.wait(deadline)
        expired = time.monotonic() >= deadline
        return [slot.value if slot.done else slot.result(expired=expired) for slot in slots]

    @staticmethod
    def _spin(link: AsyncLink, slot: Slot, spinner: Spinner) -> None:
        """Read ``link``'s socket until ``slot`` is filled or the spinner's budget is spent
        (yielding the CPU between reads), and tell the spinner whether it paid."""
        spin_until = time.monotonic() + spinner.budget()
        while True:
            link.spin_read()
            if slot.done or link.spin_fd < 0 or time.monotonic() >= spin_until:
                break
            os.sched_yield()
        spinner.settled(slot.done and time.monotonic() <= spin_until)

    def close_now(self) -> list[asyncio.Task[bool]]:
        """Close every connection at once (no await: usable while being cancelled); returns
        the background reconnects it cancelled (await them where you can)."""
        stopped = []
        for link in self.links:
            link.close_link()
            task = link.stop_connecting()
            if task is not None:
                stopped.append(task)
        return stopped

    async def close(self) -> None:
        """Close every connection and wait until their sockets are closed."""
        stopped = self.close_now()
        if stopped:
            await asyncio.gather(*stopped, return_exceptions=True)
        await asyncio.sleep(0)  # a transport closes its socket on the loop's next turn
