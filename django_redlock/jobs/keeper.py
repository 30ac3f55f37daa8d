"""The keeper: a small process between ``redlock run`` and its job that makes sure no process of
the job outlives the lease.

Started by the process that holds the lease as ``python -I -S keeper.py FD KILL_AFTER PGID
IGNORED -- COMMAND [ARG ...]`` (standard library only: it runs without Django or site-packages).
It

* starts COMMAND in a process group of its own (the job's group), gives that group the
  terminal when ``PGID`` (the group of ``redlock run``) is the terminal's foreground, and
  makes the kernel SIGKILL COMMAND if the keeper dies (Linux);
* is a child subreaper on Linux: the job's orphans (a daemonised child: double fork and
  ``setsid``) become its children instead of init's, so it can find and stop them;
* reports on the socket ``FD``, one line each: ``pid N`` once COMMAND runs (or ``error STATUS
  MESSAGE`` when it cannot be started), ``stop SIGNAL`` / ``cont`` when COMMAND stops or
  continues, and ``exit STATUS`` once COMMAND has exited **and no process of the job is left**;
* reads commands on the same socket: ``T`` stops the whole job (SIGTERM and SIGCONT to the
  group and to every descendant, SIGKILL ``KILL_AFTER`` seconds later), ``K`` SIGKILLs it at
  once. End of file (the holder died) counts as ``K``.

When COMMAND exits, whatever it left running is stopped as by ``T`` before ``exit`` is reported,
so the lease is released only once the whole job is gone. The keeper ignores the signals a
terminal or an operator sends to ``redlock run`` (it must outlive the job); COMMAND starts with
them at their defaults, except those ``redlock run`` itself started with ignored (``IGNORED``,
comma-separated numbers or ``-``: ``nohup`` ignores SIGHUP, a shell ignores SIGINT and SIGQUIT
in background jobs), which stay ignored, as a shell would start it.
"""

from __future__ import annotations

import contextlib
import errno
import os
import select
import signal
import socket
import sys
import time
from collections.abc import Callable

#: Exit statuses of a COMMAND that cannot be started, as in shells.
EX_NOT_EXECUTABLE = 126
EX_NOT_FOUND = 127
#: Python ignores these at start-up; COMMAND gets them at their defaults (as ``subprocess``).
RESTORED = tuple(
    getattr(signal, name) for name in ("SIGPIPE", "SIGXFZ", "SIGXFSZ") if hasattr(signal, name)
)
#: Ignored by the keeper, at their defaults again in COMMAND.
SHIELDED = (
    signal.SIGTERM,
    signal.SIGINT,
    signal.SIGHUP,
    signal.SIGQUIT,
    signal.SIGUSR1,
    signal.SIGUSR2,
    signal.SIGTSTP,
    signal.SIGTTIN,
    signal.SIGTTOU,
)
_PR_SET_PDEATHSIG = 1
_PR_SET_CHILD_SUBREAPER = 36
#: How often a sweep looks again for processes of the job (new forks, reparented orphans).
SWEEP_INTERVAL = 0.05


def give_terminal(fd: int, pgid: int) -> bool:
    """Make ``pgid`` the foreground group of the terminal ``fd``; False if that failed (not our
    terminal, or the group is gone). SIGTTOU is blocked meanwhile, so a process of a background
    group may do it."""
    blocked = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTTOU})
    try:
        os.tcsetpgrp(fd, pgid)
        return True
    except OSError:
        return False
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, blocked)


def foreground_of(fd: int) -> int:
    """The foreground group of the terminal ``fd`` (0 if ``fd`` is not our terminal)."""
    try:
        return os.tcgetpgrp(fd)
    except OSError:
        return 0


def exit_status(status: int) -> int:
    """A wait status as a shell reports it: the exit code, or 128 + N for signal N."""
    if os.WIFSIGNALED(status):
        return 128 + os.WTERMSIG(status)
    return os.WEXITSTATUS(status)


def _prctl() -> Callable[..., int] | None:
    """libc's ``prctl`` (Linux), or None."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        import ctypes

        prctl: Callable[..., int] = ctypes.CDLL(None, use_errno=True).prctl
    except (ImportError, OSError, AttributeError):
        return None
    return prctl


def children_of(pid: int) -> list[int]:
    """Live children of ``pid`` (Linux; [] elsewhere or once it is gone)."""
    found: list[int] = []
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return found
    for task in tasks:
        with (
            contextlib.suppress(OSError, ValueError),
            open(f"/proc/{pid}/task/{task}/children") as listing,
        ):
            found.extend(int(child) for child in listing.read().split())
    return found


def descendants_of(pid: int) -> list[int]:
    """Every live descendant of ``pid`` (Linux; [] elsewhere)."""
    found: list[int] = []
    todo = children_of(pid)
    while todo:
        child = todo.pop()
        if child not in found:
            found.append(child)
            todo.extend(children_of(child))
    return found


def become_subreaper() -> bool:
    """Make this process a child subreaper (Linux): an orphan among its descendants becomes
    its child (or, once this process is gone, its nearest subreaper ancestor's), not init's.
    False where that is not available."""
    prctl = _prctl()
    return prctl is not None and prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0


def kill_all_descendants() -> None:
    """SIGKILL every descendant of this process and reap its children, again until it has no
    child left (a subreaper's orphans included: new forks and reparented processes are found
    by the next round)."""
    while True:
        for pid in descendants_of(os.getpid()):
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        try:
            while os.waitpid(-1, os.WNOHANG)[0]:
                pass
        except ChildProcessError:
            return
        time.sleep(SWEEP_INTERVAL)


class Keeper:
    """Runs COMMAND as the job and reports on it (see the module)."""

    def __init__(
        self,
        link: socket.socket,
        kill_after: float,
        front_pgid: int,
        ignored: frozenset[int] = frozenset(),
    ) -> None:
        self.link: socket.socket | None = link
        self.kill_after = kill_after
        self.front_pgid = front_pgid
        self.ignored = ignored
        self.pid = os.getpid()
        self.job = 0
        self.status: int | None = None
        self.sweeping: int | None = None  # the signal the sweep sends now
        self.deadline = 0.0
        self.signalled: set[int] = set()
        self.wake, wake_w = os.pipe()
        os.set_blocking(wake_w, False)
        signal.set_wakeup_fd(wake_w)
        signal.signal(signal.SIGCHLD, lambda signum, frame: None)
        for signum in SHIELDED:
            signal.signal(signum, signal.SIG_IGN)
        self.prctl = _prctl()
        become_subreaper()

    def report(self, line: str) -> None:
        if self.link is not None:
            with contextlib.suppress(OSError):  # the holder is gone: the job is killed anyway
                self.link.sendall(line.encode() + b"\n")

    def run(self, command: list[str]) -> int:
        """Start COMMAND, follow it, sweep its leftovers; returns its exit status."""
        if not self.start(command):
            return EX_NOT_EXECUTABLE
        while True:
            self._reap()
            if self.sweeping is not None:
                self._sweep()
            if self.status is not None and self._all_gone():
                self.report(f"exit {self.status}")
                return self.status
            watched: list[socket.socket | int] = [self.wake]
            if self.link is not None:
                watched.append(self.link)
            timeout = SWEEP_INTERVAL if self.sweeping is not None else None
            ready = select.select(watched, [], [], timeout)[0]
            if self.wake in ready:
                os.read(self.wake, 512)
            if self.link is not None and self.link in ready:
                self._command()

    def start(self, command: list[str]) -> bool:
        """Fork and exec COMMAND; reports ``pid`` or ``error``."""
        failed_r, failed_w = os.pipe()  # closed by a successful exec (close-on-exec)
        pid = os.fork()
        if pid == 0:
            try:
                os.close(failed_r)
                self._in_child()
                os.execvp(command[0], command)
            except BaseException as exc:
                code = getattr(exc, "errno", None) or 0
                os.write(failed_w, f"{code}:{getattr(exc, 'strerror', None) or exc}".encode())
            finally:
                os._exit(EX_NOT_EXECUTABLE)
        os.close(failed_w)
        with contextlib.suppress(OSError):  # also here: whichever of the two runs first
            os.setpgid(pid, pid)
        failure = b""
        while chunk := os.read(failed_r, 4096):
            failure += chunk
        os.close(failed_r)
        if failure:
            os.waitpid(pid, 0)
            code, _, message = failure.decode(errors="replace").partition(":")
            status = EX_NOT_FOUND if int(code or 0) == errno.ENOENT else EX_NOT_EXECUTABLE
            self.report(f"error {status} cannot run {command[0]!r}: {message}")
            return False
        self.job = pid
        self.report(f"pid {pid}")
        return True

    def _in_child(self) -> None:
        """Between fork and exec of COMMAND: its own group, the terminal, default signals."""
        os.setpgid(0, 0)
        signal.set_wakeup_fd(-1)
        for signum in (*SHIELDED, *RESTORED, signal.SIGCHLD):
            signal.signal(signum, signal.SIG_IGN if signum in self.ignored else signal.SIG_DFL)
        if self.front_pgid and foreground_of(0) == self.front_pgid:
            give_terminal(0, os.getpid())
        if self.prctl is not None:
            self.prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
            if os.getppid() != self.pid:  # the keeper died before prctl: no signal will come
                os._exit(EX_NOT_EXECUTABLE)

    def _command(self) -> None:
        assert self.link is not None
        try:
            data = self.link.recv(512)
        except OSError:
            data = b""
        if not data:  # the holder died: nobody keeps the lease alive any more
            self.link.close()
            self.link = None
        if not data or b"K" in data:
            self._begin(signal.SIGKILL)
        elif b"T" in data:
            self._begin(signal.SIGTERM)

    def _begin(self, signum: int) -> None:
        """Start (or harden) the sweep that stops every process of the job."""
        if self.sweeping in (signal.SIGKILL, signum):
            return
        self.sweeping = signum
        self.signalled.clear()
        self.deadline = time.monotonic() + self.kill_after
        self._sweep()

    def _sweep(self) -> None:
        """Signal the job's group and each descendant not signalled yet (new forks, orphans
        that reparented to the keeper); SIGKILL once ``kill_after`` has passed."""
        if self.sweeping == signal.SIGTERM and time.monotonic() >= self.deadline:
            self.sweeping = signal.SIGKILL
            self.signalled.clear()
        signum = self.sweeping
        assert signum is not None
        for pid in [-self.job, *descendants_of(self.pid)]:
            if pid in self.signalled:
                continue
            self.signalled.add(pid)
            for each in (signum, signal.SIGCONT) if signum != signal.SIGKILL else (signum,):
                with contextlib.suppress(OSError):  # a stopped process must run to act on it
                    os.kill(pid, each)  # -job: the whole group

    def _reap(self) -> None:
        """Collect COMMAND's stops, continues and exit, and every exited orphan."""
        while self.status is None:
            try:
                pid, status = os.waitpid(self.job, os.WNOHANG | os.WUNTRACED | os.WCONTINUED)
            except ChildProcessError:
                break
            if not pid:
                break
            if os.WIFSTOPPED(status):
                self.report(f"stop {os.WSTOPSIG(status)}")
            elif os.WIFCONTINUED(status):
                self.report("cont")
            else:
                self._job_ended(status)
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if not pid:
                return
            if pid == self.job and self.status is None:
                self._job_ended(status)

    def _job_ended(self, status: int) -> None:
        self.status = exit_status(status)
        if self.front_pgid and foreground_of(0) == self.job:
            give_terminal(0, self.front_pgid)
        self._begin(signal.SIGTERM)  # whatever it left running

    @staticmethod
    def _all_gone() -> bool:
        """True once the keeper has no child left: every process of the job was reaped."""
        try:
            os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return True
        return False  # still children (any that ended now is reaped: the next round looks)


def main(argv: list[str]) -> int:
    """``FD KILL_AFTER PGID IGNORED -- COMMAND [ARG ...]``."""
    if len(argv) < 6 or argv[4] != "--":
        raise SystemExit("usage: keeper.py FD KILL_AFTER PGID IGNORED -- COMMAND [ARG ...]")
    fd, kill_after, front_pgid = int(argv[0]), float(argv[1]), int(argv[2])
    ignored = frozenset(int(n) for n in argv[3].split(",") if n.isdigit())
    os.set_inheritable(fd, False)  # COMMAND must not hold the holder's link open
    link = socket.socket(fileno=fd)
    return Keeper(link, kill_after, front_pgid, ignored).run(argv[5:])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
