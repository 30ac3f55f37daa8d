"""``manage.py redlock run NAME -- COMMAND``: flock(1) for a cluster of servers (SPEC 11).

Takes NAME, runs COMMAND as a child process with ``REDLOCK_ALIAS``, ``REDLOCK_NAME`` and
``REDLOCK_TOKEN`` in its environment, keeps the lease alive while it runs and releases it after
the child exits. The exit status is the child's (128 + N when a signal N ended it), or:

* 75 (``EX_TEMPFAIL``): NAME is busy; ``--skip-busy`` exits 0 silently instead;
* 69 (``EX_UNAVAILABLE``): too few nodes answered to reach a quorum;
* 70 (``EX_SOFTWARE``): the lease was lost while the child ran; the child got SIGTERM (and
  SIGKILL ``kill_after`` seconds later if it was still running);
* 126 / 127: COMMAND could not be started (not executable / not found); NAME is released at once.

SIGTERM, SIGINT, SIGHUP, SIGQUIT, SIGUSR1 and SIGUSR2 sent to ``redlock run`` are passed on to the
child, which runs in a process group of its own (so a terminal's Ctrl-C reaches it once). On Linux
the child is SIGKILLed if ``redlock run`` itself dies (parent-death signal): a job never runs on
without the lease that protects it.
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from types import FrameType
from typing import Any

from ..exceptions import LockError, LockNotAcquired, NodesUnavailable
from ..lease import Lease
from ..manager import LockManager

EX_BUSY = 75
EX_NO_QUORUM = 69
EX_LOST = 70
EX_NOT_EXECUTABLE = 126
EX_NOT_FOUND = 127
FORWARDED_SIGNALS = (
    signal.SIGTERM,
    signal.SIGINT,
    signal.SIGHUP,
    signal.SIGQUIT,
    signal.SIGUSR1,
    signal.SIGUSR2,
)
_PR_SET_PDEATHSIG = 1


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


def run_locked(manager: LockManager, request: RunRequest) -> int:
    """Hold ``request.name`` while ``request.command`` runs; returns the exit status.

    Raises :class:`RunError` for busy (75), no quorum (69), lost (70) and a command that cannot
    be started (126/127); busy with ``skip_busy`` returns 0."""
    try:
        lease = manager.acquire(request.name, ttl=request.ttl, timeout=request.timeout)
    except LockNotAcquired as exc:
        if request.skip_busy:
            return 0
        raise RunError(f"lock {request.name!r} (alias {manager.alias!r}) is busy", EX_BUSY) from exc
    except NodesUnavailable as exc:
        raise RunError(f"{exc}", EX_NO_QUORUM) from exc
    supervisor = _Supervisor(lease, request)
    try:
        status = supervisor.run()
    finally:
        still_held = _release(lease)
    if supervisor.lost or not still_held:
        raise RunError(
            f"lost lock {request.name!r} (alias {manager.alias!r}) while "
            f"{request.command[0]!r} ran" + ("; sent it SIGTERM" if supervisor.terminated else ""),
            EX_LOST,
        )
    return status


def _release(lease: Lease) -> bool:
    """Release after the child exited; False if the lease turned out lost."""
    try:
        return lease.release() or not lease.lost
    except LockError:  # no quorum answered the release: it expires on its own, not lost
        return True


class _Supervisor:
    """Runs the child under the lease: renewals, loss, forwarded signals."""

    def __init__(self, lease: Lease, request: RunRequest) -> None:
        self.lease = lease
        self.request = request
        self.lost = False
        self.terminated = False
        self.child: subprocess.Popen[bytes] | None = None
        self._mutex = threading.Lock()

    def run(self) -> int:
        child = self._start()
        self.lease.on_lost = self._on_lost
        self.lease.start_auto_extend(None)
        with _Forwarding(child):
            status = child.wait()
        self.lease.stop_auto_extend()
        return status if status >= 0 else 128 - status

    def _start(self) -> subprocess.Popen[bytes]:
        command = list(self.request.command)
        env = {
            **os.environ,
            "REDLOCK_ALIAS": self.lease.alias,
            "REDLOCK_NAME": self.lease.name,
            "REDLOCK_TOKEN": str(self.lease.token),
        }
        try:
            self.child = subprocess.Popen(
                command, env=env, process_group=0, preexec_fn=_die_with_parent()
            )
        except FileNotFoundError as exc:
            raise RunError(f"cannot run {command[0]!r}: {exc.strerror}", EX_NOT_FOUND) from exc
        except PermissionError as exc:
            raise RunError(f"cannot run {command[0]!r}: {exc.strerror}", EX_NOT_EXECUTABLE) from exc
        except OSError as exc:
            raise RunError(f"cannot run {command[0]!r}: {exc}", EX_NOT_EXECUTABLE) from exc
        return self.child

    def _on_lost(self) -> None:
        """From the renewal thread: the lease is lost, so the child must stop."""
        with self._mutex:
            self.lost = True
            child = self.child
            if child is None or child.poll() is not None:
                return
            self.terminated = True
            child.terminate()
        timer = threading.Timer(self.request.kill_after, _kill_if_running, (child,))
        timer.daemon = True
        timer.start()


def _kill_if_running(child: subprocess.Popen[bytes]) -> None:
    if child.poll() is None:
        child.kill()


class _Forwarding:
    """Pass the signals of :data:`FORWARDED_SIGNALS` on to ``child`` while it runs (Python
    handles signals in the main thread only: called from another thread, nothing is passed
    on)."""

    def __init__(self, child: subprocess.Popen[bytes]) -> None:
        self.child = child
        self.previous: dict[int, Any] = {}

    def __enter__(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return
        for signum in FORWARDED_SIGNALS:
            self.previous[signum] = signal.signal(signum, self._forward)

    def __exit__(self, *exc: object) -> None:
        for signum, handler in self.previous.items():
            signal.signal(signum, handler)

    def _forward(self, signum: int, frame: FrameType | None) -> None:
        if self.child.poll() is None:
            self.child.send_signal(signum)


def _die_with_parent() -> Callable[[], None] | None:
    """A ``preexec_fn`` that makes the kernel SIGKILL the child when this process dies
    (Linux ``PR_SET_PDEATHSIG``); None elsewhere. Resolved before the fork, so the child only
    makes one system call between fork and exec."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    parent = os.getpid()
    kill = int(signal.SIGKILL)

    def preexec() -> None:
        prctl(_PR_SET_PDEATHSIG, kill, 0, 0, 0)
        if os.getppid() != parent:  # the parent died before prctl: no signal will come
            os._exit(EX_LOST)

    return preexec
