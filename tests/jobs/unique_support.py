"""Helpers of the unique-task tests: the environment of a worker or enqueuing process of this
test session, long-running workers stopped by PID, and waiting for a condition."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from django.conf import settings
from django.db import connection

ROOT = Path(__file__).resolve().parent.parent.parent


def process_env(**extra: str) -> dict[str, str]:
    """The environment of a process that uses this test's lock nodes and database."""
    return {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "tests.support.subprocess_settings",
        "REDLOCK_JSON": json.dumps(settings.REDLOCK),
        "TEST_DATABASE_NAME": str(connection.settings_dict["NAME"]),
        "PYTHONPATH": str(ROOT),
        **extra,
    }


class Processes:
    """Processes a test started; :meth:`stop_all` ends those still running, by PID."""

    def __init__(self, log_dir: Path) -> None:
        self.log_dir = log_dir
        self.started: list[tuple[subprocess.Popen[bytes], Path]] = []

    def start(self, argv: Sequence[str], **env: str) -> subprocess.Popen[bytes]:
        log = self.log_dir / f"process-{len(self.started)}.log"
        with log.open("wb") as out:
            process = subprocess.Popen(
                list(argv), env=process_env(**env), cwd=ROOT, stdout=out, stderr=subprocess.STDOUT
            )
        self.started.append((process, log))
        return process

    def log_of(self, process: subprocess.Popen[bytes]) -> str:
        for each, log in self.started:
            if each is process:
                return log.read_text(errors="replace")[-3000:]
        return ""

    def stop_all(self) -> None:
        for process, _ in self.started:
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
                try:
                    process.wait(timeout=8)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait()


@contextlib.contextmanager
def processes(log_dir: Path) -> Iterator[Processes]:
    started = Processes(log_dir)
    try:
        yield started
    finally:
        started.stop_all()


def wait_for(condition: Callable[[], Any], timeout: float = 30.0, what: str = "") -> Any:
    """Poll ``condition`` every 50 ms until it is truthy (its value is returned)."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what or condition}")
        time.sleep(0.05)


def python(script: str) -> list[str]:
    return [sys.executable, "-c", script]


def gather_ids(
    pool: Sequence[threading.Thread], others: Sequence[subprocess.Popen[bytes]], started: Processes
) -> list[str]:
    """Start and join ``pool`` (threads appending to their own list), wait for ``others``
    (processes printing ``id=<id>`` lines) and return the ids those printed."""
    for thread in pool:
        thread.start()
    for thread in pool:
        thread.join(60)
    printed: list[str] = []
    for process in others:
        assert process.wait(60) == 0, started.log_of(process)
        log = started.log_of(process)
        printed.extend(line[3:] for line in log.splitlines() if line.startswith("id="))
    return printed
