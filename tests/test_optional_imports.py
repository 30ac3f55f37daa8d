"""The core imports none of the optional observability libraries (docs/observability.md): a fresh
interpreter
in which importing them fails loads every module of django_redlock outside ``contrib`` and
takes and releases a lock, blocking and asyncio, on a real node."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from django_redlock.testing import RedisNode

ROOT = Path(__file__).resolve().parent.parent
BLOCKED = (
    "prometheus_client",
    "opentelemetry",
    "debug_toolbar",
    "django_prometheus",
    "health_check",
    "rq",
    "django_tasks",
    "django_tasks_db",
    "celery",
)

SCRIPT = textwrap.dedent(
    """
    import asyncio, importlib, importlib.abc, pkgutil, sys

    BLOCKED = {blocked!r}

    class Block(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in BLOCKED:
                raise ImportError(f"{{name}} is blocked in this test")
            return None

    sys.meta_path.insert(0, Block())
    import django
    from django.conf import settings

    settings.configure(
        INSTALLED_APPS=[
            "django.contrib.admin", "django.contrib.auth", "django.contrib.contenttypes",
            "django.contrib.sessions", "django.contrib.messages", "django_redlock",
        ],
        DATABASES={{"default": {{"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"}}}},
        REDLOCK={{"default": {{"NODES": [{url!r}]}}}},
    )
    django.setup()
    import django_redlock

    skipped = ("django_redlock.contrib.", "django_redlock.pytest_plugin")
    for module in pkgutil.walk_packages(django_redlock.__path__, "django_redlock."):
        if not module.name.startswith(skipped):
            importlib.import_module(module.name)
    from django_redlock import locks

    with locks["default"].lock("optional-imports", timeout=1) as lease:
        assert lease.token > 0

    async def main():
        async with locks["default"].alock("optional-imports", timeout=1):
            pass

    asyncio.run(main())
    loaded = sorted(m for m in sys.modules if m.split(".")[0] in BLOCKED)
    assert not loaded, loaded
    print("ok")
    """
)


def test_the_core_runs_with_the_optional_libraries_blocked(redis_node: RedisNode) -> None:
    """Exit 0 and "ok": no core module imports them, and a lock works without them."""
    script = SCRIPT.format(blocked=BLOCKED, url=redis_node.url)
    result = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0 and result.stdout.strip() == "ok", result.stderr[-3000:]


def test_the_block_works(redis_node: RedisNode) -> None:
    """The same interpreter fails when a contrib module that needs one of them is imported
    (so the first test would notice an import of a blocked library)."""
    script = SCRIPT.format(blocked=BLOCKED, url=redis_node.url).replace(
        'skipped = ("django_redlock.contrib.", ',
        'importlib.import_module("django_redlock.contrib.prometheus.metrics")\n'
        'skipped = ("django_redlock.contrib.", ',
    )
    result = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert result.returncode != 0 and "prometheus_client is blocked" in result.stderr


@pytest.mark.parametrize(
    ("module", "library"),
    [("django_redlock.contrib.rq", "rq"), ("django_redlock.contrib.tasks", "django_tasks")],
)
def test_the_queue_modules_need_their_queue(
    redis_node: RedisNode, module: str, library: str
) -> None:
    """contrib.rq needs rq and contrib.tasks needs a task framework (django.tasks, which this
    Django has not, or the django-tasks backport): blocked, their import fails, and only
    theirs (the core's unique-task part, django_redlock.jobs.unique, loaded above)."""
    script = SCRIPT.format(blocked=BLOCKED, url=redis_node.url).replace(
        'skipped = ("django_redlock.contrib.", ',
        f'importlib.import_module({module!r})\nskipped = ("django_redlock.contrib.", ',
    )
    result = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert result.returncode != 0 and f"{library} is blocked" in result.stderr, result.stderr
