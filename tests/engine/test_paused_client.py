"""A client paused past ``NODE_TIMEOUT`` while its reply is on the way (a garbage-collector pass
over a large heap, CPU starvation in a busy container) reads the reply that arrived meanwhile
instead of blaming a healthy node. The pauses are real: the test SIGSTOPs the client process
for 0.2 s (four times the 50 ms ``NODE_TIMEOUT``), over and over, while it locks."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable

import pytest
from django.conf import settings

from django_redlock.locking.manager import LockManager
from django_redlock.testing import RedisNodes
from tests.support import engine_workers as workers
from tests.support.processes import PROCESSES


@pytest.mark.parametrize("count", [1, 3])
def test_a_paused_caller_reads_the_replies_that_arrived(
    redis_node_factory: Callable[..., RedisNodes],
    redlock_alias: Callable[..., LockManager],
    count: int,
) -> None:
    """Every acquire and release of a client stopped 12 times for 0.2 s succeeds. Stops that
    landed while it waited for a reply used to fail the call with NodesUnavailable ("timed
    out"), the reply already in the socket, or leave a release unconfirmed."""
    manager = redlock_alias(redis_node_factory(count), TTL=10.0)
    redlock = {manager.alias: settings.REDLOCK[manager.alias]}
    with PROCESSES.Pool(1) as pool:
        pid = pool.apply(os.getpid)
        running = pool.apply_async(workers.acquire_while_paused, (redlock, manager.alias, 4.0))
        time.sleep(0.5)  # it is locking
        for _ in range(12):
            os.kill(pid, signal.SIGSTOP)
            time.sleep(0.2)
            os.kill(pid, signal.SIGCONT)
            time.sleep(0.05)
        outcomes = running.get(30)
    assert set(outcomes) == {"ok"}, outcomes
    assert outcomes["ok"] > 12
