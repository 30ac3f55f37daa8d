"""Stopping a process the tests (or a benchmark) started in a session of its own."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess


def stop_group(process: subprocess.Popen[bytes], grace: float = 8.0) -> None:
    """SIGTERM to ``process`` (a warm shutdown), SIGKILL to its whole process group after
    ``grace`` seconds, and SIGKILL to the group in any case (children orphaned by a crash).
    The process must have been started with ``start_new_session=True``."""
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=5)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)
