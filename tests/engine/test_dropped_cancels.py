"""A cancellation that lands as a send to a node completes: redis-py sends under
``asyncio.wait_for`` (the connection has a socket timeout), and before Python 3.12 ``wait_for``
returns the send's result when its caller is cancelled in the same turn of the event loop, so
the cancel never reaches the caller. The engine's sends through redis-py raise it again: a
cancelled waiter stops at once instead of waiting out its ``BLPOP``. Real nodes."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Callable

import pytest
import redis.asyncio

from django_redlock.engine.transport import redis_py
from django_redlock.locking.manager import LockManager
from django_redlock.testing import RedisNodes


async def _cancelled_as_the_send_completes(coroutine: object) -> str:
    """Run ``coroutine`` in a task and cancel it once it waits for its send (the send's own
    task is scheduled and completes in the same turn as the cancel); how it ended."""
    task = asyncio.ensure_future(coroutine)  # type: ignore[arg-type]
    await asyncio.sleep(0)  # the task runs up to wait_for: the send is scheduled, not run
    task.cancel()
    try:
        await task
    except asyncio.CancelledError:
        return "cancelled"
    return "went on"


def test_redis_py_drops_such_a_cancel_and_asend_raises_it(
    redis_node_factory: Callable[..., RedisNodes],
) -> None:
    """The cause, shown on this Python, and the remedy: a plain ``send_packed_command`` goes
    on after the cancel (before 3.12), :func:`redis_py.asend` ends with it."""
    node = redis_node_factory(1)[0]

    async def main() -> tuple[str, str]:
        conn = redis.asyncio.Connection(host="127.0.0.1", port=node.port, socket_timeout=5)
        await conn.connect()
        ping = conn.pack_command("PING")
        plain = await _cancelled_as_the_send_completes(
            conn.send_packed_command(ping, check_health=False)
        )
        await conn.disconnect()
        await conn.connect()
        ours = await _cancelled_as_the_send_completes(redis_py.asend(conn, ping))
        await conn.disconnect()
        return plain, ours

    plain, ours = asyncio.run(main())
    if sys.version_info < (3, 12):
        assert plain == "went on", "redis-py no longer drops it: the test shows nothing"
    assert ours == "cancelled"


@pytest.mark.parametrize("nodes", [1, 3])
def test_a_wait_cancelled_as_its_blpop_is_sent_ends_at_once(
    redis_node_factory: Callable[..., RedisNodes],
    redlock_alias: Callable[..., LockManager],
    nodes: int,
) -> None:
    """An engine's wait for a release (on a pooled wake-up connection) is cancelled as its
    ``BLPOP`` is written: it raises CancelledError instead of blocking its 5 s out."""
    manager = redlock_alias(redis_node_factory(nodes), TTL=10)
    engine = manager.engine

    async def main() -> str:
        await engine.await_release("n", 0.05)  # leaves a pooled wake-up connection
        return await _cancelled_as_the_send_completes(engine.await_release("n", 5.0))

    assert asyncio.run(main()) == "cancelled"
