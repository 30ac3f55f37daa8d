"""The signals of the process that holds a ``redlock run`` lease (the *holder*,
:mod:`.runner`): until the job may start, an ending signal abandons the run; from then on the
signals are the job's, passed on to its process group (or held back until it exists)."""

from __future__ import annotations

import signal
import threading
from types import FrameType
from typing import Any, Protocol

FORWARDED_SIGNALS = (
    signal.SIGTERM,
    signal.SIGINT,
    signal.SIGHUP,
    signal.SIGQUIT,
    signal.SIGUSR1,
    signal.SIGUSR2,
)
#: Forwarded signals that end a job: a stopped job is continued after them, to act on them.
ENDING_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT)


class Supervised(Protocol):
    """What the holder's signals need of the run's supervisor."""

    pending: list[int]

    def signal_job(self, signum: int) -> None: ...

    def resume(self) -> None: ...


class Interrupted(Exception):
    """A forwarded signal that ends the run before the job may run."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


class HolderSignals:
    """The holder's handlers of the forwarded signals, SIGTSTP and SIGCONT (Python handles
    signals in the main thread only: elsewhere, nothing is installed).

    Until a supervisor is set (the acquire), the first ending signal raises
    :class:`Interrupted` where the main thread is, and later ones are noted only; from then
    on they are the supervisor's: passed on to the job's group, or held back until it exists."""

    def __init__(self, ignored: frozenset[int], *, restore: bool = True) -> None:
        self.ignored = ignored
        #: False: leave the signals ignored on exit instead of restoring the handlers
        self.restore = restore
        self.supervisor: Supervised | None = None
        self.noted: list[int] = []
        self.previous: dict[int, Any] = {}

    def __enter__(self) -> HolderSignals:
        if threading.current_thread() is not threading.main_thread():
            return self
        for signum in (*FORWARDED_SIGNALS, signal.SIGTSTP):
            if signum not in self.ignored:
                self.previous[signum] = signal.signal(signum, self._forward)
        self.previous[signal.SIGCONT] = signal.signal(signal.SIGCONT, self._resume)
        return self

    def __exit__(self, *exc: object) -> None:
        for signum, handler in self.previous.items():
            signal.signal(signum, handler if self.restore else signal.SIG_IGN)

    def hand_over(self, supervisor: Supervised) -> None:
        """From now on signals are ``supervisor``'s; those noted that do not end a run
        (SIGUSR1, SIGUSR2) go to the job once it runs."""
        self.supervisor = supervisor
        supervisor.pending[:0] = [s for s in self.noted if s not in ENDING_SIGNALS]

    def _forward(self, signum: int, frame: FrameType | None) -> None:
        supervisor = self.supervisor
        if supervisor is not None:
            supervisor.signal_job(signum)
        else:
            first = not any(s in ENDING_SIGNALS for s in self.noted)
            self.noted.append(signum)
            if first and signum in ENDING_SIGNALS:
                raise Interrupted(signum)

    def _resume(self, signum: int, frame: FrameType | None) -> None:
        if self.supervisor is not None:
            self.supervisor.resume()
