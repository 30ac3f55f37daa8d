"""Background threads that a signal handler raising in the caller cannot break.

CPython's ``Thread.start()`` is not safe against an exception raised by a signal handler in
the main thread (Ctrl-C, Celery's soft time limit, a ``SIGALRM`` timeout decorator): raised
after the new thread exists but before ``start()`` returns, it makes that thread die with a
``KeyError`` before it runs anything (its caller still believes it runs: a reconnect that never
happens, a lease that is never renewed), and raised inside ``start()``'s wait for the thread it
can break the wait's condition (``RuntimeError: release unlocked lock``).

Python runs signal handlers only in the main thread. So a thread other than the main one
starts its threads itself, and the main thread hands each start to this process's starter
thread with one queue put, which no such exception can split: a start handed over is a start
made, soon after. The starter is launched with the interpreter's low-level thread call, which
is one step as well. Code that starts a thread and records that it did must do both in the
job it hands over (:func:`call_soon`), so the record never outlives a start that was lost.
"""

from __future__ import annotations

import _thread
import logging
import os
import queue
import sys
import threading
from collections.abc import Callable

logger = logging.getLogger("django_redlock")

_jobs: queue.SimpleQueue[Callable[[], None]] = queue.SimpleQueue()
#: a starter serves ``_jobs`` (set by that starter), and the main thread launched one (set
#: once the launch returned); both cleared in a child process after a fork
_serving = False
_launched = False
_mutex = threading.Lock()


def call_soon(job: Callable[[], None]) -> None:
    """Run ``job`` (short; it may start threads) now, or, in the main thread, in the starter
    thread soon after: an exception raised meanwhile by a signal handler leaves it either not
    handed over at all or handed over whole."""
    if threading.get_ident() != threading.main_thread().ident:
        job()
        return
    if not (_serving or _launched):
        _launch()
    _jobs.put(job)


def start_thread(thread: threading.Thread) -> None:
    """``thread.start()``, made by the starter when called in the main thread: returns once the
    thread runs; when a signal handler's exception ends the wait, the thread starts soon."""
    if sys.is_finalizing():  # the interpreter exits: a start handed over would never be made
        raise RuntimeError("can't start new thread at interpreter shutdown")
    if threading.get_ident() != threading.main_thread().ident or _holds_thread_registry():
        thread.start()
        return
    started: queue.SimpleQueue[BaseException | None] = queue.SimpleQueue()

    def start() -> None:
        try:
            thread.start()
        except BaseException as exc:  # cannot start new thread: the caller raises it
            started.put(exc)
        else:
            started.put(None)

    call_soon(start)
    failure = started.get()  # a lock wait: a signal handler may raise in it, harmlessly
    if failure is not None:
        raise failure


def _holds_thread_registry() -> bool:
    """Whether this thread holds :mod:`threading`'s registry of threads (a reentrant lock):
    a finalizer the garbage collector ran inside ``threading.enumerate()``. A start handed to
    the starter would wait for that lock while this thread waits for the start; this thread
    can take it again and start the thread itself."""
    registry = getattr(threading, "_active_limbo_lock", None)
    owned = getattr(registry, "_is_owned", None)
    return bool(owned is not None and owned())


def _launch() -> None:
    global _launched
    _thread.start_new_thread(_serve, ())
    _launched = True  # an exception just before this at worst launches a second, which ends


def _serve() -> None:
    global _serving
    with _mutex:
        if _serving:
            return
        _serving = True
    threading.current_thread().name = "redlock-starter"
    while True:
        job = _jobs.get()
        try:
            job()
        except Exception:  # a thread that could not start: its caller's record says so
            logger.exception("A background job of django-redlock failed")


def _forked() -> None:
    global _jobs, _mutex, _serving, _launched
    # the parent's starter serves its own queue; this process launches one when it needs it
    _jobs, _mutex, _serving, _launched = queue.SimpleQueue(), threading.Lock(), False, False


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forked)
