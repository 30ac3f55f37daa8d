"""``redlock run`` under real process trees and real terminals.

A job's whole process tree (a ``sh -c`` wrapper, a shell script, ``make``, a job that
daemonises a child) ends with every forwarded signal, a lost lease, ``redlock release`` and a
SIGKILLed ``redlock run``, before the name is free again. On a terminal the job gets the
terminal (prompts, Ctrl-C) and Ctrl-Z stops it with its lease kept and renewed.

A job's processes are found by ``RLJOB=<marker>`` in their environment (set by ``env`` in the
job's command, so ``redlock run`` itself does not carry it), and only those are killed, by PID,
after the test.
"""

from __future__ import annotations

import os
import shlex
import shutil
import signal
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from django_redlock import inspection
from django_redlock.jobs.runner import KEEPER
from django_redlock.locking.manager import LockManager

from .run_support import (
    Terminal,
    Wrapper,
    alive,
    argv_of_pid,
    children_of,
    free_now,
    job_processes,
    kill_job,
    state_of,
    wait_for,
    wait_until,
)

Alias = Callable[..., LockManager]
PY = sys.executable
SLEEP = "import time; time.sleep(120)"

#: A job that daemonises a child (double fork, new session) and then sleeps itself.
DAEMON = f"""
import os, sys
sleeper = [sys.executable, "-c", {SLEEP!r}]
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        os.execv(sys.executable, sleeper)
    os._exit(0)
os.wait()
os.execv(sys.executable, sleeper)
"""

#: A job whose child starts a session of its own (``setsid``, no double fork) and sleeps, and
#: which then sleeps itself: the child leaves the job's process group but stays its child.
SESSION = f"""
import os, sys
sleeper = [sys.executable, "-c", {SLEEP!r}]
if os.fork() == 0:
    os.setsid()
    os.execv(sys.executable, sleeper)
os.execv(sys.executable, sleeper)
"""

#: Ticks into ``progress`` until ``finish`` exists; writes its pid and REDLOCK_TOKEN first.
TICKER = """
import os, sys, time
here = sys.argv[1]
open(here + "/token", "w").write(os.environ["REDLOCK_TOKEN"] + chr(10))
open(here + "/pid", "w").write(str(os.getpid()) + chr(10))
while not os.path.exists(here + "/finish"):
    with open(here + "/progress", "a") as progress:
        progress.write(".")
    time.sleep(0.05)
"""

#: The second run's job: counts the first job's processes still alive when it starts.
COUNT_LEFT = """
import os, sys
entry = ("RLJOB=" + sys.argv[1]).encode()
left = 0
for pid in filter(str.isdigit, os.listdir("/proc")):
    try:
        left += entry in open(f"/proc/{pid}/environ", "rb").read().split(b"\\0")
    except OSError:
        pass
open(sys.argv[2], "w").write(str(left) + chr(10))
"""


@pytest.fixture
def marker() -> Iterator[str]:
    made = f"rljob-{uuid.uuid4().hex[:12]}"
    yield made
    kill_job(made)


@pytest.fixture
def runner(
    redis_node_factory: Any, redlock_alias: Alias, tmp_path: Path
) -> Iterator[tuple[Wrapper, LockManager]]:
    manager = redlock_alias(redis_node_factory(1))
    made = Wrapper(manager, tmp_path)
    yield made, manager
    made.close()


def job_command(kind: str, marker: str, tmp_path: Path) -> tuple[list[str], int]:
    """A job of ``kind`` whose real work is a Python sleeper below a wrapper, and how many
    sleepers it starts."""
    tagged = ["env", f"RLJOB={marker}"]
    sleeper = f"{PY} -c {shlex.quote(SLEEP)}"
    if kind == "sh-c":
        return [*tagged, "sh", "-c", f"{sleeper}; echo finished"], 1
    if kind == "script":
        script = tmp_path / "job.sh"
        script.write_text(f"#!/bin/sh\n{sleeper}\necho finished\n")
        script.chmod(0o755)
        return [*tagged, str(script)], 1
    if kind == "make":
        if shutil.which("make") is None:
            pytest.skip("make is not installed")
        makefile = tmp_path / "Makefile"
        makefile.write_text(f"all:\n\t{sleeper}\n\techo finished\n")
        return [*tagged, "make", "-s", "-f", str(makefile)], 1
    if kind == "session":
        script = tmp_path / "session.py"
        script.write_text(SESSION)
        return [*tagged, PY, str(script)], 2
    assert kind == "daemon"
    script = tmp_path / "daemon.py"
    script.write_text(DAEMON)
    return [*tagged, PY, str(script)], 2


def sleepers(marker: str) -> list[int]:
    return [pid for pid in job_processes(marker) if argv_of_pid(pid)[:2] == [PY, "-c"]]


def start_job(run: Wrapper, name: str, kind: str, marker: str, *options: str) -> Any:
    command, count = job_command(kind, marker, run.tmp)
    process = run.start_command(name, command, *options)
    wait_until(lambda: len(sleepers(marker)) >= count, f"{count} sleeper(s) of {kind}")
    return process


@pytest.mark.parametrize(
    ("kind", "signum"),
    [
        ("sh-c", signal.SIGTERM),
        ("script", signal.SIGTERM),
        ("make", signal.SIGINT),  # make passes SIGTERM on to its children itself, not SIGINT
        ("daemon", signal.SIGTERM),
        ("script", signal.SIGINT),
        ("script", signal.SIGHUP),
        ("script", signal.SIGUSR1),
        ("script", signal.SIGUSR2),
    ],
)
def test_a_forwarded_signal_ends_the_whole_job(
    runner: tuple[Wrapper, LockManager], marker: str, kind: str, signum: int
) -> None:
    """The signal reaches the job's whole process group (a wrapper's grandchildren, make's
    recipe), a daemonised child is stopped too, and ``redlock run`` exits only after every
    process of the job is gone, so the name is never free while one of them runs."""
    run, manager = runner
    process = start_job(run, "tree", kind, marker)
    process.send_signal(signum)
    process.communicate(timeout=60)
    assert process.returncode != 0
    assert job_processes(marker) == [], "a process of the job outlived redlock run"
    free_now(manager, "tree")


@pytest.mark.parametrize(("kind", "how"), [("script", "api"), ("daemon", "api"), ("sh-c", "cli")])
def test_a_lost_lease_ends_the_whole_job(
    runner: tuple[Wrapper, LockManager], marker: str, kind: str, how: str
) -> None:
    """A force-release (from the API, or ``redlock release NAME``) makes ``redlock run``
    SIGTERM the whole job: it exits 70 once no process of the job is left."""
    run, manager = runner
    process = start_job(run, "lost", kind, marker, "--ttl", "1.5")
    if how == "api":
        assert manager.force_release("lost") > 0
    else:
        released = run.manage("redlock", "release", "lost", "--using", run.alias)
        assert released.returncode == 0, released.stderr
    _, err = process.communicate(timeout=60)
    assert process.returncode == 70, err
    assert "lost lock 'lost'" in err
    assert job_processes(marker) == [], "a process of the job outlived the lost lease"


def test_a_job_that_ignores_sigterm_is_killed_as_a_group_after_kill_after(
    runner: tuple[Wrapper, LockManager], marker: str, tmp_path: Path
) -> None:
    """After a lost lease a job whose shell and worker ignore SIGTERM is SIGKILLed, all of it,
    ``--kill-after`` seconds later."""
    run, manager = runner
    stubborn = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(120)"
    command = [
        "env", f"RLJOB={marker}", "sh", "-c",
        f"trap '' TERM; {PY} -c {shlex.quote(stubborn)}; echo finished",
    ]  # fmt: skip
    process = run.start_command("stubborn", command, "--ttl", "1.5", "--kill-after", "0.5")
    wait_until(lambda: sleepers(marker), "the stubborn sleeper")
    manager.force_release("stubborn")
    process.communicate(timeout=60)
    assert process.returncode == 70
    assert job_processes(marker) == []


@pytest.mark.parametrize(
    ("kind", "killed"),
    [
        ("script", "run"),
        ("daemon", "run"),
        ("script", "run+holder"),
        ("script", "holder"),
        ("daemon", "keeper"),
        ("session", "keeper"),
    ],
)
def test_redlock_run_sigkilled_takes_the_whole_job_with_it(
    runner: tuple[Wrapper, LockManager], marker: str, kind: str, killed: str, tmp_path: Path
) -> None:
    """SIGKILL ``redlock run``, or the process of it that holds the lease, or both (as
    ``pkill -9 -f 'redlock run'`` would), or only the keeper: no process of the job survives
    (a daemonised child, or a child in a session of its own, included), and a second
    ``redlock run`` of the name (waiting for it) starts only once none of them is left. With
    only the holder or only the keeper killed, ``redlock run`` exits 70."""
    run, _ = runner
    process = start_job(run, "killed", kind, marker, "--ttl", "2")
    same = [pid for pid in children_of(process.pid) if argv_of_pid(pid) == argv_of_pid(process.pid)]
    if killed not in ("holder", "keeper"):
        process.kill()
    if killed != "run":
        assert len(same) == 1, "no holder process found"
        if killed == "keeper":
            keepers = [pid for pid in children_of(same[0]) if str(KEEPER) in argv_of_pid(pid)]
            assert len(keepers) == 1, "no keeper process found"
            os.kill(keepers[0], signal.SIGKILL)
        else:
            os.kill(same[0], signal.SIGKILL)
    _, err = process.communicate(timeout=30)
    if killed == "holder":
        assert process.returncode == 70 and "holding the lease died" in err, err
    if killed == "keeper":
        assert process.returncode == 70 and "keeper" in err, err
        assert job_processes(marker) == [], "a process of the job outlived redlock run"
    counted = tmp_path / "left"
    second = run.run_command(
        "killed", [PY, "-c", COUNT_LEFT, marker, str(counted)], "--timeout", "60"
    )
    assert second.returncode == 0, second.stderr
    assert wait_for(counted).strip() == "0", "the second run started beside the first job"
    wait_until(lambda: not job_processes(marker), "the first job's processes are gone")


# -- terminals ---------------------------------------------------------------------------------

PROMPT = (
    "import sys; answer = input('continue? '); print('got', answer);"
    "sys.exit(0 if answer == 'yes' else 1)"
)


def in_shell(run: Wrapper, name: str, command: list[str], *options: str) -> list[str]:
    """A non-interactive ``sh`` on the terminal runs ``redlock run``, prints its status, then
    reads the terminal itself (which works only if the terminal was given back to it)."""
    line = shlex.join(run.argv_of(name, command, *options))
    return ["sh", "-c", f'{line}; echo "rc=$?"; printf "after? "; read a; echo "answer=$a"']


@pytest.fixture
def terminals() -> Iterator[list[Terminal]]:
    made: list[Terminal] = []
    yield made
    for terminal in made:
        terminal.close()


def test_a_job_prompting_on_the_terminal_gets_its_answer(
    runner: tuple[Wrapper, LockManager], terminals: list[Terminal]
) -> None:
    """With stdin a terminal, the job is the terminal's foreground group: ``input()`` gets
    what is typed, and afterwards the terminal is given back to the caller."""
    run, manager = runner
    terminal = Terminal(in_shell(run, "tty", [PY, "-c", PROMPT]), run.env)
    terminals.append(terminal)
    terminal.expect(b"continue? ")
    terminal.send(b"yes\n")
    terminal.expect(b"got yes")
    terminal.expect(b"rc=0")
    terminal.expect(b"after? ")
    terminal.send(b"ok\n")
    terminal.expect(b"answer=ok")
    assert terminal.process.wait(30) == 0
    free_now(manager, "tty")


def test_ctrl_c_on_the_terminal_ends_the_job_with_130(
    runner: tuple[Wrapper, LockManager], terminals: list[Terminal]
) -> None:
    """Ctrl-C typed while the job waits for input ends the job (SIGINT from the terminal):
    ``redlock run`` exits 130 and the caller gets the terminal back. (The job reading is
    ``head``, whose SIGINT is at its default: a Python ``input()`` can miss a SIGINT that comes
    between printing its prompt and reading, a race of its own.)"""
    run, manager = runner
    job = ["sh", "-c", 'printf "continue? "; exec head -n 1']
    terminal = Terminal(in_shell(run, "ctrlc", job), run.env)
    terminals.append(terminal)
    terminal.expect(b"continue? ")
    terminal.send(b"\x03")
    terminal.expect(b"rc=130")
    terminal.expect(b"after? ")
    terminal.send(b"ok\n")
    terminal.expect(b"answer=ok")
    assert terminal.process.wait(30) == 0
    free_now(manager, "ctrlc")


def stays_held_while_stopped(manager: LockManager, name: str, ttl: float, job: int) -> int:
    """Over more than two TTLs: the job stays stopped, makes no progress, and the name stays
    held with a positive PTTL (renewed); returns the held lease's token."""
    token = None
    started = time.monotonic()
    while time.monotonic() - started < 2.5 * ttl:
        assert state_of(job) == "T", "the job ran on while stopped"
        info, _ = inspection.get_lock(manager.alias, name)
        assert info is not None and info.ttl_ms > 0, "the lease expired while the job was stopped"
        assert token in (None, info.token)
        token = info.token
        time.sleep(0.1)
    assert token is not None
    return token


def test_ctrl_z_stops_the_job_with_its_lease_kept_and_fg_resumes_it(
    runner: tuple[Wrapper, LockManager], terminals: list[Terminal], tmp_path: Path
) -> None:
    """In an interactive bash, Ctrl-Z stops the job (bash reports it stopped); its lease stays
    held and renewed over more than two TTLs, a second run is busy (75); ``fg`` resumes it
    under the same lease, and it finishes with status 0."""
    run, manager = runner
    terminal = Terminal(["bash", "--norc", "--noprofile", "--noediting", "-i"], run.env)
    terminals.append(terminal)
    line = shlex.join(run.argv_of("tstp", [PY, "-c", TICKER, str(tmp_path)], "--ttl", "1"))
    terminal.send(line.encode() + b"\n")
    job = int(wait_for(tmp_path / "pid"))
    wait_until(lambda: (tmp_path / "progress").exists(), "the job's first tick")
    terminal.send(b"\x1a")
    terminal.expect(b"Stopped")
    wait_until(lambda: state_of(job) == "T", "the job stopped")
    ticks = (tmp_path / "progress").read_text()
    token = stays_held_while_stopped(manager, "tstp", 1.0, job)
    assert (tmp_path / "progress").read_text() == ticks
    assert token == int(wait_for(tmp_path / "token"))
    assert run.run("tstp", "print('ran')").returncode == 75
    (tmp_path / "finish").touch()
    terminal.send(b"fg\n")
    wait_until(lambda: not alive(job), "the resumed job finished")
    terminal.send(b'echo "rc=$?"\n')
    terminal.expect(b"rc=0")
    free_now(manager, "tstp")
    terminal.send(b"exit\n")
    terminal.process.wait(30)


def test_sigtstp_to_redlock_run_stops_the_job_with_its_lease_kept(
    runner: tuple[Wrapper, LockManager], tmp_path: Path
) -> None:
    """Without a terminal, SIGTSTP to ``redlock run`` stops the job, whose lease stays held and
    renewed (a second run is busy); SIGCONT resumes it under the same lease, exit 0."""
    run, manager = runner
    process = run.start_command("tstp", [PY, "-c", TICKER, str(tmp_path)], "--ttl", "1")
    job = int(wait_for(tmp_path / "pid"))
    wait_until(lambda: (tmp_path / "progress").exists(), "the job's first tick")
    process.send_signal(signal.SIGTSTP)
    wait_until(lambda: state_of(job) == "T", "the job stopped")
    ticks = (tmp_path / "progress").read_text()
    token = stays_held_while_stopped(manager, "tstp", 1.0, job)
    assert (tmp_path / "progress").read_text() == ticks
    assert token == int(wait_for(tmp_path / "token"))
    assert run.run("tstp", "print('ran')").returncode == 75
    (tmp_path / "finish").touch()
    process.send_signal(signal.SIGCONT)
    _, err = process.communicate(timeout=60)
    assert process.returncode == 0, err
    free_now(manager, "tstp")


def test_a_stopped_job_whose_lease_is_lost_never_runs_again(
    runner: tuple[Wrapper, LockManager], tmp_path: Path
) -> None:
    """A lease lost while the job is stopped (nobody continues it): the job gets SIGTERM and
    SIGCONT, so it ends without running another step; ``redlock run`` exits 70."""
    run, manager = runner
    process = run.start_command("stopped-lost", [PY, "-c", TICKER, str(tmp_path)], "--ttl", "1")
    job = int(wait_for(tmp_path / "pid"))
    wait_until(lambda: (tmp_path / "progress").exists(), "the job's first tick")
    process.send_signal(signal.SIGTSTP)
    wait_until(lambda: state_of(job) == "T", "the job stopped")
    ticks = (tmp_path / "progress").read_text()
    assert manager.force_release("stopped-lost") > 0
    wait_until(lambda: not alive(job), "the stopped job ended")
    assert (tmp_path / "progress").read_text() == ticks, "the job ran on without its lease"
    process.send_signal(signal.SIGCONT)  # redlock run itself may have stopped with the job
    _, err = process.communicate(timeout=60)
    assert process.returncode == 70, err


def test_the_job_starts_with_signals_at_their_defaults(
    runner: tuple[Wrapper, LockManager],
) -> None:
    """Nothing of ``redlock run``'s own machinery leaks into the job: it starts with no
    signal ignored (Python ignores SIGPIPE and SIGXFSZ, the keeper ignores the ones it must
    survive)."""
    run, _ = runner
    done = run.run_command("dispositions", ["sh", "-c", "exec grep SigIgn /proc/self/status"])
    assert done.returncode == 0, done.stderr
    assert int(done.stdout.split()[1], 16) == 0, done.stdout


def test_a_signal_ignored_by_the_caller_stays_ignored_in_the_job(
    runner: tuple[Wrapper, LockManager], tmp_path: Path
) -> None:
    """Under ``nohup`` (SIGHUP ignored) the job ignores SIGHUP too, and a SIGHUP sent to
    ``redlock run`` does not end it."""
    run, _ = runner
    process = run.start_command("nohup", [PY, "-c", TICKER, str(tmp_path)], ignore=["SIGHUP"])
    job = int(wait_for(tmp_path / "pid"))
    process.send_signal(signal.SIGHUP)
    ticks = len((tmp_path / "progress").read_text())
    wait_until(lambda: len((tmp_path / "progress").read_text()) > ticks + 5, "more ticks")
    assert alive(job) and process.poll() is None
    (tmp_path / "finish").touch()
    _, err = process.communicate(timeout=60)
    assert process.returncode == 0, err
