"""The Celery worker the Celery test modules share (one per session: the app's broker
settings are process-wide, so two workers of one test process would see each other's
messages and results)."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis
from django.conf import settings
from django.db import connection

from testproject.inventory.demo_run import stop_group
from tests.jobs import celery_app
from tests.jobs.celery_app import app
from tests.jobs.test_celery import ROOT, WAIT, Worker, _close_clients


@pytest.fixture(scope="session")
def worker(
    redis_node_factory_session: Callable[..., Any],
    _session_redlock: None,
    django_db_setup: None,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Worker]:
    """``celery worker --pool=prefork --concurrency=2`` on a fresh redis-server, shared by
    every Celery test module of the session (its app module registers the tasks of
    ``celery_app`` and of ``celery_probe_app``), stopped by PID at the end (SIGTERM, SIGKILL
    after 8 s)."""
    broker = redis_node_factory_session(1)[0]
    base = broker.url.rsplit("/", 1)[0]
    celery_app.configure(base)
    log = tmp_path_factory.mktemp("celery") / "worker.log"
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "tests.support.subprocess_settings",
        "REDLOCK_JSON": json.dumps(settings.REDLOCK),
        "TEST_DATABASE_NAME": str(connection.settings_dict["NAME"]),
        "REDLOCK_CELERY_REDIS": base,
        "PYTHONPATH": str(ROOT),
    }
    argv = [sys.executable, "-m", "celery", "-A", "tests.jobs.celery_probe_app", "worker"]
    argv += ["--pool=prefork", "--concurrency=2", "--loglevel=warning", "--hostname=redlock@%h"]
    argv += ["--without-heartbeat", "--without-gossip", "--without-mingle"]
    with log.open("wb") as out:
        process = subprocess.Popen(
            argv, env=env, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
    running = Worker(process, log, env)
    try:
        deadline = time.monotonic() + WAIT
        while not app.control.ping(timeout=0.3):
            if process.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"the Celery worker did not start:\n{running.log_tail()}")
        yield running
    finally:
        stop_group(process)
        # The broker goes first: a connection of this process still waiting for a BRPOP
        # reply (a control.ping the worker never answered) is then closed by its socket's
        # end, where closing it against a live broker blocked on that reply for good.
        broker.stop()
        with contextlib.suppress(redis.exceptions.ConnectionError, OSError):
            _close_clients()
