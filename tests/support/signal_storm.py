"""A signal storm: ``SIGALRM`` at a random moment of each call, its handler raising
:class:`Interrupted` (as Ctrl-C, Celery's ``SoftTimeLimitExceeded`` or a timeout decorator
would) only while the main thread runs the library's code, so every interrupt lands inside
the call under test, never in the test's own bookkeeping. A :class:`Hail` raises every few
microseconds wherever the main thread is, for calls too short for one interrupt to land in."""

from __future__ import annotations

import gc
import random
import signal
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import FrameType
from typing import TypeVar

T = TypeVar("T")

#: A frame of the library's own code (not its test helpers).
_LIBRARY = "/django_redlock/"


class Interrupted(Exception):
    """Raised by the storm's signal handler inside the call under test."""


def _finalizing(frame: FrameType) -> bool:
    """True for a frame Python runs on the side, whose exceptions it ignores: a finalizer
    (``__del__``), a garbage-collector callback, a weak reference's callback."""
    code = frame.f_code
    return (
        code.co_name == "__del__"
        or code.co_filename.endswith(("/weakref.py", "/_weakrefset.py"))
        or any(getattr(callback, "__code__", None) is code for callback in gc.callbacks)
    )


#: Where the interrupt may land: the library's own code, and what it calls that a signal can
#: interrupt (sockets, polls, locks, redis-py's connect). Elsewhere (a garbage-collector or
#: weak reference callback, a finalizer, a dataclass's ``__init__``) the handler waits.
_RAISE_IN = (
    "/django_redlock/",
    "/socket.py",
    "/selectors.py",
    "/ssl.py",
    "/threading.py",
    "/redis/",
)


def _entering_exit(frame: FrameType) -> bool:
    """True at the very first instruction of a context manager's ``__exit__``, before any of
    its code ran: the one window Python gives no code a way to close (CPython runs signal
    handlers as a function starts; PEP 419). docs/algorithm.md says so."""
    return frame.f_code.co_name in ("__exit__", "__aexit__") and frame.f_lasti == 0


def _inside_library(frame: FrameType | None) -> bool:
    """True when the signal arrived in the call under test: the innermost frame is one of
    :data:`_RAISE_IN`, and the stack reaches the library's code without passing through
    something Python runs on the side (see :func:`_finalizing`), whose exceptions it ignores."""
    if frame is None or not any(part in frame.f_code.co_filename for part in _RAISE_IN):
        return False
    if _entering_exit(frame):
        return False
    while frame is not None:
        if _finalizing(frame):
            return False
        if _LIBRARY in frame.f_code.co_filename:
            return True
        frame = frame.f_back
    return False


def _stack_of(frame: FrameType | None) -> list[str]:
    """``file:function:line`` of each of the library's frames from ``frame`` outwards."""
    found = []
    while frame is not None:
        code = frame.f_code
        if _LIBRARY in code.co_filename:
            found.append(f"{code.co_filename.rsplit('/', 1)[-1]}:{code.co_name}:{frame.f_lineno}")
        frame = frame.f_back
    return found


class Storm:
    """Counts what happened to the calls run through :meth:`call`."""

    def __init__(self, seed: int) -> None:
        self.random = random.Random(seed)
        self.armed = False
        self.interrupted = 0
        self.completed = 0
        #: where the signals arrived: the innermost frame's function (the library's, or not)
        self.landed: Counter[str] = Counter()
        #: where the last interrupt was raised: the library's frames, innermost first
        self.last: list[str] = []

    def _handler(self, signum: int, frame: FrameType | None) -> None:
        if frame is not None:
            self.landed[
                f"{frame.f_code.co_filename.rsplit('/', 1)[-1]}:{frame.f_code.co_name}"
            ] += 1
        if self.armed and _inside_library(frame):
            self.armed = False
            self.last = _stack_of(frame)
            raise Interrupted
        if self.armed:  # not inside the call yet: try again soon
            signal.setitimer(signal.ITIMER_REAL, 0.0005)

    def call(self, func: Callable[[], T], at: float) -> T | None:
        """``func()`` with an interrupt due ``at`` seconds in (or as soon after as the call
        runs the library's code); its result, or None when the interrupt landed."""
        self.armed = True
        signal.setitimer(signal.ITIMER_REAL, max(at, 0.0001))
        try:
            result = func()
        except Interrupted:
            self.interrupted += 1
            return None
        finally:
            self.armed = False
            signal.setitimer(signal.ITIMER_REAL, 0)
        self.completed += 1
        return result


def _stop_timer() -> None:
    """Stop the ``SIGALRM`` timer and let a signal that came before it stopped reach the
    handler still installed (disarmed, it does nothing). CPython runs a due handler at a
    function call or a loop's jump, not between two C calls: without this, one that came just
    before ``setitimer`` returned ran after ``signal.signal`` put the previous handler back,
    which is pytest-timeout's under the suite (a test failed "Timeout" 2 s into its 120)."""
    signal.setitimer(signal.ITIMER_REAL, 0)
    _handlers_ran()


def _handlers_ran() -> None:
    for _ in range(2):  # a backward jump: due handlers run here
        pass


@contextmanager
def storm(seed: int = 0) -> Iterator[Storm]:
    """A :class:`Storm` whose ``SIGALRM`` handler is installed (main thread only)."""
    made = Storm(seed)
    previous = signal.signal(signal.SIGALRM, made._handler)
    try:
        yield made
    finally:
        made.armed = False
        _stop_timer()
        signal.signal(signal.SIGALRM, previous)


class Hail:
    """``SIGALRM`` every ``interval`` seconds for ``seconds``, its handler raising
    :class:`Interrupted` wherever the main thread is while armed (the library's code,
    ``threading``, the caller's own): for calls too short for a :class:`Storm` to land in."""

    def __init__(self, interval: float, seconds: float) -> None:
        self.interval, self.seconds = interval, seconds
        self.armed = False
        self.interrupted = 0

    def _handler(self, signum: int, frame: FrameType | None) -> None:
        if self.armed:
            self.armed = False
            raise Interrupted

    def run(self, step: Callable[[], object]) -> int:
        """``step()`` over and over, armed; returns how many calls returned."""
        previous = signal.signal(signal.SIGALRM, self._handler)
        signal.setitimer(signal.ITIMER_REAL, self.interval, self.interval)
        returned = 0
        deadline = time.monotonic() + self.seconds
        try:
            while time.monotonic() < deadline:
                try:
                    self.armed = True
                    step()
                    self.armed = False
                    returned += 1
                except Interrupted:
                    self.interrupted += 1
        finally:
            self.armed = False
            _stop_timer()
            signal.signal(signal.SIGALRM, previous)
        return returned
