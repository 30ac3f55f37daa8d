"""What the demo commands (``oversell``, ``zombie``) share: a run's setup and its workers.

:class:`WorkerProcesses` starts each worker with multiprocessing's "spawn" method (a fresh
interpreter that runs ``django.setup()`` from the inherited environment, then the worker), and
pauses, resumes and stops them by their PIDs only.
"""

from __future__ import annotations

import contextlib
import json
import multiprocessing
import os
import signal
import subprocess
import sys
from collections.abc import Callable
from multiprocessing.context import SpawnProcess
from pathlib import Path
from typing import TYPE_CHECKING, Any

from django.core.management.base import BaseCommand
from django.db import connections

if TYPE_CHECKING:
    from rich.console import Console

    from testproject.inventory.models import Product

SPAWN = multiprocessing.get_context("spawn")
CAN_FREEZE = hasattr(signal, "SIGSTOP")  # not on Windows
STOP_GRACE = 5.0  # seconds a terminated worker gets to exit


def console_for(command: BaseCommand) -> Console:
    """A rich console on ``command``'s output stream."""
    from rich.console import Console

    return Console(file=getattr(command.stdout, "_out", sys.stdout), highlight=False)


def recreate_product(name: str, stock: int) -> Product:
    """Replace the demo product ``name`` (and its orders) with a fresh row holding ``stock``."""
    from testproject.inventory.models import Product

    Product.objects.filter(name=name).delete()  # its orders go with it
    return Product.objects.create(name=name, stock=stock)


def _run_with_django(target: Callable[..., None], *args: Any) -> None:
    """In the worker: set Django up (settings from the inherited environment), run the target."""
    import django

    django.setup()
    target(*args)


class WorkerProcesses:
    """The worker processes of one run; signalled and stopped only by their own PIDs."""

    def __init__(self) -> None:
        self.processes: list[SpawnProcess] = []
        self._frozen: set[int] = set()

    def add(self, target: Callable[..., None], *args: Any, daemon: bool = False) -> SpawnProcess:
        """A new worker (not started yet) that sets Django up and runs ``target(*args)``."""
        process = SPAWN.Process(target=_run_with_django, args=(target, *args), daemon=daemon)
        self.processes.append(process)
        return process

    def start(self, *processes: SpawnProcess) -> None:
        """Start ``processes`` (default: all added), after closing our database connections.

        The workers open their own connections; ours reopen when needed.
        """
        connections.close_all()
        for process in processes or self.processes:
            process.start()

    def freeze(self, process: SpawnProcess) -> bool:
        """SIGSTOP ``process``; False (and nothing sent) where the OS has no SIGSTOP."""
        if not CAN_FREEZE:
            return False
        assert process.pid is not None
        os.kill(process.pid, signal.SIGSTOP)
        self._frozen.add(process.pid)
        return True

    def thaw(self, process: SpawnProcess) -> bool:
        """SIGCONT ``process`` if :meth:`freeze` stopped it; True if it did."""
        if process.pid not in self._frozen:
            return False
        self._frozen.discard(process.pid)
        os.kill(process.pid, signal.SIGCONT)
        return True

    def stop(self, grace: float = 0.0) -> None:
        """Thaw the frozen workers, give each ``grace`` seconds to exit, terminate the rest."""
        for process in self.processes:
            self.thaw(process)
        for process in self.processes:
            if process.pid is None:  # never started
                continue
            if grace:
                process.join(grace)
            if process.is_alive():
                process.terminate()  # SIGTERM to its PID
                process.join(STOP_GRACE)


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


def add_json_option(parser: Any) -> None:
    """``--json [PATH]``, read by :func:`emit_result`."""
    parser.add_argument(
        "--json",
        metavar="PATH",
        nargs="?",
        const="-",
        help="Also write the result as JSON (to PATH, or as the last line).",
    )


def emit_result(command: BaseCommand, line: str, result: dict[str, Any], json_to: Any) -> None:
    """Write a demo command's one-line outcome, and its ``result`` as JSON where ``--json``
    says: ``"-"`` as the last line of the output, a path into that file, None nowhere."""
    command.stdout.write(line)
    if json_to == "-":
        command.stdout.write(json.dumps(result))
    elif json_to:
        Path(json_to).write_text(json.dumps(result))
