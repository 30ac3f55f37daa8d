"""Making sure every process started from here is stopped.

Stopped by PID at interpreter exit and on SIGTERM/SIGINT (chained to the previous handlers); on
Linux the kernel also SIGKILLs them if this process dies (``PR_SET_PDEATHSIG``).
"""

from __future__ import annotations

import atexit
import ctypes
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from types import FrameType
from typing import Any, Protocol

_PR_SET_PDEATHSIG = 1


class Stoppable(Protocol):
    """What the registry needs from a node to stop it."""

    def signal_stop(self) -> None: ...
    def reap(self, grace: float | None) -> None: ...


_registry: dict[int, Stoppable] = {}
_registry_lock = threading.RLock()  # re-entrant: signal handlers run on the main thread
_owner_pid = os.getpid()
_handlers_installed = False
_previous_handlers: dict[int, Any] = {}


def register(node: Stoppable, pid: int) -> None:
    """Remember a started process until ``unregister``; installs the exit handlers."""
    with _registry_lock:
        _registry[pid] = node
    _install_handlers()


def unregister(pid: int) -> None:
    """Forget a process that has been reaped."""
    with _registry_lock:
        _registry.pop(pid, None)


def stop_all(grace: float = 2.0) -> None:
    """Stop every node this process started and has not stopped yet."""
    if os.getpid() != _owner_pid:  # a forked child must not stop its parent's nodes
        return
    with _registry_lock:
        nodes = list(_registry.values())
    for node in nodes:
        node.signal_stop()
    deadline = time.monotonic() + grace
    for node in nodes:
        node.reap(max(0.0, deadline - time.monotonic()))


def _on_signal(signum: int, frame: FrameType | None) -> None:
    stop_all()
    previous = _previous_handlers.get(signum)
    if callable(previous):
        previous(signum, frame)
    elif previous == signal.SIG_DFL or previous is None:
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)


def _install_handlers() -> None:
    global _handlers_installed
    if _handlers_installed or threading.current_thread() is not threading.main_thread():
        return
    _handlers_installed = True
    atexit.register(stop_all)
    for signum in (signal.SIGTERM, signal.SIGINT):
        previous = signal.getsignal(signum)
        if previous == signal.SIG_IGN:
            continue
        _previous_handlers[signum] = previous
        signal.signal(signum, _on_signal)


def _after_fork_in_child() -> None:
    global _owner_pid
    _owner_pid = os.getpid()
    _registry.clear()


os.register_at_fork(after_in_child=_after_fork_in_child)


def death_signal_hook() -> Callable[[], None] | None:
    """A ``preexec_fn`` that makes the kernel SIGKILL the child when its parent dies (Linux).

    The kernel ties this to the *thread* that forked: start nodes from a thread that outlives
    them (normally the main thread), or they die when it ends.
    """
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        prctl = libc.prctl
    except (OSError, AttributeError):
        return None
    parent = os.getpid()

    def hook() -> None:
        prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
        if os.getppid() != parent:  # the parent died before prctl took effect
            os.kill(os.getpid(), signal.SIGKILL)

    return hook
