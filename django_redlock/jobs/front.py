"""The front of ``redlock run``: the process its caller (a shell, cron, systemd) started.

It forks the *holder* (:func:`.runner.run_locked` in a process group of its own), then only
passes signals on to it and mirrors the job's stops: when the job stops (Ctrl-Z, SIGTSTP, a
read from the terminal in the background) the front stops itself with the same signal, so a
shell sees ``redlock run`` stopped and gives the prompt back, while the holder, which is not
stopped, keeps renewing the lease. ``fg`` (SIGCONT) continues the front, which continues the
job. If the front is SIGKILLed, the holder has the whole job killed and releases the lease.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import sys
import threading
import traceback
from types import FrameType
from typing import Any, NoReturn

from ..locking.manager import LockManager
from .keeper import foreground_of, give_terminal
from .runner import (
    EX_LOST,
    FORWARDED_SIGNALS,
    FrontLink,
    Outcome,
    RunRequest,
    ignored_signals,
    run_locked,
)

#: Stop signals the holder never acts on by itself (it is not in the terminal's groups).
_STOPS = (signal.SIGTSTP, signal.SIGTTIN, signal.SIGTTOU)


def run(manager: LockManager, request: RunRequest, *, exiting: bool = False) -> Outcome:
    """Run ``request`` under its lease in a forked holder; returns how it ended.

    ``exiting``: this process ends right after (``manage.py redlock run`` from a command
    line): a signal that comes once the holder is done is ignored instead of ending this
    process by its default action (its exit status would no longer be the outcome's).
    Otherwise the caller's handlers are restored."""
    mine, theirs = socket.socketpair()
    pgid = os.getpgrp()
    ignored = ignored_signals()
    sys.stdout.flush()
    sys.stderr.flush()
    holder = os.fork()
    if holder == 0:
        mine.close()
        _hold(manager, request, FrontLink(theirs, pgid, ignored))
    theirs.close()
    return _Front(holder, mine, pgid, ignored).follow(exiting)


def _hold(manager: LockManager, request: RunRequest, front: FrontLink) -> NoReturn:
    """The holder process: run the job, send the outcome to the front, exit."""
    outcome = Outcome(1, "error", None, "the process holding the lease failed")
    try:
        os.setpgid(0, 0)  # signals sent to the caller's group reach the job once, via the front
        for signum in _STOPS:
            signal.signal(signum, signal.SIG_IGN)
        for signum in FORWARDED_SIGNALS:  # until run_locked handles them, they end the run
            if signum not in front.ignored:
                signal.signal(signum, signal.SIG_DFL)
        outcome = run_locked(manager, request, front)
    except (TypeError, ValueError) as exc:  # a bad NAME, TTL or timeout
        outcome = Outcome(2, "bad_arguments", None, f"{exc}")
    except BaseException as exc:
        traceback.print_exc()
        outcome = Outcome(1, "error", None, f"{type(exc).__name__}: {exc}")
    finally:
        front.send("done " + json.dumps(outcome.__dict__))
        with contextlib.suppress(Exception):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(0)


class _Front:
    """Follows the holder: passes signals on, mirrors the job's stops, learns the outcome."""

    def __init__(
        self, holder: int, sock: socket.socket, pgid: int, ignored: frozenset[int]
    ) -> None:
        self.holder = holder
        self.sock = sock
        self.pgid = pgid
        self.ignored = ignored
        self.job = 0
        #: the holder took the lease and starts the job's keeper (the job may run from now)
        self.starting = False
        #: the holder is done (or gone): signals are no longer passed on (its pid may be reused)
        self.finished = False
        self.previous: dict[int, Any] = {}

    def follow(self, exiting: bool = False) -> Outcome:
        outcome: Outcome | None = None
        self._install()
        try:
            buffered = b""
            while True:
                try:
                    data = self.sock.recv(4096)
                except OSError:  # the holder's end was reset: it is gone
                    data = b""
                if not data:
                    break
                buffered += data
                *lines, buffered = buffered.split(b"\n")
                for line in lines:
                    outcome = self._line(line.decode()) or outcome
        finally:
            self.finished = True
            self._restore(ignore=exiting)
            self.sock.close()
        _, status = os.waitpid(self.holder, 0)
        if self.job and foreground_of(0) == self.job:
            give_terminal(0, self.pgid)
        if outcome is not None:
            return outcome
        if os.WIFSIGNALED(status) and not self.starting:  # a signal ended it before the job
            return Outcome(128 + os.WTERMSIG(status), "interrupted")
        how = (
            f"signal {os.WTERMSIG(status)}"
            if os.WIFSIGNALED(status)
            else f"exit status {os.WEXITSTATUS(status)}"
        )
        message = f"the process holding the lease died ({how}); its keeper stops the job"
        return Outcome(EX_LOST, "lost", None, message)

    def _line(self, line: str) -> Outcome | None:
        word, _, rest = line.partition(" ")
        if word == "starting":
            self.starting = True
        elif word == "pid":
            self.starting, self.job = True, int(rest)
        elif word == "stop":
            self._stop(int(rest))
        elif word == "done":
            return Outcome(**json.loads(rest))
        return None

    def _install(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return
        for signum in (*FORWARDED_SIGNALS, signal.SIGTSTP, signal.SIGCONT):
            if signum not in self.ignored:
                self.previous[signum] = signal.signal(signum, self._relay)

    def _restore(self, *, ignore: bool = False) -> None:
        """Put the caller's handlers back; ``ignore``: ignore those signals instead, until
        this process ends (Python's own shutdown would reset a handler of ours to the
        default action, and a late signal would end the process with it)."""
        for signum, handler in self.previous.items():
            signal.signal(signum, signal.SIG_IGN if ignore else handler)
        self.previous.clear()

    def _relay(self, signum: int, frame: FrameType | None) -> None:
        if self.finished:
            return
        with contextlib.suppress(OSError):
            os.kill(self.holder, signum)

    def _stop(self, signum: int) -> None:
        """The job stopped: stop with the same signal, as a shell expects of its job. When the
        job had the terminal (Ctrl-Z), the whole process group of ``redlock run`` stops, as the
        terminal would have stopped it (a pipeline, or an ``sh -c`` around ``redlock run``);
        otherwise this process only. A stop signal in an orphaned process group does nothing.
        The holder, in a group of its own, is not stopped."""
        if threading.current_thread() is not threading.main_thread():
            return
        if signum not in _STOPS:
            signum = signal.SIGSTOP
        had_terminal = bool(self.job) and foreground_of(0) in (self.job, self.pgid)
        previous = signal.signal(signum, signal.SIG_DFL) if signum in _STOPS else None
        try:
            os.kill(0 if had_terminal else os.getpid(), signum)
        finally:
            if previous is not None:
                signal.signal(signum, previous)
