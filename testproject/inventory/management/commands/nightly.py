"""``manage.py nightly``: "a nightly job on three servers", with and without the lock.

Three processes start the same nightly report at the same moment, like three servers' cron
entries. Without the lock each runs the job (three reports); with it each is started as
``manage.py redlock run nightly-report --skip-busy -- <job>``: one runs it, the other two exit 0
at once, and exactly one report is written. The job is a separate program (a Python one-liner
that works for a second and writes ``report-<pid>.txt``), as a cron job would be.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from argparse import ArgumentParser
from pathlib import Path
from typing import Any

from django.core.management.base import BaseCommand

from testproject.inventory.demo_run import emit_result, stop_group

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
            "--scheduler",
            action="store_true",
            help="Three servers run `redlock scheduler` (REDLOCK_SCHEDULE, every second) instead; "
            "one is SIGKILLed in the middle of a run.",
        )
        parser.add_argument(
            "--celery",
            action="store_true",
            help="Two celery beat schedulers send the job to a Celery worker instead.",
        )
        parser.add_argument(
            "--seconds", type=float, default=6.5, help="How long the schedulers run (6.5)."
        )
        parser.add_argument(
            "--json",
            nargs="?",
            const="-",
            metavar="PATH",
            help="Also write the result as JSON to PATH (no PATH: as the last line of stdout).",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        if options["scheduler"]:
            self.with_scheduler(options)
            return
        if options["celery"]:
            self.with_celery(options)
            return
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
        line = (
            f"nightly report, {options['servers']} servers, {label}: {written} report(s) "
            f"written, exit statuses {statuses}, {seconds:.1f} s"
        )
        emit_result(self, line, result, options["json"])

    def with_celery(self, options: dict[str, Any]) -> None:
        """Two ``celery beat`` processes send the job every 2 s to one prefork worker, for
        ``--seconds``: the plain task runs once per tick per scheduler, the LockedTask
        (``lock_min_hold``) once per tick."""
        use_lock = not options["no_lock"]
        task = "demo.nightly_locked" if use_lock else "demo.nightly_plain"
        celery = [sys.executable, "-m", "celery", "-A", "testproject.celery_demo"]
        with tempfile.TemporaryDirectory(prefix="nightly-celery-") as scratch:

            def env(scheduler: int) -> dict[str, str]:
                beat = {"task": task, "args": [scratch], "seconds": BEAT_EVERY}
                return {**os.environ, "DEMO_BEAT": json.dumps({**beat, "scheduler": scheduler})}

            worker = [*celery, "worker", "--pool=prefork", "--concurrency=2", "-l", "warning"]
            worker += ["--without-heartbeat", "--without-gossip", "--without-mingle"]
            processes = [_start(worker, env(0))]
            try:
                time.sleep(2.0)  # the worker is up before the first tick
                for n in range(2):
                    beat = [*celery, "beat", "-l", "warning", f"--schedule={scratch}/beat{n}"]
                    processes.append(_start([*beat, f"--pidfile={scratch}/beat{n}.pid"], env(n)))
                time.sleep(options["seconds"])
                for beat_process in processes[1:]:
                    stop_group(beat_process)
                time.sleep(1.5)  # the worker runs what was sent
            finally:
                for process in processes:
                    stop_group(process)
            written = len(list(Path(scratch).glob("report-*.txt")))
            # a tick is one send of one scheduler: the one that sent more (started sooner)
            ticks = max(len(list(Path(scratch).glob(f"sent-{n}-*"))) for n in range(2))
        result = {
            "schedulers": 2,
            "lock": use_lock,
            "reports": written,
            "ticks": ticks,
            "celery": True,
        }
        label = "LockedTask (lock_min_hold)" if use_lock else "a plain task"
        line = (
            f"nightly report, two celery beat schedulers every {BEAT_EVERY:g} s for "
            f"{options['seconds']:g} s, {label}: {written} report(s) written in {ticks} tick(s)"
        )
        emit_result(self, line, result, options["json"])

    def with_scheduler(self, options: dict[str, Any]) -> None:
        """``--servers`` processes run ``manage.py redlock scheduler`` with one entry, every
        second, for ``--seconds``; the one running the first report is SIGKILLed in the
        middle of it. Each tick's report is written once; the killed run is not run again."""
        servers, seconds = options["servers"], options["seconds"]
        manage = [sys.executable, sys.argv[0]] if sys.argv[0].endswith("manage.py") else [
            sys.executable, "-m", "django"]  # fmt: skip
        with tempfile.TemporaryDirectory(prefix="nightly-scheduler-") as scratch:
            entry = {"CALL": "testproject.inventory.jobs.report", "EVERY": 1, "TTL": 2}
            entry["ARGS"] = [scratch]
            env = {**os.environ, "DEMO_SCHEDULE": json.dumps({"nightly-report": entry})}
            command = [*manage, "redlock", "scheduler", "--for", f"{seconds:g}"]
            processes = [_start(command, env) for _ in range(servers)]
            killed = None
            try:
                deadline = time.monotonic() + 30
                while not (starts := list(Path(scratch).glob("start-*"))):
                    if time.monotonic() > deadline:
                        break
                    time.sleep(0.01)
                if starts:  # the scheduler running the first report dies in the middle of it
                    _, killed_tick, pid = starts[0].name.split("-")
                    killed = (killed_tick, int(pid))
                    os.kill(int(pid), signal.SIGKILL)
                for process in processes:
                    process.wait(seconds + 60)
            finally:
                for process in processes:
                    stop_group(process)
            started = [p.name.split("-")[1] for p in Path(scratch).glob("start-*")]
            reports = [p.name.split("-")[1] for p in Path(scratch).glob("report-*.txt")]
        per_tick = {tick: reports.count(tick) for tick in started}
        duplicates = sum(1 for count in per_tick.values() if count > 1)
        interrupted = sorted(tick for tick, count in per_tick.items() if count == 0)
        result = {
            "schedulers": servers,
            "scheduler": True,
            "ticks": len(set(started)),
            "runs_started": len(started),
            "reports": len(reports),
            "duplicates": duplicates,
            "interrupted": interrupted,
            "killed_tick": None if killed is None else killed[0],
        }
        line = (
            f"nightly report, {servers} servers running redlock scheduler every 1 s for "
            f"{seconds:g} s, one SIGKILLed in the middle of a run: {len(set(started))} ticks, "
            f"{len(reports)} report(s), {duplicates} tick(s) run twice, interrupted (not run "
            f"again): {', '.join(interrupted) or 'none'}"
        )
        emit_result(self, line, result, options["json"])


#: The schedulers send the job this often, seconds.
BEAT_EVERY = 2.0


def _start(argv: list[str], env: dict[str, str]) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        start_new_session=True,
    )  # fmt: skip
