"""A web server in a process of its own for a test: started, waited for, stopped by PID."""

from __future__ import annotations

import json
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent.parent

#: ``NODE_TIMEOUT`` of a test server's aliases: far above the 50 ms default, which a server
#: process starved of CPU (8 busy processes on 2 cores, a parallel run) overshoots, answering
#: 503 to tests that are about something else (each request's exclusion, its idempotency).
SERVER_NODE_TIMEOUT = 2.0


def server_aliases(aliases: dict[str, dict[str, Any]]) -> str:
    """The ``REDLOCK_TEST_ALIASES`` of a test server: the test's aliases, with
    :data:`SERVER_NODE_TIMEOUT`."""
    return json.dumps(
        {
            alias: {**config, "NODE_TIMEOUT": SERVER_NODE_TIMEOUT}
            for alias, config in aliases.items()
        }
    )


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


def post_json(
    url: str, key: str, body: bytes, headers: dict[str, str] | None = None, timeout: float = 15
) -> tuple[int, Any, dict[str, str]]:
    """POST ``body`` as JSON with ``Idempotency-Key: key`` (and ``headers``): the status, the
    parsed JSON answer (None where it is not JSON) and the response headers."""
    request = urllib.request.Request(
        url,
        data=body,
        method="POST",
        headers={
            "Accept": "application/json",
            "Content-Type": "application/json",
            "Idempotency-Key": key,
            **(headers or {}),
        },
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, json.loads(response.read()), dict(response.headers)
    except urllib.error.HTTPError as exc:
        try:
            parsed = json.loads(exc.read())
        except ValueError:
            parsed = None
        return exc.code, parsed, dict(exc.headers)
