"""The blocking transport: pipelined calls on non-blocking sockets and one deadline for all.

One :class:`Channel` holds one connection per node. A call is written to every node's socket
first, then the replies are read as they arrive (``poll``) against a single deadline, so N nodes
cost one round trip and a paused node costs nothing once a quorum has answered. The calls use
the socket directly with a ``hiredis`` reader (see :mod:`.redis_py`).
"""

from __future__ import annotations

import contextlib
import os
import select
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import hiredis

from .. import starter
from ..replies import TIMED_OUT, NodeFailure, Request, Slot, is_noscript, result_of
from ..scripts import Script
from .base import (
    MAX_UNREAD,
    describe,
    hold_for_later,
    pack,
    request_slots,
    script_calls,
    send_later,
    watch_unanswered,
)
from .base import resend_unknown_scripts as _resend
from .link import ConnectionFactory, Link
from .spinner import Spinner

_POLL_EVENTS = select.POLLIN | select.POLLERR | select.POLLHUP


class Channel:
    """One connection per node, used by one thread at a time (hold :attr:`mutex`)."""

    def __init__(
        self,
        labels: Sequence[str],
        factories: Sequence[ConnectionFactory],
        busy_poll: float = 0.0,
        unavailable: str = "",
    ) -> None:
        self.links = [Link(label, f) for label, f in zip(labels, factories, strict=True)]
        self.spinner = Spinner(busy_poll)
        self.mutex = threading.RLock()
        #: the replies of the last ``before`` commands sent (see :class:`~..replies.Call`)
        self.ahead: list[Any] = []
        #: when it last went back to its pool (``time.monotonic()``)
        self.idle_since = 0.0
        self._poller = select.poll()
        #: the single-node lane's poll set: the only link's socket, registered while the
        #: descriptor stays the same (:meth:`lane_link`)
        self._lane_poller = select.poll()
        self._lane_fd = -1
        #: the lane for a set of nodes' poll set, over every link (:meth:`fan_links`)
        self._fan_poller = select.poll()
        self._fan_fds: list[int] = []
        self._fan_links: dict[int, Link] = {}
        if unavailable:  # a stand-in that never connects: every node fails with this reason
            for link in self.links:
                link.never(unavailable)
            return
        threads = [
            threading.Thread(target=link.connect_detached, daemon=True) for link in self.links
        ]
        for t in threads:
            starter.start_thread(t)
        for t in threads:
            t.join()

    def prepare(self) -> None:
        """Before a plan reads the links, one zero-timeout poll over all of them: read late
        replies that arrived meanwhile (a resumed node catching up), drop connections the
        server closed while idle, and reconnect those that just broke, so no call is lost."""
        poller = self._poller
        registered: list[tuple[int, Link]] = []
        for link in self.links:
            fd = link.fileno()
            if fd is not None:
                poller.register(fd, _POLL_EVENTS)
                registered.append((fd, link))
        try:
            ready = poller.poll(0)
        finally:
            for fd, _ in registered:
                poller.unregister(fd)
        if ready:
            by_fd = dict(registered)
            for fd, _ in ready:
                found = by_fd.get(fd)
                if found is None:  # left registered by an interrupted unregister: drop it
                    with contextlib.suppress(KeyError):
                        poller.unregister(fd)
                    continue
                if found.is_idle():  # nothing is expected from an idle link: the server closed it
                    found.fail("ConnectionError: connection closed by the server")
                else:
                    found.drain(receive=True)
        for link in self.links:
            link.revive()

    def execute(self, request: Request) -> list[Any]:
        """Run one plan request and return one reply (or NodeFailure) per node."""
        slots = request_slots(self.links, request, Link.send)
        if not request.wait:
            watch_unanswered(request, slots)
            return [None] * len(slots)
        deadline = time.monotonic() + request.timeout
        if request.later:
            later = hold_for_later(request, slots)
            hedge_at = min(deadline, time.monotonic() + request.hedge)
            self._collect(slots, hedge_at, request.settled, skip=later)
            if not (request.settled is not None and request.settled(slots)):
                send_later(self.links, request, slots, Link.send)
        self._collect(slots, deadline, request.settled)
        if _resend(self.links, slots):
            self._collect(slots, deadline, request.settled)
        expired = time.monotonic() >= deadline
        for i, slot in enumerate(slots):
            if slot.ahead:
                self.ahead = [s.result(expired=expired) for s in slot.ahead]
                request.ahead = {**(request.ahead or {}), i: self.ahead}
        watch_unanswered(request, slots)  # a waited give-back: its failures are owed
        return [s.value if s.done else result_of(s, expired=expired) for s in slots]

    def _collect(
        self,
        slots: list[Slot],
        deadline: float,
        settled: Callable[[list[Slot]], bool] | None,
        skip: set[int] | frozenset[int] = frozenset(),
        links: Sequence[Link] | None = None,
    ) -> None:
        """Read replies until ``settled`` says yes, every slot (but ``skip``: hedge nodes not
        asked yet) is filled, or ``deadline`` passes; ``slots[i]`` is a call on
        ``links[i]`` (default: the channel's links). ``settled`` is asked again only after
        a reply came in (this loop runs for every lock call: each turn of a spin is a read
        and a yield, nothing more)."""
        if links is None:
            links = self.links
        budget = self.spinner.budget()
        spin_until = min(time.monotonic() + budget, deadline)
        waiting = [links[i] for i, slot in enumerate(slots) if not slot.done and i not in skip]
        ask = settled is not None and len(waiting) + len(skip) < len(slots)
        while True:
            if not waiting or (ask and settled is not None and settled(slots)):
                if budget:
                    self.spinner.settled(True)
                return
            progressed = False
            if budget and time.monotonic() < spin_until:
                for link in waiting:  # a read of what arrived, buffered replies included
                    if link.drain(receive=True):
                        progressed = True
                if not progressed:
                    os.sched_yield()  # let the node (or anyone) run if it shares our CPU
                    continue
            else:
                if budget:
                    self.spinner.settled(False)
                    budget = 0.0
                for link in waiting:  # replies already read or decrypted: poll would miss them
                    if link.has_buffered() and link.drain(receive=True):
                        progressed = True
                if not progressed:
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        # a last read: a caller paused past its deadline (a collector pass,
                        # CPU starvation) finds the replies that arrived meanwhile
                        for link in waiting:
                            link.drain(receive=True)
                        return
                    readable = self._sleep(waiting, remaining)
                    if readable is None:  # no waiting link has a connection to wait on
                        return
                    if not readable:
                        continue
            waiting = [links[i] for i, slot in enumerate(slots) if not slot.done and i not in skip]
            ask = settled is not None

    def _sleep(self, waiting: list[Link], remaining: float) -> bool | None:
        """Block in ``poll()`` until a waiting link is readable or ``remaining`` seconds pass,
        then read the readable ones; False when none was, None when no link has a socket."""
        by_fd = {fd: link for link in waiting if (fd := link.fileno()) is not None}
        if not by_fd:
            return None
        poller = self._poller
        for fd in by_fd:  # a poll object's registry lives in user space: no syscalls
            poller.register(fd, _POLL_EVENTS)
        try:
            ready = poller.poll(remaining * 1000)
        finally:
            for fd in by_fd:
                poller.unregister(fd)
        for fd, _ in ready:
            link = by_fd.get(fd)
            if link is None:  # left registered by an interrupted unregister: drop it
                with contextlib.suppress(KeyError):
                    poller.unregister(fd)
                continue
            link.drain(receive=True)
        return bool(ready)

    def pending(self) -> bool:
        """True while a call sent on this channel has no reply read yet."""
        return any(link.pending() for link in self.links)

    # -- the single-node lane (see ..lane) -------------------------------------------------
    def lane_link(self) -> Link | None:
        """The only link of a one-node channel when the lane may use it as it is: connected,
        no reply due, nothing arrived since (a late reply, or the server closing it). None
        otherwise: the general path's :meth:`prepare` deals with it."""
        link = self.links[0]
        fd = link.fd
        if not link.connected or link.unread or fd < 0:
            return None
        if fd != self._lane_fd:  # a new connection: a new poll set (one assignment)
            poller = select.poll()
            poller.register(fd, _POLL_EVENTS)
            self._lane_poller, self._lane_fd = poller, fd
        return None if self._lane_poller.poll(0) else link

    def roundtrip(self, link: Link, script: Script, tail: tuple[str, ...], timeout: float) -> Any:
        """One script call on ``link`` (from :meth:`lane_link`), by its SHA and, when the node
        lost its scripts (``SCRIPT FLUSH``), once more in full, as :meth:`execute` would: its
        reply, read as :meth:`_collect` reads (a spin, then ``poll``) until ``timeout``
        seconds pass, or the :class:`~..replies.NodeFailure` :meth:`execute` would give."""
        # every argument of ``tail`` is text (see .base.texts): packed as it is
        packed = hiredis.pack_command(("EVALSHA", script.sha, *tail))  # type: ignore[arg-type]
        by_sha = True
        while True:
            slot = link.spare  # the last call's slot, once filled (no allocation per call)
            if slot.done:
                slot.done, slot.value = False, None
            else:  # still waiting in the queue for a late reply
                slot = link.spare = Slot(None)
            try:
                link.output(packed)  # type: ignore[misc]
                link.unread.append(slot)  # a reply that comes too late is dropped in order
            except OSError as exc:  # includes a full send buffer on a non-blocking socket
                link.fail(describe(exc))
                return NodeFailure(f"down: {describe(exc)}")
            except BaseException:
                link.interrupted()
                raise
            now = time.monotonic()
            deadline = now + timeout
            spinner = self.spinner
            if spinner._skip:  # Spinner.budget(), inline
                spinner._skip -= 1
            elif spinner._limit:
                spin_until = min(now + spinner._limit, deadline)
                while not link.drain(receive=True) and time.monotonic() < spin_until:
                    os.sched_yield()
                # in time only within the budget: a reply read after this thread waited for
                # a CPU past it (a loaded machine) is a miss, not a fast node
                spinner.settled(slot.done and time.monotonic() <= spin_until)
            if not slot.done:
                self._await(link, slot, deadline)
            reply = slot.value if slot.done else NodeFailure(TIMED_OUT)
            if by_sha and type(reply) is NodeFailure and is_noscript(reply) and link.connected:
                by_sha = False  # the node lost its scripts: send this one in full
                packed = hiredis.pack_command(("EVAL", script.source, *tail))  # type: ignore[arg-type]
                continue
            return reply

    def _await(self, link: Link, slot: Slot, deadline: float) -> None:
        """Read ``link`` (from :meth:`lane_link`) until ``slot`` is filled or ``deadline``
        passes, sleeping in ``poll()`` between reads."""
        while not slot.done:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                link.drain(receive=True)  # a last read, as _collect's at its deadline
                return
            if self._lane_poller.poll(remaining * 1000):
                link.drain(receive=True)
                # bytes already read or decrypted on our side: poll would not see them
                while not slot.done and link.has_buffered() and link.drain(receive=True):
                    pass

    def piped_call(
        self,
        link: Link,
        ahead: Sequence[Sequence[str | int]],
        script: Script,
        tail: tuple[str, ...],
        timeout: float,
    ) -> tuple[list[Any], Any]:
        """``script`` with ``tail`` on ``link`` (from :meth:`lane_link`) behind the commands
        ``ahead`` (a waiter's ``BLPOP`` between two clock readings), all in one write, read
        without spinning (the commands ahead block) until ``timeout`` seconds pass: the
        replies of the commands ahead and the script's, as :meth:`execute` gives them (a
        node that lost its scripts gets the script once more in full, alone). Nothing of
        ``ahead`` is read when the write failed (the link is down)."""
        # the same bytes as Link.send of the plan's call with ``before``
        call = hiredis.pack_command(("EVALSHA", script.sha, *tail))  # type: ignore[arg-type]
        packed = b"".join([*map(pack, ahead), call])
        slots = [Slot(None) for _ in ahead]
        slot = Slot(None)
        try:
            link.output(packed)  # type: ignore[misc]
            link.unread.extend(slots)
            link.unread.append(slot)
        except OSError as exc:  # includes a full send buffer on a non-blocking socket
            link.fail(describe(exc))
            return [], NodeFailure(f"down: {describe(exc)}")
        except BaseException:
            link.interrupted()
            raise
        # from the write, as execute() counts
        deadline = time.monotonic() + timeout
        self._await(link, slot, deadline)
        if slot.done and is_noscript(slot.value) and link.connected:
            slot = _written(link, hiredis.pack_command(("EVAL", script.source, *tail)))  # type: ignore[arg-type]
            self._await(link, slot, deadline)
        expired = time.monotonic() >= deadline
        return [s.result(expired=expired) for s in slots], slot.result(expired=expired)

    # -- the lane for a set of nodes (see ..fan_lane) -------------------------------------
    def fan_links(self) -> list[Link] | None:
        """Every link of the channel when the lane may use them as they are: connected and
        not far behind, replies that arrived since the last call read (late ones, in order).
        None when a link is down or was closed by the server while idle: the general path's
        :meth:`prepare` deals with it. One zero-timeout poll over a poll set kept while the
        descriptors stay the same."""
        links = self.links
        fds = []
        for link in links:
            fd = link.fd
            if not link.connected or fd < 0 or len(link.unread) >= MAX_UNREAD:
                return None
            fds.append(fd)
        if fds != self._fan_fds:  # a new connection: a new poll set
            poller = select.poll()
            for fd in fds:
                poller.register(fd, _POLL_EVENTS)
            by_fd = dict(zip(fds, links, strict=True))
            # stored together, after every call: an interrupt cannot leave them apart
            self._fan_poller, self._fan_fds, self._fan_links = poller, fds, by_fd
        for fd, _ in self._fan_poller.poll(0):
            ready = self._fan_links.get(fd)
            if ready is None or ready.is_idle():  # (idle: the server closed it)
                return None  # the general path's prepare() deals with it
            ready.drain(receive=True)
            if not ready.connected:
                return None
        return links

    def fan_call(
        self,
        links: Sequence[Link],
        script: Script,
        tails: Sequence[tuple[str, ...]],
        timeout: float,
        decided: Callable[[list[Slot]], bool],
    ) -> list[Any]:
        """``script`` with ``tails[i]`` (its key count, keys and arguments, all text) on
        ``links[i]``, written to every link before any reply is read, then read as
        :meth:`_collect` reads until ``decided`` says yes or ``timeout`` seconds pass; a node
        that lost its scripts gets it once more in full. Returns what :meth:`execute` would:
        a reply or a :class:`~..replies.NodeFailure` per link."""
        calls = script_calls(script.sha, tails)
        slots = [_written(link, call) for link, call in zip(links, calls, strict=True)]
        # from the writes, as execute() counts: a pause of this process before them (a
        # SIGSTOP, a collector pass) must not spend the replies' time
        deadline = time.monotonic() + timeout
        self._collect(slots, deadline, decided, links=links)
        for i, slot in enumerate(slots):
            if slot.done and is_noscript(slot.value) and links[i].connected:
                full = ("EVAL", script.source, *tails[i])
                slots[i] = _written(links[i], hiredis.pack_command(full))  # type: ignore[arg-type]
                self._collect(slots, deadline, decided, links=links)
        expired = time.monotonic() >= deadline
        return [slot.value if slot.done else slot.result(expired=expired) for slot in slots]

    def close(self) -> None:
        """Close every connection; returns once none of them has a socket open, a connect
        under way (a background reconnect) included: it closes what it made, then this
        returns, so the caller gives the slot back only then."""
        for link in self.links:
            link.close_link()
        for link in self.links:
            if link.mutex.locked():  # a connect under way: wait for it to drop its socket
                with link.mutex:
                    pass


def _written(link: Link, packed: bytes) -> Slot:
    """Write ``packed`` (one call) on ``link``; its slot is filled when the reply is read."""
    slot = Slot(None)
    try:
        link.output(packed)  # type: ignore[misc]
        link.unread.append(slot)
    except OSError as exc:  # includes a full send buffer on a non-blocking socket
        link.fail(describe(exc))
        slot.fill(NodeFailure(f"down: {describe(exc)}"))
    except BaseException:
        link.interrupted()
        raise
    return slot
