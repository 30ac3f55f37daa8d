"""``manage.py redlock run NAME -- COMMAND``: flock(1) for a cluster of servers.

Takes NAME, runs COMMAND as the job with ``REDLOCK_ALIAS``, ``REDLOCK_NAME`` and
``REDLOCK_TOKEN`` in its environment, keeps the lease alive while it runs and releases it once
no process of the job is left. The exit status is the child's (128 + N when a signal N ended
it), or:

* 75 (``EX_TEMPFAIL``): NAME is busy; ``--skip-busy`` exits 0 silently instead;
* 69 (``EX_UNAVAILABLE``): too few nodes answered to reach a quorum;
* 70 (``EX_SOFTWARE``): the lease was lost while the job ran; the whole job got SIGTERM (and
  SIGKILL ``kill_after`` seconds later if a process of it was still running);
* 126 / 127: COMMAND could not be started (not executable / not found); NAME is released at once.

Three processes run a job (docs/jobs.md, "Process trees and terminals"): the *front*
(:mod:`.front`, the process the caller started), the *holder* (this module: a fork of the front
that holds and renews the lease; a child subreaper on Linux, so that the job's processes the
keeper leaves if it dies become its own, and are killed before the lease is released) and the
*keeper* (:mod:`.keeper`: a small process that starts
COMMAND in a process group of its own and makes sure none of the job's processes outlives it).
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..exceptions import LockError, LockNotAcquired, NodesUnavailable
from ..locking.block import min_hold_left
from ..locking.lease import Lease
from ..locking.manager import LockManager
from .holder_signals import (
    ENDING_SIGNALS,
    FORWARDED_SIGNALS,
    HolderSignals,
    Interrupted,
)
from .keeper import (
    EX_NOT_EXECUTABLE,
    EX_NOT_FOUND,
    SHIELDED,
    become_subreaper,
    foreground_of,
    give_terminal,
    kill_all_descendants,
)

EX_BUSY = 75
EX_NO_QUORUM = 69
EX_LOST = 70
__all__ = [
    "EX_BUSY",
    "EX_LOST",
    "EX_NOT_EXECUTABLE",
    "EX_NOT_FOUND",
    "EX_NO_QUORUM",
    "FORWARDED_SIGNALS",
    "FrontLink",
    "Outcome",
    "RunError",
    "RunRequest",
    "ignored_signals",
    "run_locked",
]
KEEPER = Path(__file__).with_name("keeper.py")


class RunError(Exception):
    """Ends ``redlock run`` with one line on stderr and ``status``."""

    def __init__(self, message: str, status: int) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class RunRequest:
    """What ``redlock run`` was asked to do (checked by the command's parser)."""

    name: str
    command: Sequence[str]
    ttl: float | None = None
    timeout: float | None = 0.0
    skip_busy: bool = False
    kill_after: float = 10.0
    #: seconds the name stays taken after the job started, when it exits 0 (``--min-hold``)
    min_hold: float | None = None


@dataclass(frozen=True)
class Outcome:
    """How a run ended: ``redlock run``'s exit status, what happened (``outcome``: ``ran``,
    ``busy``, ``no_quorum``, ``lost``, ``not_started``, ``interrupted``, ``bad_arguments`` or
    ``error``), the job's own status if it ran, and the line for stderr (None: silent)."""

    status: int
    outcome: str
    child_status: int | None = None
    message: str | None = None

    def write_status(self, path: str) -> None:
        """``redlock run --status-file``: what happened, written atomically (rename)."""
        document = {
            "outcome": self.outcome,
            "child_status": self.child_status,
            "exit_status": self.status,
        }
        temporary = f"{path}.{os.getpid()}.tmp"
        with open(temporary, "w") as file:
            file.write(json.dumps(document) + "\n")
        os.replace(temporary, path)


def ignored_signals() -> frozenset[int]:
    """The signals a terminal or an operator may send that this process ignores (``nohup``:
    SIGHUP; a shell's background job: SIGINT and SIGQUIT). They stay ignored in the job and
    are not passed on."""
    return frozenset(s for s in SHIELDED if signal.getsignal(s) == signal.SIG_IGN)


@dataclass
class FrontLink:
    """The holder's link to the front: a socket (its end of file: the front died), the
    front's process group (which may hand the terminal to the job) and the signals that
    ``redlock run`` started with ignored."""

    sock: socket.socket
    pgid: int
    ignored: frozenset[int] = frozenset()
    gone: bool = False

    def send(self, line: str) -> None:
        if not self.gone:
            with contextlib.suppress(OSError):
                self.sock.sendall(line.encode() + b"\n")


def run_locked(manager: LockManager, request: RunRequest, front: FrontLink | None) -> Outcome:
    """Hold ``request.name`` while ``request.command`` runs (called in the holder process).

    A forwarded signal that comes before the job may run ends the run (``interrupted``, 128 + N)
    with nothing left taken: during the acquire it abandons the wait (a grant made meanwhile is
    given back), after it the lease is released. From the keeper's start on, signals are passed
    on to the job (held back until its process group exists).

    Raises ``TypeError``/``ValueError`` for a bad name, TTL or timeout."""
    ignored = front.ignored if front is not None else ignored_signals()
    # a forked holder ends right after: a signal that comes once the job is over is dropped
    # (its default action would kill the holder before it reports the outcome)
    with HolderSignals(ignored, restore=front is None) as handlers:
        lease: Lease | None = None
        try:
            lease = manager.acquire(request.name, ttl=request.ttl, timeout=request.timeout)
            supervisor = _Supervisor(lease, request, front, ignored)
            handlers.hand_over(supervisor)  # from here on, signals are the job's
        except Interrupted as exc:
            if lease is not None:
                _release(lease)
            return Outcome(128 + exc.signum, "interrupted")
        except LockNotAcquired:
            if request.skip_busy:
                return Outcome(0, "busy")
            message = f"lock {request.name!r} (alias {manager.alias!r}) is busy"
            return Outcome(EX_BUSY, "busy", None, message)
        except NodesUnavailable as exc:
            return Outcome(EX_NO_QUORUM, "no_quorum", None, f"{exc}")
        return _supervise(supervisor, lease, request, manager.alias)


def _supervise(supervisor: _Supervisor, lease: Lease, request: RunRequest, alias: str) -> Outcome:
    """Run the job under ``lease``; release it once no process of the job is left (or keep it
    ``--min-hold`` seconds)."""
    started = time.monotonic()
    status: int | None = None
    try:
        status = supervisor.run()
    except RunError as exc:
        return Outcome(exc.status, "not_started", None, str(exc))
    except Interrupted as exc:  # an ending signal came before the keeper started
        return Outcome(128 + exc.signum, "interrupted")
    finally:
        left = min_hold_left(request.min_hold, started)
        kept = status == 0 and not supervisor.lost and _kept_for(lease, left)
        still_held = kept or _release(lease)
    if supervisor.keeper_died:
        message = f"the keeper of {request.command[0]!r} died; SIGKILLed every process of the job"
        return Outcome(EX_LOST, "lost", status, message)
    if supervisor.lost or not still_held:
        message = (
            f"lost lock {request.name!r} (alias {alias!r}) while "
            f"{request.command[0]!r} ran" + ("; sent it SIGTERM" if supervisor.terminated else "")
        )
        return Outcome(EX_LOST, "lost", status, message)
    return Outcome(status, "ran", status)


def _kept_for(lease: Lease, seconds: float) -> bool:
    """``--min-hold``: leave the name taken ``seconds`` more (the lease renewed to that TTL and
    not released); False when nothing is left, or the renewal failed."""
    if not seconds:
        return False
    try:
        lease.extend(ttl=seconds)
    except LockError:  # lost, or no quorum renewed it: released (or given back) as usual
        return False
    return True


def _release(lease: Lease) -> bool:
    """Release after the job ended; False if the lease turned out lost."""
    try:
        return lease.release() or not lease.lost
    except LockError:  # no quorum answered the release: it expires on its own, not lost
        return True


class _Supervisor:
    """Runs the job through the keeper under the lease: renewals, loss, signals, stops."""

    def __init__(
        self,
        lease: Lease,
        request: RunRequest,
        front: FrontLink | None,
        ignored: frozenset[int] = frozenset(),
    ) -> None:
        self.lease = lease
        self.request = request
        self.front = front
        self.lost = False
        self.terminated = False
        self.keeper_died = False
        #: the job's process group (its first process's pid); 0 until it runs
        self.job = 0
        self.ended = False
        self.stopped = False
        self.pending: list[int] = []  # signals that came before the job's group existed
        self.keeper: subprocess.Popen[bytes] | None = None
        self.link: socket.socket | None = None
        self.ignored = ignored

    def run(self) -> int:
        """Start the job and follow it; raises :class:`Interrupted` when an ending signal
        came before the keeper started (the job never ran)."""
        for signum in self.pending:
            if signum in ENDING_SIGNALS:
                raise Interrupted(signum)
        self._start_keeper()
        self.lease.on_lost = self._on_lost
        self.lease.start_auto_extend(None)
        try:
            return self._follow()
        finally:
            self.lease.stop_auto_extend()
            if self.keeper is not None:
                self.keeper.wait()

    def _start_keeper(self) -> None:
        env = {
            **os.environ,
            "REDLOCK_ALIAS": self.lease.alias,
            "REDLOCK_NAME": self.lease.name,
            "REDLOCK_TOKEN": str(self.lease.token),
        }
        # the holder is a process of its own (a fork of the front): as a subreaper it gets the
        # job's processes if the keeper dies, and kills them before the lease is released
        become_subreaper()
        if self.front is not None:  # from now on the holder's death is a lost run, not an
            self.front.send("starting")  # interrupted one: the job may run before its pid comes
        mine, theirs = socket.socketpair()
        front_pgid = self.front.pgid if self.front is not None else 0
        ignored = ",".join(str(int(s)) for s in sorted(self.ignored)) or "-"
        argv = [
            sys.executable, "-I", "-S", str(KEEPER), str(theirs.fileno()),
            repr(self.request.kill_after), str(front_pgid), ignored, "--", *self.request.command,
        ]  # fmt: skip
        try:
            self.keeper = subprocess.Popen(argv, env=env, pass_fds=(theirs.fileno(),))
        except OSError as exc:
            mine.close()
            raise RunError(f"cannot start the job's keeper: {exc}", EX_NOT_EXECUTABLE) from exc
        finally:
            theirs.close()
        self.link = mine

    def _follow(self) -> int:
        """Read the keeper's reports until the job is over; returns its exit status."""
        assert self.link is not None
        buffered = b""
        while True:
            watched: list[Any] = [self.link]
            if self.front is not None and not self.front.gone:
                watched.append(self.front.sock)
            ready = select.select(watched, [], [])[0]
            if self.front is not None and self.front.sock in ready:
                self._front_readable()
            if self.link not in ready:
                continue
            data = self.link.recv(4096)
            if not data:
                return self._keeper_gone()
            buffered += data
            *lines, buffered = buffered.split(b"\n")
            for line in lines:
                status = self._report(line.decode())
                if status is not None:
                    return status

    def _report(self, line: str) -> int | None:
        """One line from the keeper; the job's exit status once it is over."""
        word, _, rest = line.partition(" ")
        if word == "pid":
            self.job = int(rest)
            while self.pending:
                self.signal_job(self.pending.pop(0))
            if self.lost:
                self._terminate()
            if self.front is not None:
                self.front.send(line)
        elif word == "error":
            status, _, message = rest.partition(" ")
            raise RunError(message, int(status))
        elif word == "stop":
            self.stopped = True
            if self.front is not None:
                self.front.send(line)
        elif word == "cont":
            self.stopped = False
        elif word == "exit":
            self.ended = True
            return int(rest)
        return None

    def _front_readable(self) -> None:
        """The front only ever closes its end: it died (SIGKILL), so the job must die too."""
        assert self.front is not None
        with contextlib.suppress(OSError):
            if self.front.sock.recv(512):
                return
        self.front.gone = True
        self._tell_keeper(b"K")

    def _keeper_gone(self) -> int:
        """The keeper died without reporting the job's end: kill what is left of the job, its
        group and (Linux) every process of it that was the keeper's and is now the holder's
        (a daemonised child in a session of its own), until none is left; the lease is
        renewed meanwhile and released only after."""
        self.keeper_died = True
        if self.keeper is not None:
            self.keeper.wait()  # reaped here: the sweep below reaps only the job's processes
        if self.job and not self.ended:
            with contextlib.suppress(OSError):
                os.killpg(self.job, signal.SIGKILL)
        kill_all_descendants()
        self.ended = True
        return 128 + signal.SIGKILL

    def _tell_keeper(self, command: bytes) -> None:
        if self.link is not None:
            with contextlib.suppress(OSError):
                self.link.sendall(command)

    def _on_lost(self) -> None:
        """From the renewal thread: the lease is lost, so the whole job must stop."""
        self.lost = True  # before reading self.job: _report sets job, then reads lost
        if self.job:
            self._terminate()

    def _terminate(self) -> None:
        if not self.ended:
            self.terminated = True
            self._tell_keeper(b"T")  # SIGTERM to all of it, SIGKILL after kill_after

    # -- signals (main thread) ---------------------------------------------------------------
    def signal_job(self, signum: int) -> None:
        """Pass ``signum`` on to the job's whole process group."""
        if not self.job:
            if signum not in (signal.SIGTSTP, signal.SIGCONT):
                self.pending.append(signum)
            return
        if self.ended:
            return
        with contextlib.suppress(OSError):
            os.killpg(self.job, signum)
            if self.stopped and signum in ENDING_SIGNALS:
                os.killpg(self.job, signal.SIGCONT)

    def resume(self) -> None:
        """SIGCONT (``fg``, ``bg``, ``kill -CONT``): continue the job, and give it the
        terminal if ``redlock run``'s group has it now (``fg``)."""
        if not self.job or self.ended:
            return
        front_pgid = self.front.pgid if self.front is not None else 0
        if front_pgid and foreground_of(0) == front_pgid:
            give_terminal(0, self.job)
        self.signal_job(signal.SIGCONT)
