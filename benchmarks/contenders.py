"""The acquire/release pair of each library, and the contender that runs one in a scenario."""

from __future__ import annotations

import asyncio
import contextlib
import secrets
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from benchmarks.common import HEALTHY_SOCKET_TIMEOUT, TTL, redis_client
from benchmarks.loops import AsyncPair, Sample, SyncPair, apair_loop, pair_loop

RELEASE_LUA = """
if redis.call("get", KEYS[1]) == ARGV[1] then
    return redis.call("del", KEYS[1])
end
return 0
"""


@dataclass
class Contender:
    """One library in an uncontended scenario: runs ``seconds`` of pairs and returns a sample."""

    label: str
    run: Callable[[float, int | None], Sample]
    note: str = ""


def sync_contender(label: str, pair: SyncPair, note: str = "") -> Contender:
    return Contender(label, lambda seconds, limit: pair_loop(pair, seconds, limit), note)


def async_contender(
    label: str, pair: AsyncPair, loop: asyncio.AbstractEventLoop, note: str = ""
) -> Contender:
    def run(seconds: float, limit: int | None) -> Sample:
        return loop.run_until_complete(apair_loop(pair, seconds, limit))

    return Contender(label, run, note)


# -- django-redlock -----------------------------------------------------------------------------
def manager_pair(manager: Any, name: str, timeout: float) -> SyncPair:
    """Acquire (waiting up to ``timeout``) and release on one of our lock managers."""
    from django_redlock.exceptions import LockNotAcquired, NodesUnavailable

    def acquire() -> Any:
        try:
            return manager.acquire(name, ttl=TTL, timeout=timeout)
        except (LockNotAcquired, NodesUnavailable):
            return None

    return acquire, lambda lease: lease.release()


def ours_pair(alias: str, name: str, busy_poll: float | None = None) -> SyncPair:
    from django_redlock import locks

    manager = locks[alias]
    if busy_poll is not None:  # before its first call creates a channel
        manager.engine.state.busy_poll = busy_poll
    return manager_pair(manager, name, 0)


def ours_apair(alias: str, name: str) -> AsyncPair:
    from django_redlock import locks
    from django_redlock.exceptions import LockNotAcquired, NodesUnavailable

    manager = locks[alias]

    async def acquire() -> Any:
        try:
            return await manager.aacquire(name, ttl=TTL, timeout=0)
        except (LockNotAcquired, NodesUnavailable):
            return None

    async def release(lease: Any) -> object:
        return await lease.arelease()

    return acquire, release


# -- the other libraries ------------------------------------------------------------------------
def raw_pair(url: str, name: str) -> SyncPair:
    client = redis_client(url, HEALTHY_SOCKET_TIMEOUT)
    sha = client.script_load(RELEASE_LUA)

    def acquire() -> str | None:
        owner = secrets.token_hex(16)
        return owner if client.set(name, owner, nx=True, px=TTL * 1000) else None

    def release(owner: str) -> object:
        return client.evalsha(sha, 1, name, owner)

    return acquire, release


def raw_apair(url: str, name: str) -> AsyncPair:
    """:func:`raw_pair` on ``redis.asyncio`` (hiredis): ``SET NX PX`` + ``EVALSHA``."""
    import redis.asyncio

    client = redis.asyncio.Redis.from_url(
        url, socket_timeout=HEALTHY_SOCKET_TIMEOUT, socket_connect_timeout=HEALTHY_SOCKET_TIMEOUT
    )
    sha = redis_client(url, HEALTHY_SOCKET_TIMEOUT).script_load(RELEASE_LUA)

    async def acquire() -> str | None:
        owner = secrets.token_hex(16)
        return owner if await client.set(name, owner, nx=True, px=TTL * 1000) else None

    async def release(owner: str) -> object:
        return await client.evalsha(sha, 1, name, owner)

    return acquire, release


def redis_py_lock_pair(url: str, name: str) -> SyncPair:
    client = redis_client(url, HEALTHY_SOCKET_TIMEOUT)

    def acquire() -> Any:
        lock = client.lock(name, timeout=TTL)
        return lock if lock.acquire(blocking=False) else None

    return acquire, lambda lock: lock.release()


def python_redis_lock_pair(url: str, name: str) -> SyncPair:
    import redis_lock

    client = redis_client(url, HEALTHY_SOCKET_TIMEOUT)

    def acquire() -> Any:
        lock = redis_lock.Lock(client, name, expire=TTL)
        return lock if lock.acquire(blocking=False) else None

    return acquire, lambda lock: lock.release()


def pottery_pair(urls: Sequence[str], name: str, timeout: float) -> SyncPair:
    from pottery import Redlock

    masters = {redis_client(u, timeout) for u in urls}

    def acquire() -> Any:
        # One Redlock per acquisition, like the redis-py and python-redis-lock locks here: a
        # reused one can have a late release thread run with the next attempt's uuid.
        lock = Redlock(key=name, masters=masters, auto_release_time=TTL)
        try:
            return lock if lock.acquire(blocking=False) else None
        except Exception:  # QuorumIsImpossible and friends count as a failed attempt
            return None

    return acquire, lambda held: held.release()


def redlock_py_pair(urls: Sequence[str], name: str, timeout: float) -> SyncPair:
    from redlock import Redlock

    dlm = Redlock([redis_client(u, timeout) for u in urls], retry_count=1)

    def acquire() -> Any:
        try:
            return dlm.lock(name, TTL * 1000) or None
        except Exception:  # MultipleRedlockException: quorum reached, but some node failed
            return None

    def release(lock: Any) -> object:
        with contextlib.suppress(Exception):
            dlm.unlock(lock)
        return None

    return acquire, release


def aioredlock_apair(ports: Sequence[int], name: str, cap: float | None) -> tuple[AsyncPair, Any]:
    from aioredlock import Aioredlock

    manager = Aioredlock([{"host": "127.0.0.1", "port": p} for p in ports], retry_count=1)

    async def acquire() -> Any:
        try:
            if cap is None:
                return await manager.lock(name, lock_timeout=TTL)
            return await asyncio.wait_for(manager.lock(name, lock_timeout=TTL), cap)
        except Exception:  # LockError, or our cap when a node never answers
            return None

    async def release(lock: Any) -> object:
        with contextlib.suppress(Exception):
            if cap is None:
                await manager.unlock(lock)
            else:
                await asyncio.wait_for(manager.unlock(lock), cap)
        return None

    return (acquire, release), manager
