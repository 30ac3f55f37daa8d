"""Leader election across real processes (docs/leaders.md): three processes campaign for one
leadership; the leader is SIGKILLed, then the next one SIGSTOPped past its TTL and resumed.
Checked outside the library, from what each process logged and what the database kept: the
accepted writes' terms never go down and each term is one process's, a new leader is elected
within one TTL of a kill with a higher term, and the resumed one is demoted and its late write
refused by the database."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from django.conf import settings
from django.db import connection

from tests.fencing_app.models import Coupon

ROOT = Path(__file__).resolve().parent.parent.parent
TTL = 1.0
pytestmark = pytest.mark.django_db(transaction=True)


def _events(log: Path) -> list[tuple[str, int, int | None, float]]:
    rows = []
    for line in log.read_text().splitlines() if log.exists() else []:
        event, pid, term, at = line.split()
        rows.append((event, int(pid), None if term == "None" else int(term), float(at)))
    return rows


def _until(test: object, seconds: float, log: Path | None = None) -> None:
    """Wait for ``test()``; a generous bound for progress (a loaded machine), not a claim."""
    deadline = time.monotonic() + seconds
    while not test():  # type: ignore[operator]
        events = _events(log) if log is not None else []
        assert time.monotonic() < deadline, f"timed out; events: {events}"
        time.sleep(0.02)


@pytest.fixture(params=["sync", "asyncio"])
def campaigners(
    request: pytest.FixtureRequest, unique_name: str, tmp_path: Path
) -> Iterator[tuple[list[subprocess.Popen[str]], Path]]:
    Coupon.objects.create(code=unique_name)
    log = tmp_path / "events"
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "tests.support.subprocess_settings",
        "REDLOCK_JSON": json.dumps(settings.REDLOCK),
        "TEST_DATABASE_NAME": str(connection.settings_dict["NAME"]),
        "PYTHONPATH": str(ROOT),
    }
    argv = [sys.executable, "-m", "tests.support.leader_worker", unique_name, str(log), str(TTL)]
    procs = [
        subprocess.Popen(
            [*argv, unique_name, request.param],
            env=env,
            cwd=ROOT,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(3)
    ]
    try:
        yield procs, log
    finally:
        for proc in procs:
            if proc.poll() is None:
                os.kill(proc.pid, signal.SIGCONT)
                proc.terminate()
        for proc in procs:
            try:
                proc.communicate(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.communicate()


def _leader(log: Path, after: float = 0.0) -> tuple[int, int, float]:
    """The last process elected after ``after``: (pid, term, when)."""
    elected = [(pid, term, at) for event, pid, term, at in _events(log) if event == "elected"]
    pid, term, at = [e for e in elected if e[2] > after][-1]
    assert term is not None
    return pid, term, at


def test_one_leader_at_a_time_through_a_kill_and_a_pause(
    campaigners: tuple[list[subprocess.Popen[str]], Path], unique_name: str
) -> None:
    procs, log = campaigners
    by_pid = {proc.pid: proc for proc in procs}
    _until(lambda: any(e[0] == "wrote" for e in _events(log)), 30, log)
    first, first_term, _ = _leader(log)

    os.kill(first, signal.SIGKILL)  # the leader dies: another within one TTL, a higher term
    killed_at = time.time()
    by_pid[first].wait(10)
    _until(lambda: any(e[0] == "elected" and e[3] > killed_at for e in _events(log)), 30, log)
    second, second_term, elected_at = _leader(log, killed_at)
    assert second != first and second_term > first_term
    assert elected_at - killed_at < TTL + 1.0  # within one TTL and a retry step (< 0.8 s)

    _until(lambda: any(e[0] == "wrote" and e[1] == second for e in _events(log)), 30, log)
    os.kill(second, signal.SIGSTOP)  # paused past its TTL: the third takes over
    stopped_at = time.time()
    _until(lambda: any(e[0] == "elected" and e[3] > stopped_at for e in _events(log)), 30, log)
    third, third_term, _ = _leader(log, stopped_at)
    assert third not in (first, second) and third_term > second_term
    _until(lambda: any(e[0] == "wrote" and e[1] == third for e in _events(log)), 30, log)
    os.kill(second, signal.SIGCONT)  # resumed: demoted at once, its late write refused
    _until(lambda: any(e[0] == "late-refused" and e[1] == second for e in _events(log)), 30, log)
    # the third leader writes on: it ends (SIGTERM) before the log and the row are read, so
    # that both see the same writes (it wrote between the two reads on a loaded machine); a
    # stopped one could hold SQLite's write lock ("database is locked")
    by_pid[third].terminate()
    by_pid[third].wait(10)
    events = _events(log)
    assert ("demoted", second, second_term) in [(e, p, t) for e, p, t, _ in events]
    assert not any(e[0] == "late-accepted" for e in events)

    # outside the library: the writes the database accepted, in time order
    writes = sorted((at, term, pid) for event, pid, term, at in events if event == "wrote")
    terms = [term for _, term, _ in writes]
    assert terms == sorted(terms)  # a term never goes back: never two leaders writing
    owners: dict[int | None, set[int]] = {}
    for _, term, pid in writes:
        owners.setdefault(term, set()).add(pid)
    assert all(len(pids) == 1 for pids in owners.values())
    coupon = Coupon.objects.get(code=unique_name)
    assert coupon.fence_token == third_term  # the last accepted write was the third's
    # each accepted write counted once; the SIGKILLed leader and the third one (SIGTERM) may
    # each have ended between a write and its log line
    assert len(writes) <= coupon.amount <= len(writes) + 2
