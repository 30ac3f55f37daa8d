"""``manage.py redlock run NAME -- COMMAND`` as a real subprocess against real nodes (docs/jobs.md):
one of two invocations runs, exit statuses 75/69/70/126/127/2, the child's status passed on,
signals forwarded, and the child never outlives a SIGKILLed wrapper."""

from __future__ import annotations

import json
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from django_redlock.locking.manager import LockManager
from django_redlock.testing import RedisNodes
from tests.support.waiting import pttls, until_waiting

from .run_support import Wrapper, alive, exit_status_within, free_now, run_in_process, wait_for

Alias = Callable[..., LockManager]


@pytest.fixture
def wrapper(
    redis_nodes: RedisNodes, redlock_alias: Alias, tmp_path: Path
) -> Iterator[tuple[Wrapper, LockManager]]:
    manager = redlock_alias(redis_nodes)
    made = Wrapper(manager, tmp_path)
    yield made, manager
    made.close()


def test_two_invocations_one_runs_the_other_exits_75(
    wrapper: tuple[Wrapper, LockManager], tmp_path: Path
) -> None:
    """The child sees REDLOCK_* and runs while the second invocation exits 75 with one line
    on stderr; --skip-busy exits 0 silently; the first exits with its child's status (3)."""
    run, manager = wrapper
    marker, finish = tmp_path / "env", tmp_path / "finish"
    script = (
        "import os, sys, time; keys = ('REDLOCK_ALIAS', 'REDLOCK_NAME', 'REDLOCK_TOKEN');"
        f"open({str(marker)!r}, 'w').write(' '.join(os.environ[k] for k in keys) + chr(10))\n"
        f"while not os.path.exists({str(finish)!r}): time.sleep(0.01)\n"
        "sys.exit(3)"
    )
    first = run.start("nightly", script)
    alias, name, token = wait_for(marker).split()
    assert (alias, name) == (manager.alias, "nightly") and int(token) > 0
    second = run.run("nightly", "print('ran')")
    assert second.returncode == 75
    assert second.stdout == "" and second.stderr.count("\n") == 1
    assert "busy" in second.stderr and "nightly" in second.stderr
    skipped = run.run("nightly", "print('ran')", "--skip-busy")
    assert (skipped.returncode, skipped.stdout, skipped.stderr) == (0, "", "")
    finish.touch()
    assert first.wait(20) == 3
    free_now(manager, "nightly")  # released when the child exited


def test_child_killed_by_a_signal_exits_128_plus_n(wrapper: tuple[Wrapper, LockManager]) -> None:
    run, manager = wrapper
    done = run.run("sig", "import os, signal; os.kill(os.getpid(), signal.SIGTERM)")
    assert done.returncode == 128 + signal.SIGTERM
    free_now(manager, "sig")


def test_sigterm_is_forwarded_and_the_name_released(
    wrapper: tuple[Wrapper, LockManager], tmp_path: Path
) -> None:
    """SIGTERM to redlock run reaches the child (which handles it and exits 0)."""
    run, manager = wrapper
    ready, got = tmp_path / "ready", tmp_path / "got"
    script = (
        "import signal, sys, time\n"
        "def bye(n, f):\n"
        f"    open({str(got)!r}, 'w').write(str(n) + chr(10)); sys.exit(0)\n"
        "signal.signal(signal.SIGTERM, bye)\n"
        f"open({str(ready)!r}, 'w').write('ok' + chr(10))\n"
        "time.sleep(30)\n"
    )
    process = run.start("term", script)
    wait_for(ready)
    process.send_signal(signal.SIGTERM)
    assert exit_status_within(process, 20) == 0
    assert wait_for(got).strip() == str(int(signal.SIGTERM))
    free_now(manager, "term")


def test_sigterm_as_the_name_is_taken_leaves_nothing_locked(
    wrapper: tuple[Wrapper, LockManager], redis_nodes: RedisNodes
) -> None:
    """SIGTERM sent the moment the name's key appears on a node (the holder is between its
    grant and the job's start): the run ends with 143 (interrupted, or the job ended by the
    forwarded signal) and the name is free at once. A holder that died of the signal there
    used to leave the name locked for its TTL (30 s here)."""
    run, manager = wrapper
    clients = [node.client() for node in redis_nodes]
    outcomes: list[str] = []
    for attempt in range(8):
        name = f"taking-{attempt}"
        key = manager.engine.state.keys.lock(name)
        process = run.start(name, "import time; time.sleep(30)", "--ttl", "30")
        deadline = time.monotonic() + 30
        while not any(client.exists(key) for client in clients):
            assert process.poll() is None and time.monotonic() < deadline, "never took it"
        process.send_signal(signal.SIGTERM)
        _, err = process.communicate(timeout=20)
        assert process.returncode == 128 + signal.SIGTERM, err
        outcomes.append(err.strip() or "job ended by the signal")
        free_now(manager, name)
    print(outcomes)


@pytest.mark.parametrize("gap", [0.03, 0.1])
def test_a_second_signal_as_the_run_ends_does_not_kill_it(
    wrapper: tuple[Wrapper, LockManager], tmp_path: Path, gap: float
) -> None:
    """Two SIGTERMs ``gap`` apart; the job exits 42 on the first. The second reaches
    ``redlock run`` as it ends: it exits 42, as its status file says (the second signal used
    to end it by its default action, -15, once its handlers were put back or Python's
    shutdown had reset them)."""
    run, manager = wrapper
    ready, status = tmp_path / "ready", tmp_path / "status.json"
    script = (
        "import signal, sys, time\n"
        "signal.signal(signal.SIGTERM, lambda *_: sys.exit(42))\n"
        f"open({str(ready)!r}, 'w').write('ok' + chr(10))\n"
        "time.sleep(30)\n"
    )
    process = run.start("twice", script, "--status-file", str(status))
    wait_for(ready)
    process.send_signal(signal.SIGTERM)
    time.sleep(gap)
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
    assert exit_status_within(process, 20) == 42
    assert json.loads(status.read_text())["exit_status"] == 42
    free_now(manager, "twice")


def test_two_signals_during_the_wait_exit_128_plus_the_first(
    wrapper: tuple[Wrapper, LockManager], tmp_path: Path
) -> None:
    """SIGTERM, then SIGINT 0.1 s later, while ``redlock run --timeout 20`` waits for a name
    another holder keeps: 143 (interrupted), as its status file says; the job never ran."""
    run, manager = wrapper
    status, ran = tmp_path / "status.json", tmp_path / "ran"
    holder = manager.acquire("waited", ttl=30, timeout=0)
    try:
        process = run.start(
            "waited", f"open({str(ran)!r}, 'w')", "--timeout", "20", "--status-file", str(status)
        )
        until_waiting(manager, "waited", 1, 30)
        process.send_signal(signal.SIGTERM)
        time.sleep(0.1)
        if process.poll() is None:
            process.send_signal(signal.SIGINT)
        assert exit_status_within(process, 20) == 128 + signal.SIGTERM
    finally:
        holder.release()
    assert json.loads(status.read_text())["outcome"] == "interrupted"
    assert not ran.exists()
    free_now(manager, "waited")


def test_wrapper_sigkilled_takes_the_child_with_it(
    wrapper: tuple[Wrapper, LockManager], tmp_path: Path
) -> None:
    """SIGKILL the wrapper: the child dies too (its keeper SIGKILLs the job) and the name is
    free within one TTL (2 s: its key's PTTL; the holder releases it once the job is gone)."""
    run, manager = wrapper
    pid_file = tmp_path / "pid"
    script = (
        f"import os, time; open({str(pid_file)!r}, 'w').write(str(os.getpid()) + chr(10));"
        "time.sleep(60)"
    )
    process = run.start("killed", script, "--ttl", "2")
    child = int(wait_for(pid_file))
    process.kill()
    process.wait(10)
    deadline = time.monotonic() + 5
    while alive(child) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert not alive(child), "the child outlived its SIGKILLed wrapper"
    # nobody renews it: its key expires within one TTL (the server's clock, not ours)
    left = pttls(manager, manager.engine.state.keys.lock("killed"))
    assert all(ms <= 2000 for ms in left), left
    manager.acquire("killed", timeout=30).release()


def test_lost_lease_terminates_the_child_and_exits_70(
    wrapper: tuple[Wrapper, LockManager], tmp_path: Path
) -> None:
    """An operator force-releases the name while the child runs: the next renewal finds the
    lease lost, the child gets SIGTERM, redlock run prints one line and exits 70."""
    run, manager = wrapper
    ready, got = tmp_path / "ready", tmp_path / "got"
    script = (
        "import signal, sys, time\n"
        "def bye(n, f):\n"
        f"    open({str(got)!r}, 'w').write('term' + chr(10)); sys.exit(0)\n"
        "signal.signal(signal.SIGTERM, bye)\n"
        f"open({str(ready)!r}, 'w').write('ok' + chr(10))\n"
        "time.sleep(30)\n"
    )
    process = run.start("lost", script, "--ttl", "1.5")
    wait_for(ready)
    assert manager.force_release("lost") > 0
    _, err = process.communicate(timeout=20)
    assert process.returncode == 70
    assert err.count("\n") == 1 and "lost lock 'lost'" in err and "SIGTERM" in err
    assert wait_for(got).strip() == "term"


def test_a_child_that_ignores_sigterm_is_killed_after_kill_after(
    wrapper: tuple[Wrapper, LockManager], tmp_path: Path
) -> None:
    run, manager = wrapper
    pid_file = tmp_path / "pid"
    script = (
        "import os, signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN);"
        f"open({str(pid_file)!r}, 'w').write(str(os.getpid()) + chr(10)); time.sleep(60)"
    )
    process = run.start("stubborn", script, "--ttl", "1.5", "--kill-after", "0.5")
    child = int(wait_for(pid_file))
    manager.force_release("stubborn")
    assert process.wait(20) == 70
    assert not alive(child)


def test_command_that_does_not_exist_is_127_and_releases_at_once(
    wrapper: tuple[Wrapper, LockManager],
) -> None:
    run, manager = wrapper
    done = run.argv("missing", "--using", run.alias, "--", "/nonexistent/job", "--flag")
    assert done.returncode == 127
    assert done.stderr.count("\n") == 1 and "cannot run '/nonexistent/job'" in done.stderr
    free_now(manager, "missing")


def test_command_that_is_not_executable_is_126(
    wrapper: tuple[Wrapper, LockManager], tmp_path: Path
) -> None:
    run, manager = wrapper
    script = tmp_path / "job.sh"
    script.write_text("#!/bin/sh\necho hi\n")  # no x bit
    done = run.argv("noexec", "--using", run.alias, "--", str(script))
    assert done.returncode == 126 and "cannot run" in done.stderr
    free_now(manager, "noexec")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["job"], "give the command after --"),
        (["job", "--"], "give the command after --"),
        (["job", "--ttl", "abc", "--", "true"], "invalid float value"),
        (["job", "--ttl", "-1", "--", "true"], "ttl"),
        (["job", "--timeout", "-1", "--", "true"], "timeout"),
        (["job", "--kill-after", "-1", "--", "true"], "--kill-after"),
        (["job", "--kill-after", "nan", "--", "true"], "--kill-after"),
        (["job", "--kill-after", "inf", "--", "true"], "--kill-after"),
        (["job", "--timeout", "nan", "--", "true"], "timeout"),
        (["job", "--min-hold", "0", "--", "true"], "--min-hold must be > 0"),
        (["job", "--min-hold", "inf", "--", "true"], "--min-hold must be a finite"),
        (["__fence__", "--", "true"], "__"),
    ],
)
def test_bad_arguments_exit_2_with_one_line(
    wrapper: tuple[Wrapper, LockManager], args: list[str], message: str
) -> None:
    run, manager = wrapper
    status, stderr = run_in_process(*args[:1], "--using", run.alias, *args[1:])
    assert status == 2, stderr
    assert message in stderr
    assert "Traceback" not in stderr
    free_now(manager, "job")  # nothing held


def test_no_quorum_exits_69(redis_node_factory: Any, redlock_alias: Alias, tmp_path: Path) -> None:
    nodes = redis_node_factory(3)
    manager = redlock_alias(nodes, NODE_TIMEOUT=0.1)
    run = Wrapper(manager, tmp_path)
    nodes[0].kill()
    nodes[1].kill()
    done = run.run("job", "print('ran')")
    assert done.returncode == 69, done.stderr
    assert done.stdout == "" and done.stderr.count("\n") == 1


def test_unknown_alias_exits_2(wrapper: tuple[Wrapper, LockManager]) -> None:
    """``--using`` naming no REDLOCK alias is a bad argument: exit 2, one line, no traceback."""
    run, _ = wrapper
    done = run.argv("job", "--using", "nosuchalias", "--", "true")
    assert done.returncode == 2, done.stderr
    assert "nosuchalias" in done.stderr and done.stderr.count("\n") == 1


def test_status_file_tells_a_child_exiting_75_from_busy(
    wrapper: tuple[Wrapper, LockManager], tmp_path: Path
) -> None:
    """A child that exits 75 itself and a busy name both exit 75; ``--status-file`` tells them
    apart (``ran`` with the child's status vs ``busy``), and a lost lease writes ``lost``."""
    run, manager = wrapper
    status = tmp_path / "status.json"
    done = run.run("own75", "import sys; sys.exit(75)", "--status-file", str(status))
    assert done.returncode == 75
    assert json.loads(status.read_text()) == {
        "outcome": "ran", "child_status": 75, "exit_status": 75,
    }  # fmt: skip
    with manager.lock("own75"):
        busy = run.run("own75", "print('ran')", "--status-file", str(status))
    assert busy.returncode == 75
    assert json.loads(status.read_text()) == {
        "outcome": "busy", "child_status": None, "exit_status": 75,
    }  # fmt: skip
    ready = tmp_path / "ready"
    script = f"import time; open({str(ready)!r}, 'w').write('ok' + chr(10)); time.sleep(30)"
    process = run.start("own70", script, "--ttl", "1.5", "--status-file", str(status))
    wait_for(ready)
    manager.force_release("own70")
    assert process.wait(30) == 70
    assert json.loads(status.read_text()) == {
        "outcome": "lost", "child_status": 128 + signal.SIGTERM, "exit_status": 70,
    }  # fmt: skip


def test_min_hold_keeps_the_name_after_a_short_job(
    wrapper: tuple[Wrapper, LockManager], tmp_path: Path
) -> None:
    """--min-hold 30 and a job that exits 0 at once: the name stays taken (the copy another
    server's cron started for the same tick is busy: 75, or 0 without running under
    --skip-busy) and expires within the 30 s counted from the job's start, on the nodes'
    clocks; without --min-hold it is released at once."""
    run, manager = wrapper
    ran = tmp_path / "ran"
    first = run.run("tick", "pass", "--min-hold", "30")
    assert (first.returncode, first.stderr) == (0, "")
    key = f"{manager.config.key_prefix}tick"
    assert all(0 < pttl <= 30_000 for pttl in pttls(manager, key)), pttls(manager, key)
    copy = run.run("tick", f"open({str(ran)!r}, 'w')", "--skip-busy")
    assert (copy.returncode, copy.stderr) == (0, "") and not ran.exists()
    assert run.run("tick", "pass").returncode == 75
    plain = run.run("plain", "pass")
    assert plain.returncode == 0
    free_now(manager, "plain")


def test_min_hold_releases_at_once_after_a_failed_job(
    wrapper: tuple[Wrapper, LockManager],
) -> None:
    """A job that exits non-zero leaves the name free (the next tick may retry it), like
    @lock(min_hold=) after an exception."""
    run, manager = wrapper
    done = run.run("failing", "raise SystemExit(4)", "--min-hold", "30")
    assert done.returncode == 4
    free_now(manager, "failing")
