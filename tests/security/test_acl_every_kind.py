"""The documented ACL user (its alias's key prefix and the commands docs/production.md lists)
takes every kind of lease with waiters, hand-offs and wake-ups: the scripts of semaphores,
read-write leases and limits call nothing the list leaves out. Real nodes and ACL users;
the oracle is that every step succeeds and no node logged a denial."""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from django_redlock.engine import scripts
from django_redlock.locking.manager import LockManager
from django_redlock.testing import RedisNodes
from tests.support.redis_acl import ACL_COMMANDS, acl_user_urls

DOCS = Path(__file__).resolve().parents[2] / "docs"
PREFIX = "aclkinds:"


def _documented(page: str) -> set[str]:
    """The commands of the ``ACL SETUSER`` example on ``page``."""
    text = (DOCS / page).read_text()
    block = text[text.index("ACL SETUSER") :].split("```")[0]
    return {c[1:].lower() for c in block.split() if c.startswith("+")}


def _called() -> set[str]:
    """Every command any Lua of the package calls (the scripts and their fragments)."""
    package = Path(scripts.__file__).resolve().parents[2]
    text = "\n".join(p.read_text() for p in package.rglob("*.py"))
    return {c.lower() for c in re.findall(r"redis\.p?call\('([A-Z]+)'", text)}


def test_every_command_the_scripts_call_is_documented() -> None:
    """The documented ACL lists (both pages, and the tests' user) name every command the
    scripts call, so a user given exactly that list never meets NOPERM inside a script."""
    called = _called()
    assert {"get", "set", "zadd", "hincrby"} <= called  # the scan found the scripts
    tests_list = {c[1:].lower() for c in ACL_COMMANDS.split()}
    for page in ("production.md", "algorithm.md"):
        assert called <= _documented(page), (page, sorted(called - _documented(page)))
    assert called <= tests_list, sorted(called - tests_list)


def _hand_off(
    manager: LockManager, take: Callable[[], Any], wait_for: Callable[[], Any] | None = None
) -> None:
    """A holder holds (``take``); a thread waits (``wait_for``, else ``take``: registered,
    blocked); the holder lets go and the waiter gets it at once through the wake-up."""
    holder = take()
    waiter = wait_for or take
    got: list[Any] = []
    errors: list[BaseException] = []

    def wait() -> None:
        try:
            got.append(waiter())
        except BaseException as exc:  # handed to the test
            errors.append(exc)

    thread = threading.Thread(target=wait)
    thread.start()
    deadline = time.monotonic() + 10
    while manager.engine.waiters.value < 1:
        assert time.monotonic() < deadline, "the waiter never waited"
        time.sleep(0.01)
    time.sleep(0.05)  # now registered and blocked, most likely
    holder.__exit__(None, None, None) if hasattr(holder, "__exit__") else holder.release()
    thread.join(15)
    assert not errors, errors
    assert got, "the waiter hung"
    last = got[0]
    last.__exit__(None, None, None) if hasattr(last, "__exit__") else last.release()


@pytest.mark.parametrize("kind", ["lock", "semaphore", "read-write", "limits"])
@pytest.mark.parametrize("count", [1, 3])
def test_the_documented_acl_user_takes_every_kind_with_waiters(
    redis_node_factory: Callable[..., RedisNodes],
    redlock_alias: Callable[..., LockManager],
    kind: str,
    count: int,
) -> None:
    nodes = redis_node_factory(count)
    urls = acl_user_urls(nodes, "kinds", "K1nds-pw", PREFIX)
    for node in nodes:
        node.client().execute_command("ACL", "LOG", "RESET")
    manager = redlock_alias(urls, KEY_PREFIX=PREFIX, TTL=10, RETRY_DELAY=2.0)

    if kind == "lock":
        _hand_off(manager, lambda: manager.acquire("n", timeout=10))
    elif kind == "semaphore":
        first = manager.acquire("s", permits=1, timeout=0)
        first.release()
        _hand_off(manager, lambda: manager.acquire("s", permits=1, timeout=10))
    elif kind == "read-write":
        readers = [manager.acquire("rw", rw="read", timeout=0) for _ in range(2)]
        for lease in readers:
            assert lease.release() is True
        _hand_off(manager, lambda: manager.acquire("rw", rw="write", timeout=10))
        _hand_off(
            manager,
            lambda: manager.acquire("rw", rw="write", timeout=10),
            lambda: manager.acquire("rw", rw="read", timeout=10),
        )
        _hand_off(
            manager,
            lambda: manager.acquire("rw", rw="read", timeout=10),
            lambda: manager.acquire("rw", rw="write", timeout=10),
        )
    else:

        def take_limits() -> Any:
            block = manager.limits({"a": 1, "b": 2}, timeout=10)
            block.__enter__()
            return block

        _hand_off(manager, take_limits)
    for node in nodes:
        denied = node.client().execute_command("ACL", "LOG")
        assert not denied, f"a command was denied: {denied}"
