"""The effect ledger across real processes: a worker SIGKILLed inside its effect leaves it
interrupted for the next holder, and a redelivered run of a done effect sees it done."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from django.conf import settings
from django.db import connection

from django_redlock.models import Effect

ROOT = Path(__file__).resolve().parent.parent.parent
pytestmark = pytest.mark.django_db(transaction=True)


def _worker(mode: str, name: str, key: str, flag: Path) -> subprocess.Popen[str]:
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "tests.support.subprocess_settings",
        "REDLOCK_JSON": json.dumps(settings.REDLOCK),
        "TEST_DATABASE_NAME": str(connection.settings_dict["NAME"]),
        "PYTHONPATH": str(ROOT),
    }
    argv = [sys.executable, "-m", "tests.support.effect_worker", mode, name, key, str(flag)]
    return subprocess.Popen(
        argv, env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def _run(name: str, key: str, flag: Path) -> dict[str, object]:
    worker = _worker("run", name, key, flag)
    out, err = worker.communicate(timeout=60)
    assert worker.returncode == 0, err
    state: dict[str, object] = json.loads(out.strip().splitlines()[-1])
    return state


def test_a_worker_killed_inside_its_effect_leaves_it_interrupted(
    unique_name: str, tmp_path: Path
) -> None:
    key = f"charge:{unique_name}"
    flag = tmp_path / "began"
    hung = _worker("hang", unique_name, key, flag)
    try:
        deadline = time.monotonic() + 30
        while not flag.exists():  # the worker began the effect
            assert hung.poll() is None, hung.communicate()[1]
            assert time.monotonic() < deadline
            time.sleep(0.05)
    finally:
        os.kill(hung.pid, signal.SIGKILL)
        hung.communicate(timeout=10)
    killed_token = int(flag.read_text())
    row = Effect.objects.get(key=key)
    assert (row.state, row.token) == ("begun", killed_token)
    after = _run(unique_name, key, flag)  # waits out the killed worker's 1 s lease
    assert after["interrupted"] is True and after["pending"] is True
    assert after["attempts"] == 2
    assert isinstance(after["token"], int) and after["token"] > killed_token
    assert Effect.objects.get(key=key).state == "done"
    redelivered = _run(unique_name, key, flag)
    assert redelivered["done"] is True and redelivered["pending"] is False
    assert Effect.objects.get(key=key).attempts == 2


def test_redeliveries_of_a_done_effect_see_it_done(unique_name: str, tmp_path: Path) -> None:
    key = f"mail:{unique_name}"
    first = _run(unique_name, key, tmp_path / "unused")
    assert (first["pending"], first["interrupted"]) == (True, False)
    for _ in range(2):
        assert _run(unique_name, key, tmp_path / "unused")["done"] is True
    row = Effect.objects.get(key=key)
    assert (row.state, row.attempts, row.token) == ("done", 1, first["token"])
