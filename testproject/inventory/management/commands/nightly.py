"""``manage.py nightly``: "a nightly job on three servers", with and without the lock.

Three processes start the same nightly report at the same moment, like three servers' cron
entries. Without the lock each runs the job (three reports); with it each is started as
``manage.py redlock run nightly-report --skip-busy -- <job>``: one runs it, the other two exit 0
at once, and exactly one report is written. The job is a separate program (a Python one-liner
that works for a second and writes ``report-<pid>.txt``), as a cron job would be.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from argparse import ArgumentParser
from pathlib import Path
from typing import Any

from django.core.management.base import BaseCommand

JOB = (
    "import os, sys, time; time.sleep({work}); "
    "open(os.path.join(sys.argv[1], f'report-{{os.getpid()}}.txt'), 'w').write('report')"
)


class Command(BaseCommand):
    help = 'Three "servers" start the nightly report at once, with or without redlock run.'

    def add_arguments(self, parser: ArgumentParser) -> None:
        parser.add_argument("--no-lock", action="store_true", help="Run the job directly.")
        parser.add_argument("--servers", type=int, default=3, help="How many start it (3).")
        parser.add_argument("--work", type=float, default=1.0, help="Seconds the job works.")
        parser.add_argument(
            "--json",
            nargs="?",
            const="-",
            metavar="PATH",
            help="Also write the result as JSON to PATH (no PATH: as the last line of stdout).",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        use_lock = not options["no_lock"]
        with tempfile.TemporaryDirectory(prefix="nightly-") as reports:
            job = [sys.executable, "-c", JOB.format(work=options["work"]), reports]
            name = f"nightly-report:{time.strftime('%Y-%m-%d')}"
            manage = [sys.executable, sys.argv[0]] if sys.argv[0].endswith("manage.py") else [
                sys.executable, "-m", "django"]  # fmt: skip
            command = [*manage, "redlock", "run", name, "--skip-busy", "--", *job]
            started = time.monotonic()
            servers = [
                subprocess.Popen(command if use_lock else job, stdout=subprocess.PIPE)
                for _ in range(options["servers"])
            ]
            statuses = [server.wait(120) for server in servers]
            seconds = time.monotonic() - started
            written = len(list(Path(reports).glob("report-*.txt")))
        result = {
            "servers": options["servers"],
            "lock": use_lock,
            "reports": written,
            "exit_statuses": statuses,
            "seconds": round(seconds, 2),
        }
        label = "with redlock run" if use_lock else "without the lock"
        self.stdout.write(
            f"nightly report, {options['servers']} servers, {label}: {written} report(s) "
            f"written, exit statuses {statuses}, {seconds:.1f} s"
        )
        if options["json"] == "-":
            self.stdout.write(json.dumps(result))
        elif options["json"]:
            Path(options["json"]).write_text(json.dumps(result))
