"""Helpers for the ``redlock run`` tests: start ``python -m django redlock run`` against a
test's own nodes, wait for files, find a job's processes by a marker in their argv."""

from __future__ import annotations

import contextlib
import io
import json
import os
import select
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import pytest
from django.conf import settings

from django_redlock.locking.manager import LockManager

ROOT = Path(__file__).resolve().parent.parent.parent
#: Resets the signals an interactive shell leaves at their defaults, then execs argv: the test
#: runner may itself run with SIGINT and SIGQUIT ignored (a background job of a shell), and
#: ``redlock run`` keeps ignored signals ignored.
DEFAULTS = (
    "import os, signal, sys\n"
    "for name in ('SIGINT', 'SIGQUIT', 'SIGTERM', 'SIGHUP', 'SIGUSR1', 'SIGUSR2', 'SIGTSTP',"
    " 'SIGTTIN', 'SIGTTOU'):\n"
    "    signal.signal(getattr(signal, name), signal.SIG_DFL)\n"
)


class Wrapper:
    """Starts ``python -m django redlock run`` for one alias (its nodes from REDLOCK_JSON)."""

    def __init__(self, manager: LockManager, tmp_path: Path) -> None:
        self.alias = manager.alias
        self.tmp = tmp_path
        self.env = {
            **os.environ,
            "REDLOCK_JSON": json.dumps({manager.alias: settings.REDLOCK[manager.alias]}),
            "DJANGO_SETTINGS_MODULE": "tests.support.subprocess_settings",
            "PYTHONPATH": str(ROOT),
        }
        self.started: list[subprocess.Popen[str]] = []
        #: ``run``, or ``leader`` (a run that campaigns: docs/leaders.md)
        self.subcommand = "run"

    def argv_of(self, name: str, command: Sequence[str], *options: str) -> list[str]:
        """The argv of ``redlock run NAME --using ALIAS OPTIONS -- COMMAND``."""
        argv = [sys.executable, "-m", "django", "redlock", self.subcommand, name]
        argv += ["--using", self.alias]
        return [*argv, *options, "--", *command]

    @staticmethod
    def with_defaults(argv: Sequence[str], ignore: Sequence[str] = ()) -> list[str]:
        """``argv`` started with the usual signals at their defaults (``ignore``: these
        ignored instead, as ``nohup`` does with SIGHUP)."""
        ignoring = "".join(f"signal.signal(signal.{name}, signal.SIG_IGN)\n" for name in ignore)
        script = DEFAULTS + ignoring + "os.execvp(sys.argv[1], sys.argv[1:])"
        return [sys.executable, "-c", script, *argv]

    def start(self, name: str, script: str, *options: str) -> subprocess.Popen[str]:
        return self.start_command(name, [sys.executable, "-c", script], *options)

    def start_command(
        self, name: str, command: Sequence[str], *options: str, ignore: Sequence[str] = ()
    ) -> subprocess.Popen[str]:
        process = subprocess.Popen(
            self.with_defaults(self.argv_of(name, command, *options), ignore),
            env=self.env, cwd=ROOT, stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        self.started.append(process)
        return process

    def run(self, name: str, script: str, *options: str) -> subprocess.CompletedProcess[str]:
        return self.run_command(name, [sys.executable, "-c", script], *options)

    def run_command(
        self, name: str, command: Sequence[str], *options: str
    ) -> subprocess.CompletedProcess[str]:
        process = self.start_command(name, command, *options)
        out, err = process.communicate(timeout=60)
        return subprocess.CompletedProcess(process.args, process.returncode, out, err)

    def argv(self, *args: str) -> subprocess.CompletedProcess[str]:
        argv = [sys.executable, "-m", "django", "redlock", "run", *args]
        return subprocess.run(
            self.with_defaults(argv), env=self.env, cwd=ROOT, capture_output=True, text=True,
            timeout=60, stdin=subprocess.DEVNULL,
        )  # fmt: skip

    def manage(self, *args: str) -> subprocess.CompletedProcess[str]:
        """Any ``manage.py`` command with this alias's settings (``redlock release ...``)."""
        argv = [sys.executable, "-m", "django", *args]
        return subprocess.run(
            argv, env=self.env, cwd=ROOT, capture_output=True, text=True, timeout=60,
            stdin=subprocess.DEVNULL,
        )  # fmt: skip

    def close(self) -> None:
        for process in self.started:
            if process.poll() is None:
                process.kill()
            process.communicate(timeout=10)


def wait_for(path: Path, seconds: float = 20) -> str:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if path.exists() and path.read_text().endswith("\n"):
            return path.read_text()
        time.sleep(0.01)
    raise AssertionError(f"{path} was never written")


def exit_status_within(process: subprocess.Popen[str], seconds: float) -> int:
    """``process.wait(seconds)``; when it has not ended by then, fails with what each process
    of its tree is doing (state, kernel wait channel, pending and blocked signals per thread)
    and what it wrote on stderr, so a rare hang explains itself."""
    try:
        return process.wait(seconds)
    except subprocess.TimeoutExpired:
        tree = describe_tree(process.pid)
        process.kill()
        _, err = process.communicate(timeout=10)
        raise AssertionError(
            f"still running {seconds} s later:\n{tree}\nstderr:\n{err[-4000:]}"
        ) from None


def describe_tree(pid: int) -> str:
    """One line per thread of ``pid`` and of its descendants, from /proc."""
    lines: list[str] = []
    todo = [pid]
    while todo:
        each = todo.pop()
        lines.append(f"{each} {' '.join(argv_of_pid(each))[:160]}")
        for task in sorted(Path(f"/proc/{each}/task").glob("*")):
            with contextlib.suppress(OSError):
                fields = dict(
                    line.split(":", 1) for line in (task / "status").read_text().splitlines()
                )
                wanted = ("Name", "State", "SigPnd", "ShdPnd", "SigBlk", "SigIgn", "SigCgt")
                shown = " ".join(f"{key}={fields[key].strip()}" for key in wanted)
                lines.append(f"  task {task.name} wchan={(task / 'wchan').read_text()} {shown}")
                todo.extend(int(child) for child in (task / "children").read_text().split())
    return "\n".join(lines)


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def run_in_process(*args: str) -> tuple[int, str]:
    """``manage.py redlock run ARGS`` in this process, as the command line runs it
    (``run_from_argv``: a CommandError is a line on stderr and that exit status): the exit
    status and stderr. For argument checks that end before anything starts, without a
    Django start-up per case; a real process of the same path is test_unknown_alias_exits_2."""
    from django_redlock.management.commands.redlock import Command

    err = io.StringIO()
    with (
        contextlib.redirect_stderr(err),
        contextlib.redirect_stdout(io.StringIO()),
        pytest.raises(SystemExit) as exited,
    ):
        Command().run_from_argv(["manage.py", "redlock", "run", *args])
    code = exited.value.code
    return (code if isinstance(code, int) else 1), err.getvalue()


def free_now(manager: LockManager, name: str) -> None:
    """``name`` is free right now (one attempt): the wrapper released it when it exited (a
    lease left to expire would hold it for the alias TTL)."""
    manager.acquire(name, timeout=0).release()


def argv_of_pid(pid: int) -> list[str]:
    """The argv of a live process ([] for a zombie or a process gone)."""
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return []
    return [part.decode(errors="replace") for part in raw.split(b"\0")[:-1]]


def children_of(pid: int) -> list[int]:
    """The live children of ``pid`` (from /proc)."""
    found: list[int] = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        with contextlib.suppress(OSError):
            found.extend(int(child) for child in (task / "children").read_text().split())
    return found


def state_of(pid: int) -> str:
    """The one-letter state of ``pid`` in /proc (``""`` once it is gone)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return ""
    return stat[stat.rindex(")") + 2]


def wait_until(check: object, what: str, seconds: float = 30) -> None:
    """Poll ``check()`` until it is true (fails the test after ``seconds``)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if check():  # type: ignore[operator]
            return
        time.sleep(0.02)
    raise AssertionError(f"never happened: {what}")


def environ_has(pid: int, entry: bytes) -> bool:
    """Whether ``entry`` (``b"NAME=value"``) is in the environment ``pid`` started with."""
    try:
        return entry in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:  # gone, or a zombie
        return False


def job_processes(marker: str) -> list[int]:
    """Live processes of a job started with ``RLJOB=<marker>`` in its environment (every
    descendant inherits it; ``redlock run`` itself does not have it)."""
    entry = f"RLJOB={marker}".encode()
    return [
        int(pid)
        for pid in os.listdir("/proc")
        if pid.isdigit() and int(pid) != os.getpid() and environ_has(int(pid), entry)
    ]


def kill_job(marker: str) -> None:
    """Teardown: SIGKILL, by PID, whatever a test's job left alive."""
    for pid in job_processes(marker):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


#: Run by a session leader on a pty's slave side: make it the controlling terminal, exec argv.
TAKE_TTY = DEFAULTS + (
    "import fcntl, termios; fcntl.ioctl(0, termios.TIOCSCTTY, 0)\n"
    "os.execvp(sys.argv[1], sys.argv[1:])"
)


class Terminal:
    """A real pseudo-terminal: ``argv`` runs as the session leader with the pty as its
    controlling terminal (so its process group starts as the terminal's foreground)."""

    def __init__(self, argv: Sequence[str], env: dict[str, str]) -> None:
        master, slave = os.openpty()
        self.master = master
        self.process = subprocess.Popen(
            [sys.executable, "-c", TAKE_TTY, *argv], stdin=slave, stdout=slave, stderr=slave,
            start_new_session=True, env=env, cwd=ROOT,
        )  # fmt: skip
        os.close(slave)
        self.output = b""
        self.seen = 0

    def expect(self, text: bytes, seconds: float = 30) -> None:
        """Read until ``text`` appears after what earlier calls matched."""
        deadline = time.monotonic() + seconds
        while text not in self.output[self.seen :]:
            left = deadline - time.monotonic()
            ready = select.select([self.master], [], [], max(left, 0))[0] if left > 0 else []
            if not ready:
                raise AssertionError(f"the terminal never showed {text!r}: {self.output!r}")
            try:
                chunk = os.read(self.master, 4096)
            except OSError:  # EIO: every slave side closed
                chunk = b""
            if not chunk:
                raise AssertionError(f"the terminal closed before {text!r}: {self.output!r}")
            self.output += chunk
        self.seen = self.output.index(text, self.seen) + len(text)

    def send(self, data: bytes) -> None:
        os.write(self.master, data)

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait(10)
        os.close(self.master)
