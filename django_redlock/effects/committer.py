"""A daemon thread, one per process, that commits calls on connections of its own.

A begin inside the caller's transaction must be committed whatever that transaction does later;
it runs here instead, on this thread's connection, which is closed after each call: a
connection kept open would hold the database (a test runner could not drop its test
database). A forked child starts its own thread on first use.
"""

from __future__ import annotations

import os
import queue
import threading
from collections.abc import Callable
from typing import Any, TypeVar

from django.db import connections

from ..engine import start_thread

T = TypeVar("T")


class _Job:
    __slots__ = ("call", "done", "error", "value")

    def __init__(self, call: Callable[[], Any]) -> None:
        self.call = call
        self.done = threading.Event()
        self.value: Any = None
        self.error: BaseException | None = None


class _Committer:
    def __init__(self) -> None:
        self.pid = os.getpid()
        self.jobs: queue.SimpleQueue[_Job] = queue.SimpleQueue()
        thread = threading.Thread(target=self._serve, name="redlock-effect-committer", daemon=True)
        start_thread(thread)

    def _serve(self) -> None:
        while True:
            job = self.jobs.get()
            try:
                job.value = job.call()
            except BaseException as exc:  # handed to the caller
                job.error = exc
            finally:
                connections.close_all()
                job.done.set()


_current: _Committer | None = None
_starting = threading.Lock()


def run(call: Callable[[], T]) -> T:
    """Run ``call`` on the committer thread (started on first use, and again in a forked
    child) and return what it returned, or raise what it raised."""
    global _current
    committer = _current
    if committer is None or committer.pid != os.getpid():
        with _starting:
            committer = _current
            if committer is None or committer.pid != os.getpid():
                committer = _current = _Committer()
    job = _Job(call)
    committer.jobs.put(job)
    job.done.wait()
    if job.error is not None:
        raise job.error
    value: T = job.value
    return value
