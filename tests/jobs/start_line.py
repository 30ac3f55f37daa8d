"""A start line for the enqueuing processes of the unique-task tests: each process, once Django
is set up, reports ready and waits; the test then names one wall-clock moment for all of them
(instead of a fixed delay long enough for the slowest start-up on a loaded machine)."""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Protocol


class _Logs(Protocol):
    def log_of(self, process: subprocess.Popen[bytes]) -> str: ...


def wait_for_go(go: str, timeout: float = 60.0) -> None:
    """In an enqueuing process: report ready (``<go>.<pid>``), wait for the go file and then
    for the moment it names."""
    Path(f"{go}.{os.getpid()}").touch()
    deadline = time.monotonic() + timeout
    while not os.path.exists(go):
        if time.monotonic() > deadline:
            raise SystemExit(f"no go file {go} within {timeout} s")
        time.sleep(0.005)
    at = float(Path(go).read_text())
    time.sleep(max(0.0, at - time.time()))


class StartLine:
    """The test's side: :meth:`go` waits until every process reported ready, then names the
    moment (``delay`` seconds on) and returns it."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def go(
        self,
        others: Sequence[subprocess.Popen[bytes]],
        logs: _Logs,
        delay: float = 0.3,
        timeout: float = 60.0,
    ) -> float:
        deadline = time.monotonic() + timeout
        for process in others:
            ready = Path(f"{self.path}.{process.pid}")
            while not ready.exists():
                assert process.poll() is None, logs.log_of(process)
                assert time.monotonic() < deadline, f"process {process.pid} never got ready"
                time.sleep(0.01)
        at = time.time() + delay
        staged = self.path.with_name(self.path.name + ".tmp")
        staged.write_text(repr(at))
        staged.replace(self.path)  # atomic: a process never reads a half-written moment
        return at


def waiters(name: str, alias: str = "default") -> int:
    """How many callers wait for lock ``name`` of ``alias`` now."""
    from django_redlock import inspection

    info, errors = inspection.get_lock(alias, name)
    assert not errors, errors
    return 0 if info is None else info.waiters
