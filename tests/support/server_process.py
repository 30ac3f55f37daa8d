"""A web server in a process of its own for a test: started, waited for, stopped by PID."""

from __future__ import annotations

import subprocess
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent.parent


@contextmanager
def server_process(
    command: list[str], env: dict[str, str], ready_url: str, log_path: Path, wait: float = 30
) -> Iterator[subprocess.Popen[bytes]]:
    """Run ``command`` (in the project root, output to ``log_path``) until ``ready_url``
    answers; yields the process and stops it (SIGTERM, then SIGKILL) at the end. A server that
    dies or never answers fails the test with the end of its log."""
    with log_path.open("wb") as log:
        proc = subprocess.Popen(command, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + wait
        while True:
            assert proc.poll() is None, log_path.read_text()[-3000:]
            assert time.monotonic() < deadline, log_path.read_text()[-3000:]
            try:
                urllib.request.urlopen(ready_url, timeout=1).read()
                break
            except OSError:
                time.sleep(0.1)
        yield proc
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
