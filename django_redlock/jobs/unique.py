"""One queued (or running) task per key, whatever the queue: the part of ``unique_task``
(:mod:`django_redlock.contrib.tasks`) and ``enqueue_unique`` (:mod:`django_redlock.contrib.rq`)
that does not depend on the queue.

The *marker* of a key is a note (:mod:`.notes`) naming the task that holds it:

* ``queued|<id>``, written by the enqueue, lives ``queued_ttl`` seconds: nobody renews it,
  so a task that never starts (no worker, a deleted job) holds the key that long at most;
* ``running|<id>`` (``until="finished"``), written by the worker when the task starts, lives
  one lease TTL and is renewed by a thread of that worker until the run ends: a worker killed
  mid-task frees the key within one TTL.

The enqueue reads the marker, asks the queue about the task it names, and sends a new task
only when that one is over (finished, failed, unknown to the queue, or running with
``until="started"``), all inside the key's enqueue mutex (``"<key>:enqueue"``, a lock of the
alias), so two processes enqueuing at once send one task.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from ..engine import MAX_NAME_LENGTH, start_thread
from ..exceptions import LockError
from ..locking.registry import locks
from ..validation import check_name, check_timeout, check_ttl
from .notes import Note, Notes

logger = logging.getLogger("django_redlock")  # docs/index.md: one logger name
H = TypeVar("H")

UNTIL_CHOICES = ("started", "finished")
#: How long a queued task's marker lives without a worker starting it, seconds.
DEFAULT_QUEUED_TTL = 3600.0
#: How long an enqueue waits for another process's enqueue of the same key, seconds.
DEFAULT_ENQUEUE_TIMEOUT = 10.0
#: Suffix of the lock that makes check, send and mark one step.
MUTEX_SUFFIX = ":enqueue"
#: A task the queue says is running, whose marker still says queued (its worker died before
#: writing the running marker), holds the key this much longer than one lease TTL.
START_SLACK = 1.0

QUEUED, RUNNING, OVER = "queued", "running", "over"


#: The longest key: a lock name, less the enqueue mutex's suffix.
MAX_KEY_LENGTH = MAX_NAME_LENGTH - len(MUTEX_SUFFIX)


def check_key(key: Any) -> str:
    """A unique task's key: a lock name short enough for its enqueue mutex."""
    name = check_name(key)
    if len(name) > MAX_KEY_LENGTH:
        raise ValueError(
            f"A unique task's key is {len(name)} characters long; the limit is "
            f"{MAX_KEY_LENGTH} (its enqueue mutex, the lock {MUTEX_SUFFIX!r} added, is a lock "
            f"name of at most {MAX_NAME_LENGTH})."
        )
    return name


@dataclass(frozen=True)
class Found(Generic[H]):
    """What the queue says of a marker's task: ``state`` (:data:`QUEUED`, :data:`RUNNING` or
    :data:`OVER`), seconds since it started (None: unknown) and the handle the enqueue returns
    (a ``TaskResult``, an RQ ``Job``)."""

    state: str
    handle: H | None = None
    started_ago: float | None = None


@dataclass(frozen=True)
class UniqueRule:
    """The options of one unique task, checked when it is made."""

    until: str = "started"
    using: str = "default"
    queued_ttl: float = DEFAULT_QUEUED_TTL
    ttl: float | None = None
    timeout: float | None = DEFAULT_ENQUEUE_TIMEOUT

    def __post_init__(self) -> None:
        if self.until not in UNTIL_CHOICES:
            raise ValueError(
                f"until must be 'started' (a new task may be enqueued once a worker starts the "
                f"queued one) or 'finished' (only once its run ended), not {self.until!r}."
            )
        if not isinstance(self.using, str) or not self.using:
            raise TypeError(f"using must be a REDLOCK alias (str), not {self.using!r}.")
        for option, value, check in (
            ("queued_ttl", self.queued_ttl, check_ttl),
            ("ttl", self.ttl, check_ttl),
            ("timeout", self.timeout, check_timeout),
        ):
            try:
                if value is not None or option == "queued_ttl":
                    check(value)
            except (TypeError, ValueError) as exc:
                raise type(exc)(f"{option} of a unique task: {exc}") from None

    def lease_ttl(self) -> float:
        return locks[self.using].config.ttl if self.ttl is None else self.ttl

    def notes(self, key: str) -> Notes:
        return Notes(locks[self.using].engine_for(key))

    # -- the enqueue side ------------------------------------------------------------------
    def enqueue_once(
        self,
        key: str,
        lookup: Callable[[str], Found[H]],
        send: Callable[[], tuple[str | None, H]],
    ) -> H:
        """Send a task for ``key`` (``send()`` returns its id and handle; a None id: the task
        already ran inside the send, nothing is queued, no marker) unless the task its marker
        names holds the key (``lookup(id)`` says what the queue knows of it): then return
        that task's handle, sending nothing. Once a task is sent nothing raises: a marker
        that cannot be written is logged (the next enqueue may send another task)."""
        key = check_key(key)
        manager = locks[self.using]
        # until_commit: inside a transaction the mutex is released after the commit, so a
        # task row the backend wrote in it is visible to the next enqueue of the key.
        with manager.lock(key + MUTEX_SUFFIX, timeout=self.timeout, auto_extend=True):
            notes = self.notes(key)
            note = notes.read(key)
            if note is not None:
                found = lookup(note.id)
                if found.handle is not None and self._holds(note, found):
                    logger.info(
                        "Not enqueuing %r: task %s is %s (alias %r)",
                        key,
                        note.id,
                        found.state,
                        self.using,
                    )
                    return found.handle
            ident, handle = send()
            if ident is not None:
                self._mark_queued(notes, key, ident)
            return handle

    def _mark_queued(self, notes: Notes, key: str, ident: str) -> None:
        """Write the queued marker of a task just sent; never raises (the task is sent: a
        raise would make the caller's retry send a second one)."""
        try:
            notes.write(key, Note(QUEUED, ident), self.queued_ttl)
        except Exception as exc:
            logger.warning(
                "Unique task %s of %r sent, but its queued marker not written (alias %r): %s; "
                "an enqueue of the key meanwhile may send another task",
                ident,
                key,
                self.using,
                exc,
            )

    def _holds(self, note: Note, found: Found[Any]) -> bool:
        """Whether the marker's task still holds the key."""
        if found.state == QUEUED:
            return True
        if found.state != RUNNING or self.until != "finished":
            return False
        if note.state == RUNNING:  # its worker renews the marker: alive
            return True
        # The queue says running, the marker still says queued: the worker is starting it,
        # or died before it wrote the running marker (then nobody would free the key).
        return found.started_ago is None or found.started_ago <= self.lease_ttl() + START_SLACK

    # -- the worker side -------------------------------------------------------------------
    def started(self, key: str, ident: str) -> None:
        """A worker started task ``ident`` of ``key``: free the key (``until="started"``), or
        hold it with a marker renewed until :meth:`finished`. Never raises: a task runs even
        when its marker cannot be changed (the nodes are down; logged at WARNING)."""
        try:
            notes = self.notes(key)
            if self.until == "started":
                notes.delete(key, ident)
                return
            ttl = self.lease_ttl()
            if notes.replace(key, ident, Note(RUNNING, ident), ttl):
                _Renewal.start(notes, key, ident, ttl)
        except Exception as exc:  # the task must run whatever the marker's trouble
            logger.warning("Unique task %s of %r: marker not set at start: %s", ident, key, exc)

    def finished(self, key: str, ident: str) -> None:
        """Task ``ident`` of ``key`` ended (success or failure): free the key if it holds it.
        Never raises (the marker then expires on its own)."""
        _Renewal.stop(key, ident)
        try:
            self.notes(key).delete(key, ident)
        except Exception as exc:  # never fail a finished task over its marker
            logger.warning("Unique task %s of %r: marker not freed at end: %s", ident, key, exc)

    def requeued(self, key: str, ident: str) -> None:
        """Task ``ident`` of ``key`` failed and its queue will run it again (a retry): it
        holds the key as a queued task (``queued_ttl``), unless another task's marker is
        there. Never raises."""
        _Renewal.stop(key, ident)
        try:
            self.notes(key).replace(key, ident, Note(QUEUED, ident), self.queued_ttl)
        except Exception as exc:
            logger.warning(
                "Unique task %s of %r: marker not set for its retry: %s", ident, key, exc
            )


class _Renewal:
    """A thread renewing one running task's marker every third of its TTL."""

    _running: dict[tuple[str, str], threading.Event] = {}
    _mutex = threading.Lock()

    @classmethod
    def start(cls, notes: Notes, key: str, ident: str, ttl: float) -> None:
        stop = threading.Event()
        with cls._mutex:
            previous = cls._running.pop((key, ident), None)
            cls._running[(key, ident)] = stop
        if previous is not None:
            previous.set()
        thread = threading.Thread(
            target=cls._renew,
            args=(notes, key, ident, ttl, stop),
            name=f"redlock-unique-{key}",
            daemon=True,
        )
        start_thread(thread)

    @classmethod
    def stop(cls, key: str, ident: str) -> None:
        with cls._mutex:
            stop = cls._running.pop((key, ident), None)
        if stop is not None:
            stop.set()

    @staticmethod
    def _renew(notes: Notes, key: str, ident: str, ttl: float, stop: threading.Event) -> None:
        while not stop.wait(ttl / 3):
            try:
                if not notes.replace(key, ident, Note(RUNNING, ident), ttl):
                    logger.warning("Unique task %s of %r: marker taken by another task", ident, key)
                    return
            except (LockError, OSError) as exc:  # the next renewal may reach the nodes
                logger.warning("Unique task %s of %r: marker not renewed: %s", ident, key, exc)
