"""The installed wheel, used as a new team would: run by the Python of a clean virtualenv that
has only ``django-redlock[server]`` from the wheel (no repository on ``sys.path``, no dev
extras). It starts a node with ``python -m django_redlock.testing serve``, makes a new Django
project with ``django-admin startproject`` and an app with a ``FencedModel``, then runs
``check``, ``makemigrations``, ``migrate``, a lock, a fenced save (and a stale one refused) and
``manage.py redlock list``. Exits non-zero, saying which step failed, on any failure."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

MODELS = """
from django.db import models
from django_redlock.models import FencedModel


class Product(FencedModel):
    stock = models.PositiveIntegerField(default=0)

    class Meta(FencedModel.Meta):
        ordering = ["id"]
"""

SETTINGS = """
INSTALLED_APPS += ["django_redlock", "shop"]
REDLOCK = {{"default": {{"NODES": [{url!r}]}}}}
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


def main() -> None:
    bin_dir = Path(sys.executable).parent
    python = sys.executable
    work = Path(tempfile.mkdtemp(prefix="redlock-smoke-"))
    server = subprocess.Popen(
        [python, "-m", "django_redlock.testing", "serve", "--count", "1", "--watch-stdin"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        cwd=work,
    )
    try:
        assert server.stdout is not None
        url = ""
        for line in server.stdout:
            if line.startswith("REDLOCK_NODES="):
                url = line.strip().partition("=")[2]
                break
        if not url:
            raise SystemExit("package smoke test: python -m django_redlock.testing serve failed")
        run("startproject", [str(bin_dir / "django-admin"), "startproject", "smoke"], work)
        project = work / "smoke"
        run("startapp", [python, "manage.py", "startapp", "shop"], project)
        (project / "shop" / "models.py").write_text(MODELS)
        settings = project / "smoke" / "settings.py"
        settings.write_text(settings.read_text() + SETTINGS.format(url=url))
        env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # nothing of the checkout
        run("check", [python, "manage.py", "check"], project, env=env)
        run("makemigrations", [python, "manage.py", "makemigrations", "shop"], project, env=env)
        run("migrate", [python, "manage.py", "migrate"], project, env=env)
        shell = [python, "manage.py", "shell", "-c", LOCK_AND_SAVE]
        out = run("a lock and a fenced save", shell, project, env=env)
        assert "SMOKE OK" in out
        run("redlock list", [python, "manage.py", "redlock", "list"], project, env=env)
        print("package smoke test: all green")
    finally:
        if server.stdin is not None:
            server.stdin.close()
        server.wait(timeout=30)


if __name__ == "__main__":
    main()
