"""Fork safety (docs/production.md): a lock manager used before ``os.fork()`` keeps
working in
the parent and in every child; no process reads a reply meant for another; a lease acquired
by the parent stays the parent's (in a child, releasing it raises ``LockError`` and sends
nothing). gunicorn ``--preload`` with a lock used at import is covered by
tests/test_demo_buy_endpoint.py.

The scenario runs in a fresh interpreter (tests/support/fork_scenario.py): forking the test
session itself also forks whatever earlier tests left in it (a Celery app's broker pools,
whose at-fork hooks hung the children and then the session's next Celery test)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from django_redlock.testing import RedisNodes
from tests.support import fork_scenario

Nodes = Callable[..., RedisNodes]
ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("count", [1, 5])
def test_forked_children_share_nothing_with_the_parent(
    redis_node_factory: Nodes, count: int
) -> None:
    """The parent uses the manager (connections, wake-up connections, a held lease), then forks
    4 children; parent and children run 200 lock/bump/unlock cycles each on one name: no
    errors, no lost increment, no token handed out twice, and the parent's lease is still the
    parent's (before the fix: children read each other's replies)."""
    nodes = redis_node_factory(count)
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "tests.support.subprocess_settings",
        "REDLOCK_JSON": json.dumps(
            {"default": {"NODES": nodes.urls}, "fork": {"NODES": nodes.urls, "TTL": 5.0}}
        ),
        "PYTHONPATH": str(ROOT),
    }
    done = subprocess.run(
        [sys.executable, "-m", "tests.support.fork_scenario", nodes[0].url],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=110,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    outcome = json.loads(done.stdout.strip().splitlines()[-1])
    tokens = outcome["tokens"]
    total = fork_scenario.CYCLES * (fork_scenario.CHILDREN + 1)
    assert outcome["refusals"] == [True] * fork_scenario.CHILDREN, "a child released the parent's"
    assert outcome["errors"] == 0
    assert outcome["counter"] == total
    assert len(set(tokens)) == len(tokens) == total
    assert outcome["parent_lost"] is False and outcome["parent_released"] is True
