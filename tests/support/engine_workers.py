"""Code run in worker processes (``multiprocessing`` spawn) by the race tests of
``tests/engine/test_engine.py``."""

from __future__ import annotations

import os
import time
from multiprocessing.pool import AsyncResult
from pathlib import Path
from typing import Any


def setup_django(redlock: dict[str, Any]) -> None:
    """Configure a bare Django with the given ``REDLOCK`` in a fresh process."""
    import django
    from django.conf import settings

    if not settings.configured:
        settings.configure(
            INSTALLED_APPS=["django_redlock"],
            REDLOCK=redlock,
            USE_TZ=True,
            DATABASES={},
        )
        django.setup()


def increment_under_lock(
    redlock: dict[str, Any], alias: str, name: str, counter_url: str, counter_key: str, rounds: int
) -> list[int]:
    """Non-atomic read-modify-write of a Redis counter inside the lock; returns the tokens."""
    setup_django(redlock)
    import redis

    from django_redlock import locks

    counter = redis.Redis.from_url(counter_url)
    tokens: list[int] = []
    for _ in range(rounds):
        with locks[alias].lock(name, ttl=5, timeout=30) as lease:
            value = int(counter.get(counter_key) or 0)
            time.sleep(0.0005)  # widen the race window
            counter.set(counter_key, value + 1)
            tokens.append(lease.token)
            counter.rpush(f"{counter_key}:tokens", lease.token)
    return tokens


def hold_for(redlock: dict[str, Any], alias: str, name: str, seconds: float, ttl: float) -> int:
    """Hold ``name`` with auto-extend for ``seconds``; returns the token."""
    setup_django(redlock)
    from django_redlock import locks

    with locks[alias].lock(name, ttl=ttl, timeout=10, auto_extend=True) as lease:
        time.sleep(seconds)
        return lease.token


def wait_for_lock(redlock: dict[str, Any], alias: str, name: str, timeout: float) -> None:
    """Wait for ``name`` (held by the test) until killed; release it if it ever comes."""
    setup_django(redlock)
    from django_redlock import locks

    locks[alias].acquire(name, timeout=timeout).release()


def start_together(go: Path, count: int, running: AsyncResult[Any], delay: float) -> None:
    """The test's side of a start line: once ``count`` workers reported ready (``<go>.<i>``),
    name the moment ``delay`` seconds on in ``go`` (what :func:`wait_for_go` waits for)."""
    deadline = time.monotonic() + 120
    for index in range(count):
        while not Path(f"{go}.{index}").exists():
            if running.ready():
                running.get()  # a worker failed before it got ready: raise its error
            assert time.monotonic() < deadline, f"worker {index} never got ready"
            time.sleep(0.01)
    staged = go.with_name(go.name + ".tmp")
    staged.write_text(repr(time.time() + delay))
    staged.replace(go)  # atomic: a worker never reads a half-written moment


def wait_for_go(go: str, index: int) -> float:
    """A worker's side: report ready, wait for the go file and return the moment it names."""
    Path(f"{go}.{index}").touch()
    deadline = time.monotonic() + 120
    while not os.path.exists(go):
        if time.monotonic() > deadline:
            raise TimeoutError(f"no go file {go}")
        time.sleep(0.005)
    return float(Path(go).read_text())


def first_acquires(
    urls: list[str], prefix: str, rounds: int, go: str, step: float, index: int
) -> list[str]:
    """One process's first acquire on a new cluster, ``rounds`` times: each round is a new
    key prefix (fresh fence state), started at the same wall-clock moment in every process
    (named in the file ``go`` once all of them are ready). Returns "ok" or the exception
    (its class name and message) per round."""
    # a generous NODE_TIMEOUT (default 50 ms): on a loaded machine a slow reply would fail an
    # attempt for a reason of its own (too few nodes in time); this test is about the race
    aliases = {
        f"r{r}": {"NODES": urls, "KEY_PREFIX": f"{prefix}{r}:", "NODE_TIMEOUT": 2.0}
        for r in range(rounds)
    }
    setup_django(aliases)
    from django_redlock import locks

    for r in range(rounds):  # connect first, so only the first acquire itself races
        locks[f"r{r}"].engine.state  # noqa: B018
    start_at = wait_for_go(go, index)
    outcomes: list[str] = []
    for r in range(rounds):
        while time.time() < start_at + r * step:
            pass
        try:
            locks[f"r{r}"].acquire(f"w{index}", ttl=5, timeout=0).release()
            outcomes.append("ok")
        except Exception as exc:  # reported to the test, with its message (what failed where)
            outcomes.append(f"{type(exc).__name__}: {exc}")
    return outcomes


def hold_permits(
    redlock: dict[str, Any],
    alias: str,
    name: str,
    permits: int,
    counter_url: str,
    key: str,
    rounds: int,
    until: str = "",
) -> list[int]:
    """``rounds`` times (and on, while the key ``until`` is missing on the counter node): take
    one of ``permits`` permits of ``name``, count the holders inside (an INCR/DECR outside the
    library: the oracle) and record the most seen; returns tokens."""
    setup_django(redlock)
    import redis

    from django_redlock import locks

    counter = redis.Redis.from_url(counter_url)
    tokens: list[int] = []
    while len(tokens) < rounds or (until and not counter.exists(until)):
        with locks[alias].semaphore(name, permits, ttl=5, timeout=60) as lease:
            inside = counter.incr(key)
            counter.rpush(f"{key}:seen", inside)
            time.sleep(0.002)
            counter.decr(key)
            tokens.append(lease.token)
    return tokens


def hold_a_permit_until_killed(
    redlock: dict[str, Any], alias: str, name: str, ttl: float, counter_url: str, key: str
) -> None:
    """Take one permit of a 1-permit semaphore, push its token to ``key``, then sleep until
    the test kills this process."""
    setup_django(redlock)
    import redis

    from django_redlock import locks

    lease = locks[alias].acquire(name, ttl=ttl, timeout=5, permits=1)
    redis.Redis.from_url(counter_url).rpush(key, lease.token)
    time.sleep(600)


def random_sets_under_lock_many(
    redlock: dict[str, Any], alias: str, prefix: str, counter_url: str, rounds: int, seed: int
) -> int:
    """``rounds`` times: take a random set of 2-4 of 6 names, in random order, with
    ``lock_many``; inside, for each name count the holders (the oracle: never more than one)
    and do a non-atomic read-modify-write of its counter. Returns the sections done."""
    import random

    setup_django(redlock)
    import redis

    from django_redlock import locks

    rng = random.Random(seed)
    counter = redis.Redis.from_url(counter_url)
    names = [f"{prefix}:{i}" for i in range(6)]
    for _ in range(rounds):
        chosen = rng.sample(names, rng.randint(2, 4))
        with locks[alias].lock_many(chosen, ttl=5, timeout=60):
            for name in chosen:
                inside = counter.incr(f"{name}:holders")
                counter.rpush(f"{prefix}:seen", inside)
                value = int(counter.get(f"{name}:value") or 0)
                time.sleep(0.0005)
                counter.set(f"{name}:value", value + 1)
                counter.incr(f"{name}:expected")
                counter.decr(f"{name}:holders")
    return rounds


def read_write_sections(
    redlock: dict[str, Any],
    alias: str,
    name: str,
    counter_url: str,
    rounds: int,
    writer: bool,
    until: str = "",
) -> int:
    """``rounds`` read (or write) sections of ``name`` (and on, while the key ``until`` is
    missing on the counter node); inside, count readers and writers (INCR/DECR outside the
    library: the oracle) and record what each section saw. Returns the sections done."""
    setup_django(redlock)
    import redis

    from django_redlock import locks

    counter = redis.Redis.from_url(counter_url)
    manager = locks[alias]
    mine, other = ("writers", "readers") if writer else ("readers", "writers")
    done = 0
    while done < rounds or (until and not counter.exists(until)):
        done += 1
        block = manager.write_lock if writer else manager.read_lock
        with block(name, ttl=5, timeout=60) as lease:
            inside = counter.incr(f"{name}:{mine}")
            others = int(counter.get(f"{name}:{other}") or 0)
            counter.rpush(f"{name}:seen", f"{mine} {inside} {others} {lease.token}")
            time.sleep(0.003)
            counter.decr(f"{name}:{mine}")
    return done


def acquire_and_report(
    redlock: dict[str, Any], alias: str, name: str, timeout: float, url: str, key: str
) -> None:
    """Acquire ``name`` (waiting up to ``timeout``), push the token to ``key`` on the node at
    ``url``, release."""
    setup_django(redlock)
    import redis

    from django_redlock import locks

    lease = locks[alias].acquire(name, timeout=timeout)
    redis.Redis.from_url(url).rpush(key, lease.token)
    lease.release()


def aacquire_and_report(
    redlock: dict[str, Any], alias: str, name: str, timeout: float, url: str, key: str
) -> None:
    """:func:`acquire_and_report` with ``aacquire()`` in an event loop."""
    setup_django(redlock)
    import asyncio

    import redis

    from django_redlock import locks

    async def main() -> None:
        lease = await locks[alias].aacquire(name, timeout=timeout)
        redis.Redis.from_url(url).rpush(key, lease.token)
        await lease.arelease()

    asyncio.run(main())


def random_sets_under_limits(
    redlock: dict[str, Any],
    alias: str,
    prefix: str,
    counter_url: str,
    rounds: int,
    seed: int,
) -> int:
    """``rounds`` times: a permit of 2-3 of the semaphores ``{prefix}:0`` (2 permits),
    ``:1`` (1) and ``:2`` (2), in random order, with ``limits``; inside, count the holders of
    each (the oracle: never more than its permits). Returns the sections done."""
    import random

    setup_django(redlock)
    import redis

    from django_redlock import locks

    rng = random.Random(seed)
    counter = redis.Redis.from_url(counter_url)
    sizes = {f"{prefix}:{i}": permits for i, permits in enumerate((2, 1, 2))}
    for _ in range(rounds):
        chosen = rng.sample(list(sizes), rng.randint(2, 3))
        with locks[alias].limits({name: sizes[name] for name in chosen}, ttl=5, timeout=60):
            for name in chosen:
                inside = counter.incr(f"{name}:holders")
                counter.rpush(f"{name}:seen", inside)
            time.sleep(0.001)
            for name in chosen:
                counter.decr(f"{name}:holders")
    return rounds


def acquire_while_paused(redlock: dict[str, Any], alias: str, seconds: float) -> dict[str, int]:
    """Acquire and release free names for ``seconds`` (the test SIGSTOPs and SIGCONTs this
    process meanwhile); the count of each outcome (``ok``, or the exception's class name)."""
    setup_django(redlock)
    from django_redlock import locks

    outcomes: dict[str, int] = {}
    deadline = time.monotonic() + seconds
    index = 0
    while time.monotonic() < deadline:
        index += 1
        try:
            lease = locks[alias].acquire(f"paused:{os.getpid()}:{index}", timeout=0)
            outcome = "ok" if lease.release() else "release False"
        except Exception as exc:
            outcome = type(exc).__name__
        outcomes[outcome] = outcomes.get(outcome, 0) + 1
    return outcomes
