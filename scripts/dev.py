#!/usr/bin/env python3
"""The README's two commands; needs only Python 3.11+ (standard library).

    python3 scripts/dev.py test [pytest args...]   # the whole suite, in parallel (-n 0: serially)
    python3 scripts/dev.py demo                    # 3 local redis nodes, migrate, the demo

Both create ``.venv`` in the repository root when missing and install the project into it
(``pip install -e ".[dev]"``), only when ``pyproject.toml`` or the Python changed since the
last install, so a second run starts at once.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
VENV = ROOT / ".venv"
STAMP = VENV / ".django-redlock-install"
DEMO_PORTS = (7001, 7002, 7003)


def say(message: str) -> None:
    """One short progress line."""
    print(f"[dev] {message}", flush=True)


def venv_python() -> Path:
    """The virtualenv's interpreter."""
    if os.name == "nt":
        return VENV / "Scripts" / "python.exe"
    return VENV / "bin" / "python"


def install_fingerprint() -> str:
    """Hash of what decides the install: pyproject.toml, the venv's Python, the checkout path."""
    digest = hashlib.sha256()
    digest.update((ROOT / "pyproject.toml").read_bytes())
    cfg = VENV / "pyvenv.cfg"
    digest.update(cfg.read_bytes() if cfg.exists() else b"")
    digest.update(str(ROOT).encode())
    return digest.hexdigest()


def ensure_venv() -> Path:
    """Create ``.venv`` and install the project with its dev extra, unless already done."""
    python = venv_python()
    if not python.exists():
        say(f"creating virtualenv {VENV.relative_to(ROOT)} with {sys.executable}")
        subprocess.run([sys.executable, "-m", "venv", str(VENV)], check=True)
    fingerprint = install_fingerprint()
    if STAMP.exists() and STAMP.read_text().strip() == fingerprint:
        say("virtualenv up to date")
        return python
    say('installing the project: pip install -e ".[dev]" (first run takes a minute)')
    started = time.monotonic()
    subprocess.run(
        [str(python), "-m", "pip", "install", "--disable-pip-version-check", "-q", "-e", ".[dev]"],
        cwd=ROOT,
        check=True,
    )
    STAMP.write_text(fingerprint + "\n")
    say(f"installed in {time.monotonic() - started:.0f} s")
    return python


def parallel_args(args: list[str]) -> list[str]:
    """pytest-xdist's options unless ``args`` chose their own (``-n``, ``-p no:xdist``):
    ``REDLOCK_TEST_WORKERS`` workers (default: twice the cores; the tests mostly wait on
    processes and timeouts), tests that share a node group or a process pool kept together
    (``--dist loadgroup``, groups made by tests/conftest.py). ``-n 0`` runs serially."""
    if any(arg == "no:xdist" or arg.startswith(("-n", "--numprocesses", "--dist")) for arg in args):
        return []
    workers = os.environ.get("REDLOCK_TEST_WORKERS") or str(max(2, 2 * (os.cpu_count() or 1)))
    return ["-n", workers, "--dist", "loadgroup"]


def cmd_test(args: list[str]) -> int:
    """Run pytest in the virtualenv from the repository root; its exit status is ours."""
    python = ensure_venv()
    database = os.environ.get("DATABASE_URL")
    extra = parallel_args(args)
    where = f"{extra[1]} workers" if extra else "as asked"
    say(f"pytest on {'PostgreSQL' if database else 'SQLite'}, {where} (serially: -n 0)")
    argv = [str(python), "-m", "pytest", *extra, *args]
    # The suite starts hundreds of Python processes and each xdist worker collects it: let
    # them keep bytecode (and pytest's rewritten test modules) instead of compiling every time.
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
    if os.name == "posix":
        os.chdir(ROOT)
        os.execv(argv[0], argv)  # signals and the exit status go straight to pytest
    return subprocess.call(argv, cwd=ROOT)


def port_free(port: int) -> bool:
    """True if nothing listens on 127.0.0.1:``port``."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def is_redis_process(pid: int) -> bool:
    """True if ``pid`` is a live redis-server (guards against a reused PID)."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        try:
            os.kill(pid, 0)
        except OSError:
            return False
        return not Path("/proc").is_dir()  # no /proc to check: trust kill(0)
    return b"redis-server" in cmdline


class DemoNodes:
    """Three redis nodes run by ``python -m django_redlock.testing serve`` in the virtualenv."""

    def __init__(self, python: Path) -> None:
        argv = [str(python), "-m", "django_redlock.testing", "serve", "--watch-stdin"]
        if all(port_free(port) for port in DEMO_PORTS):
            argv += ["--ports", ",".join(map(str, DEMO_PORTS))]
        else:
            say(f"some of ports {DEMO_PORTS} are busy; using free ports instead")
            argv += ["--count", str(len(DEMO_PORTS))]
        # stdin stays open while we live: if this script dies, EOF makes serve stop its nodes.
        self.proc = subprocess.Popen(
            argv, cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        self.node_pids: list[int] = []
        self.urls = ""
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            if line.startswith("node "):
                self.node_pids.append(int(line.rsplit("pid=", 1)[1]))
                say(line.strip())
            elif line.startswith("REDLOCK_NODES="):
                self.urls = line.strip().split("=", 1)[1]
                break
        if not self.urls:
            self.stop()
            raise SystemExit("[dev] the redis nodes did not start (see the error above)")

    def stop(self) -> None:
        """Stop serve (which stops its nodes), then make sure every node PID is gone."""
        proc = self.proc
        if proc.stdin is not None:
            with contextlib.suppress(OSError):
                proc.stdin.close()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.terminate()
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()
        for pid in self.node_pids:
            if is_redis_process(pid):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        say("redis nodes stopped")


def manage(python: Path, env: dict[str, str], *args: str, capture: bool = False) -> str:
    """Run ``manage.py`` with ``args``; exit with its status if it fails."""
    say("manage.py " + " ".join(args))
    result = subprocess.run(
        [str(python), "manage.py", *args], cwd=ROOT, env=env, text=True, capture_output=capture
    )
    if result.returncode != 0:
        if capture:
            sys.stderr.write(result.stdout + result.stderr)
        raise SystemExit(result.returncode)
    return result.stdout if capture else ""


SIDE_BY_SIDE = (
    ("in stock", "stock"),
    ("sold", "sold"),
    ("rejected as busy", "busy"),
    ("out of stock", "out_of_stock"),
    ("oversold", "oversold"),
    ("final stock", "final_stock"),
    ("orders/s", "orders_per_s"),
    ("lock wait p50 ms", "lock_wait_p50_ms"),
    ("lock wait p99 ms", "lock_wait_p99_ms"),
)


def side_by_side(runs: dict[str, dict[str, object]]) -> None:
    """Print the two oversell runs' numbers next to each other; on SQLite, how to rerun on PG."""
    labels = list(runs)
    print(f"\n{'oversell':<18}" + "".join(f"{label:>12}" for label in labels))
    for title, key in SIDE_BY_SIDE:
        cells = ["-" if runs[label][key] is None else str(runs[label][key]) for label in labels]
        print(f"{title:<18}" + "".join(f"{cell:>12}" for cell in cells))
    if runs[labels[0]]["database"] == "sqlite":
        print(
            "\nThat was SQLite. To rerun both on PostgreSQL (an empty database of its own):\n"
            "  createdb demo_redlock\n"
            "  DEMO_DATABASE_URL=postgres://USER@127.0.0.1:5432/demo_redlock "
            "python3 scripts/dev.py demo"
        )
    print(
        "The fencing story, with nodes running (`.venv/bin/python -m django_redlock.testing "
        "serve --ports 7001,7002,7003`\nin another terminal): .venv/bin/python manage.py zombie",
        flush=True,
    )


PAY_ROWS = (
    ("payments", "payments"),
    ("attempts", "attempts"),
    ("answers lost", "client_timeouts"),
    ("409 (still running)", "busy_409"),
    ("replayed", "replayed"),
    ("charges", "charges"),
    ("charged twice+", "charged_more_than_once"),
)
STAMPEDE_ROWS = (
    ("processes", "processes"),
    ("computes", "computes"),
    ("distinct values", "distinct_values"),
    ("slowest reader s", "slowest_reader_seconds"),
)


def table_of(
    title: str, rows: tuple[tuple[str, str], ...], runs: dict[str, dict[str, object]]
) -> None:
    """Print runs of one demo command next to each other, a column per run."""
    labels = list(runs)
    print(f"\n{title:<22}" + "".join(f"{label:>16}" for label in labels))
    for name, key in rows:
        print(f"{name:<22}" + "".join(f"{runs[label][key]!s:>16}" for label in labels))
    print(flush=True)


def compare(
    python: Path, env: dict[str, str], command: str, variants: dict[str, list[str]]
) -> dict[str, dict[str, object]]:
    """Run ``command`` once per variant (label -> flags), each writing its JSON result."""
    runs: dict[str, dict[str, object]] = {}
    with tempfile.TemporaryDirectory(prefix=f"redlock-{command}-") as tmp:
        for label, flags in variants.items():
            path = Path(tmp) / f"{len(runs)}.json"
            manage(python, env, command, *flags, "--json", str(path))
            runs[label] = json.loads(path.read_text())
    return runs


def cmd_demo(args: list[str]) -> int:
    """Start 3 nodes, migrate, run the checks and the oversell demo without and with the lock.

    The database is SQLite (``demo.sqlite3``), or ``DEMO_DATABASE_URL`` (postgres://...) if set.
    """
    if args:
        raise SystemExit(f"[dev] demo takes no arguments, got {args}")
    python = ensure_venv()
    if not (ROOT / "manage.py").exists():
        raise SystemExit("[dev] manage.py is missing: the demo project is not in this checkout")
    nodes = DemoNodes(python)
    try:
        env = dict(os.environ, REDLOCK_NODES=nodes.urls)
        env.pop("DATABASE_URL", None)  # never the tests' database: SQLite, or DEMO_DATABASE_URL
        if os.environ.get("DEMO_DATABASE_URL"):
            env["DATABASE_URL"] = os.environ["DEMO_DATABASE_URL"]
        say(f"REDLOCK_NODES={nodes.urls}")
        say("database: " + ("DEMO_DATABASE_URL" if "DATABASE_URL" in env else "demo.sqlite3"))
        manage(python, env, "migrate", "--noinput")
        manage(python, env, "check", "--deploy")
        commands = manage(python, env, "help", "--commands", capture=True).split()
        if "oversell" in commands:
            with tempfile.TemporaryDirectory(prefix="redlock-demo-") as tmp:
                runs: dict[str, dict[str, object]] = {}
                for label, flags in (("no lock", ["--no-lock"]), ("with lock", [])):
                    path = Path(tmp) / f"{len(runs)}.json"
                    manage(python, env, "oversell", *flags, "--json", str(path))
                    runs[label] = json.loads(path.read_text())
            side_by_side(runs)
        else:
            say("no `oversell` command yet: nodes, migrations and checks are all the demo has")
        if "checkout" in commands:
            say("carts of several products at once: lock_many, then without it")
            for flags in ([], ["--no-lock"]):
                manage(python, env, "checkout", *flags)
        if "nightly" in commands:
            say('"a nightly job on three servers": three start it at once, as their cron would')
            for flags in (["--no-lock"], []):
                manage(python, env, "nightly", *flags)
            say("the same job on REDLOCK_SCHEDULE: three servers run the scheduler, one killed")
            manage(python, env, "nightly", "--scheduler")
            say("the same job sent by two celery beat schedulers to a Celery worker")
            for flags in (["--no-lock"], []):
                manage(python, env, "nightly", "--celery", *flags)
        if "pay" in commands:
            say("a client retrying payments over a flaky network (answers lost, sent again)")
            runs = compare(python, env, "pay", {"no key": ["--no-key"], "Idempotency-Key": []})
            table_of("pay", PAY_ROWS, runs)
        if "stampede" in commands:
            say("8 processes miss one cache key at once (a 1 s compute)")
            runs = compare(
                python, env, "stampede", {"cache.get_or_set": ["--no-fill"], "the fill": []}
            )
            table_of("stampede", STAMPEDE_ROWS, runs)
    except KeyboardInterrupt:
        say("interrupted")
        return 130
    finally:
        nodes.stop()
    return 0


COMMANDS = {"test": cmd_test, "demo": cmd_demo}


def main(argv: list[str]) -> int:
    """Dispatch to a command."""
    if sys.version_info < (3, 11):  # noqa: UP036 - a bare python3 may be older than ours
        raise SystemExit("[dev] Python 3.11 or newer is needed")
    if not argv or argv[0] not in COMMANDS:
        print(__doc__, file=sys.stderr)
        return 2
    return COMMANDS[argv[0]](argv[1:])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
