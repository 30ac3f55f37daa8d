"""Judging a master's failover from a shop workload's history without trusting when a worker
happened to run.

* **Who granted a lease: its token.** Take :func:`token_floor` just before the kill. The old
  master's counter started at the clock floor (``unix ms x 1024``) of its first grant and no
  server grants 1,024 locks a millisecond, so every token it gave is below; a client raises the
  promoted replica's counter to the clock floor of the moment it rejoins (after the promotion,
  so after the kill) before it votes, so every token the replica gives is above.
* **When:** a completion's ``sent`` was stamped before its acquire call (every attempt, the
  granting one too, went out later) and ``acquired`` once the block was entered (the grant
  came earlier).
* **The promotion:** :func:`wait_promoted` returns when a poll that still found the replica a
  replica was sent; the promotion came after.

So the old master granted nothing after the kill if no lease below the floor was sent after it,
and the promoted replica kept its quarantine (one longest TTL from when each process first saw
it, so from after its promotion) if no lease above the floor was entered earlier than that.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from typing import Any

import redis

from django_redlock.engine.plans.trust import CLOCK_FLOOR
from django_redlock.testing.node import RedisNode


def now() -> int:
    """The histories' clock (``time.monotonic_ns()``)."""
    return time.monotonic_ns()


def token_floor() -> int:
    """The clock floor now: take it just before the kill (see the module docstring)."""
    return int(time.time() * 1000) * CLOCK_FLOOR


def wait_promoted(replica: RedisNode, since: int, timeout: float = 30.0) -> int:
    """Poll ``replica``'s role until it is a master; returns when a poll that still found it a
    replica was sent (``since`` if none did): the promotion came after that."""
    client = replica.client(decode_responses=True)
    last = since
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            asked = now()
            try:
                role = client.execute_command("ROLE")[0]
            except redis.RedisError:
                role = None
            if role == "master":
                return last
            if role is not None:
                last = asked
            time.sleep(0.005)
    finally:
        client.close()
    raise AssertionError(f"{replica!r} was not promoted within {timeout} s")


def granted_fences(replica: RedisNode, fences: Iterable[str], cluster: bool) -> frozenset[str]:
    """The hashes of ``fences`` that ``replica`` holds with a lease granted (a grant records the
    longest TTL there): the replica is quarantined for them once promoted. A replica that never
    received them is trusted at once (docs/algorithm.md), so its grants are not judged."""
    client = replica.client(decode_responses=True, single_connection_client=True)
    try:
        if cluster:
            client.execute_command("READONLY")  # a cluster replica serves reads only after it
        return frozenset(f for f in fences if int(client.hget(f, "max_ttl") or 0) > 0)
    finally:
        client.close()


def failover_anomalies(
    granted: Iterable[dict[str, Any]],
    *,
    floor: int,
    killed: int,
    promoted_after: int,
    quarantine: float,
    judged: Callable[[dict[str, Any]], bool],
) -> tuple[list[str], list[dict[str, Any]]]:
    """The anomalies among the leases of the failed-over master (``granted``: the history's
    granted completions on it; ``judged``: whether the promoted replica was quarantined for an
    event's shard; ``quarantine``: its length, seconds), and the promoted replica's grants that
    were judged."""
    anomalies: list[str] = []
    by_new: list[dict[str, Any]] = []
    end = promoted_after + quarantine * 1e9
    for event in granted:
        if event["token"] == floor:
            anomalies.append(f"a token equal to the clock floor: {event}")
        elif event["token"] < floor:
            if event["sent"] > killed:
                anomalies.append(f"the old master's counter, sent after the kill: {event}")
        elif judged(event):
            by_new.append(event)
            if event["acquired"] < end:
                early = round((end - event["acquired"]) / 1e6, 1)
                anomalies.append(f"the promoted replica, {early} ms before its quarantine: {event}")
    return anomalies, by_new
