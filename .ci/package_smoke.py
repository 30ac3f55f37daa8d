"""The installed wheel, used as a new team would: run by the Python of a clean virtualenv that
has only ``django-redlock[server]`` from the wheel (no repository on ``sys.path``, no dev
extras). It starts a node with ``python -m django_redlock.testing serve``, makes a new Django
project with ``django-admin startproject`` and an app ``shop``, then follows the README's quick
start as written, in order: each Python block headed by a file name goes into that file (a
``[..., x]`` list extends the project's own), each other Python block runs in ``manage.py
shell``, each ``python manage.py`` line of a shell block runs, the ``redlock run`` job runs
(twice: the second is skipped). Then it checks what the steps promise: the locked view replays
a retry with the same ``Idempotency-Key``, the run-once job leaves its name taken, a stale
token's write is refused, ``manage.py redlock list`` works. Exits non-zero, saying which step
failed, on any failure."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

README = Path(__file__).resolve().parent.parent / "README.md"
#: a Python block's first line naming the file it belongs to (``# shop/models.py``)
FILE_HEADER = re.compile(r"^# ([\w/]+\.py)\b")
#: ``NAME = [..., more]``: the user's existing list, extended
ELLIPSIS_LIST = re.compile(r"^(\w+) = \[\.\.\., ", re.M)
FENCE = re.compile(r"^```(\w+)\n(.*?)^```", re.S | re.M)

APP_SETTINGS = """
INSTALLED_APPS += ["shop"]  # the app the quick start makes (startapp shop)
"""

REPORT_SCRIPT = "#!/bin/sh\necho report built\n"

VIEW_AND_JOB = """
from django.test import Client
from django_redlock import locks
from django_redlock.exceptions import LockNotAcquired
from shop.jobs import nightly_report

client = Client(HTTP_HOST="localhost")
first = client.post("/pay/7/", HTTP_IDEMPOTENCY_KEY="k1")
again = client.post("/pay/7/", HTTP_IDEMPOTENCY_KEY="k1")
assert first.status_code == 200 and first.json() == {"order": 7, "charged": True}, first
assert again.status_code == 200 and again.headers.get("Idempotent-Replayed") == "true", again
assert again.content == first.content

assert nightly_report("2026-12-05") is None  # it ran; min_hold keeps its name taken an hour
try:
    locks["default"].acquire("report:2026-12-05", timeout=0)
except LockNotAcquired:
    pass
else:
    raise AssertionError("the run-once job's name was free right after it ran")
print("VIEW AND JOB OK")
"""

LOCK_AND_SAVE = """
import django_redlock
from importlib.metadata import version
from django_redlock import locks
from shop.models import Product

assert django_redlock.__version__ == version("django-redlock"), "two version sources"
product = Product.objects.create(stock=5)
with locks["default"].lock(f"product:{product.pk}", ttl=10, timeout=5) as old:
    pass
with locks["default"].lock(f"product:{product.pk}", ttl=10, timeout=5) as new:
    row = Product.objects.claim(pk=product.pk)
    row.stock -= 1
    row.save()
assert new.token > old.token
stale = Product.objects.fenced(old.token).filter(pk=product.pk).update(stock=100)
assert stale == 0, "a stale token's write went through"
assert Product.objects.get(pk=product.pk).stock == 4
print("SMOKE OK")
"""


def run(step: str, args: list[str], cwd: Path, **kwargs: object) -> str:
    print(f"== {step}: {' '.join(args)}", flush=True)
    done = subprocess.run(  # type: ignore[call-overload]
        args, cwd=cwd, capture_output=True, text=True, timeout=300, **kwargs
    )
    print(done.stdout, end="")
    if done.returncode != 0:
        print(done.stderr, file=sys.stderr)
        raise SystemExit(f"package smoke test: {step} failed (exit {done.returncode})")
    return str(done.stdout)


def quick_start() -> list[tuple[str, str]]:
    """The README's quick start: its fenced blocks in order, as (language, text)."""
    text = README.read_text()
    start = text.index("## Quick start")
    section = text[start : text.index("\n## ", start + 1)]
    return [(match.group(1), match.group(2)) for match in FENCE.finditer(section)]


def follow_readme(project: Path, python: str, port: int, env: dict[str, str]) -> None:
    """Each block of the quick start, as a reader types it in (see the module)."""
    shell_env = {**env, "PATH": f"{Path(python).parent}{os.pathsep}{env.get('PATH', '')}"}
    for number, (language, block) in enumerate(quick_start(), 1):
        block = block.replace("6380", str(port))
        header = FILE_HEADER.match(block)
        where = f"README quick start, block {number}"
        if language == "python" and header:
            name = header.group(1)
            target = project / ("smoke/" + name if "/" not in name else name)
            code = ELLIPSIS_LIST.sub(lambda m: f"{m.group(1)} = [*{m.group(1)}, ", block)
            if name in ("settings.py", "urls.py"):  # the project's own: extended
                target.write_text(target.read_text() + "\n" + code)
            else:  # the app's module: as written
                target.write_text(code)
            print(f"== {where}: wrote {target.relative_to(project)}", flush=True)
        elif language == "python":
            if "django_redlock.contrib." in block:  # an extra this install does not have
                print(f"== {where}: skipped (needs an extra)", flush=True)
                continue
            run(where, [python, "manage.py", "shell", "-c", block], project, env=env)
        elif language in ("bash", "sh"):
            for line in block.splitlines():
                if line.startswith("python manage.py"):
                    out = run(f"{where}: {line}", ["sh", "-c", line], project, env=shell_env)
                    if "redlock run" in line:
                        second = run(f"{where}, again", ["sh", "-c", line], project, env=shell_env)
                        assert "report built" in out and "report built" not in second, (
                            "redlock run --skip-busy --min-hold ran the job twice"
                        )


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def main() -> None:
    bin_dir = Path(sys.executable).parent
    python = sys.executable
    work = Path(tempfile.mkdtemp(prefix="redlock-smoke-"))
    port = free_port()
    server = subprocess.Popen(
        [python, "-m", "django_redlock.testing", "serve", "--count", "1", "--ports", str(port),
         "--watch-stdin"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        cwd=work,
    )  # fmt: skip
    try:
        assert server.stdout is not None
        if not any(line.startswith("REDLOCK_NODES=") for line in server.stdout):
            raise SystemExit("package smoke test: python -m django_redlock.testing serve failed")
        run("startproject", [str(bin_dir / "django-admin"), "startproject", "smoke"], work)
        project = work / "smoke"
        run("startapp", [python, "manage.py", "startapp", "shop"], project)
        settings = project / "smoke" / "settings.py"
        settings.write_text(settings.read_text() + APP_SETTINGS)
        (project / "build_report.sh").write_text(REPORT_SCRIPT)
        (project / "build_report.sh").chmod(0o755)
        env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # nothing of the checkout
        follow_readme(project, python, port, env)
        run("check", [python, "manage.py", "check"], project, env=env)
        shell = [python, "manage.py", "shell", "-c", LOCK_AND_SAVE]
        assert "SMOKE OK" in run("a lock and a fenced save", shell, project, env=env)
        shell = [python, "manage.py", "shell", "-c", VIEW_AND_JOB]
        assert "VIEW AND JOB OK" in run("the locked view, the job", shell, project, env=env)
        listed = run("redlock list", [python, "manage.py", "redlock", "list"], project, env=env)
        assert "report:2026-12-05" in listed and "nightly-report" in listed, listed
        print("package smoke test: all green (the README's quick start included)")
    finally:
        if server.stdin is not None:
            server.stdin.close()
        server.wait(timeout=30)


if __name__ == "__main__":
    main()
