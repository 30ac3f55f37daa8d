"""``locks[alias].leader()`` and ``aleader()`` in one process, on real nodes (docs/leaders.md):
elected, renewed, demoted at once when the leadership is taken away, terms that only grow, and
bad input refused before anything is taken."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable

import pytest

from django_redlock.exceptions import LockError
from django_redlock.locking.leader import Leadership
from django_redlock.locking.manager import LockManager
from django_redlock.testing import RedisNode, RedisNodes

Alias = Callable[..., LockManager]


def test_the_second_campaigner_is_elected_when_the_first_steps_down(
    redis_nodes: RedisNodes, redlock_alias: Alias, unique_name: str
) -> None:
    manager = redlock_alias(redis_nodes)
    elected: list[tuple[str, int | None]] = []
    second_in = threading.Event()

    def second() -> None:
        with manager.leader(unique_name, ttl=1.0) as lead:
            elected.append(("second", lead.term))
            assert lead.is_leader
        second_in.set()

    with manager.leader(
        unique_name, ttl=1.0, on_elected=lambda lead: elected.append(("first", lead.term))
    ) as lead:
        assert lead.is_leader and isinstance(lead.term, int)
        campaign = threading.Thread(target=second)
        campaign.start()
        time.sleep(2.5)  # over two TTLs: renewed, so the second still campaigns
        assert lead.is_leader and not second_in.is_set() and len(elected) == 1
    assert not lead.is_leader and not lead.demoted  # stepped down, not demoted
    campaign.join(10)
    assert [who for who, _ in elected] == ["first", "second"]
    assert elected[1][1] > elected[0][1]  # type: ignore[operator]


def test_demoted_at_once_when_the_leadership_is_taken_away(
    redis_nodes: RedisNodes, redlock_alias: Alias, unique_name: str
) -> None:
    """The name force-released behind the leader's back (an operator, a node's data lost):
    the next renewal finds it gone, ``on_demoted`` runs, ``is_leader`` is False, and leaving
    the block does not raise."""
    manager = redlock_alias(redis_nodes)
    demoted = threading.Event()
    with manager.leader(unique_name, ttl=0.6, on_demoted=lambda lead: demoted.set()) as lead:
        assert manager.force_release(unique_name) >= 1
        assert demoted.wait(2.0)  # renewed every third of the TTL: found at the next one
        assert lead.demoted and not lead.is_leader
        assert lead.wait_demoted(0)


def test_aleader_campaigns_and_is_demoted_on_the_event_loop(
    redis_nodes: RedisNodes, redlock_alias: Alias, unique_name: str
) -> None:
    manager = redlock_alias(redis_nodes)

    async def main() -> list[str]:
        seen: list[str] = []
        async with manager.aleader(
            unique_name, ttl=0.6, on_demoted=lambda lead: seen.append("demoted")
        ) as lead:
            seen.append(f"leader {lead.is_leader}")
            other = asyncio.ensure_future(_campaign(manager, unique_name, seen))
            await asyncio.sleep(1.5)  # renewed from a task: the other still campaigns
            assert not other.done()
            manager.force_release(unique_name)
            await asyncio.wait_for(other, 5)  # elected once the name is free
            for _ in range(100):  # found at the next renewal, a third of the TTL at most
                if lead.demoted:
                    break
                await asyncio.sleep(0.02)
            assert lead.demoted and not lead.is_leader
        return seen

    seen = asyncio.run(main())
    assert seen[0] == "leader True" and "other elected" in seen


async def _campaign(manager: LockManager, name: str, seen: list[str]) -> None:
    async with manager.aleader(name, ttl=0.6) as lead:
        seen.append("other elected" if lead.is_leader else "other not leader")


def test_bad_input_is_refused_before_anything_is_taken(
    redis_nodes: RedisNodes, redlock_alias: Alias, unique_name: str
) -> None:
    manager = redlock_alias(redis_nodes)
    with pytest.raises(TypeError, match="on_demoted must be callable"):
        manager.leader(unique_name, on_demoted="stop")  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        manager.leader(unique_name, ttl=-1)
    with pytest.raises(TypeError, match="async with"), manager.aleader(unique_name):
        pass
    assert manager.acquire(unique_name, timeout=0).release()  # nothing was taken


def test_repr_shows_the_state_and_never_the_owner(
    redis_nodes: RedisNodes, redlock_alias: Alias, unique_name: str
) -> None:
    manager = redlock_alias(redis_nodes)
    lead = manager.leader(unique_name)
    assert "campaigning" in repr(lead) and isinstance(lead, Leadership)
    with lead:
        assert "leader" in repr(lead) and f"term={lead.term}" in repr(lead)
        assert lead.lease is not None and lead.lease.record.owner not in repr(lead)
    assert "stepped down" in repr(lead)


def test_a_hook_that_raises_on_election_steps_down(
    redis_node: RedisNode, redlock_alias: Alias, unique_name: str
) -> None:
    """``on_elected`` raising (a bug, a KeyboardInterrupt) propagates out of the ``with`` and
    steps down: the block is never entered, so nothing else would release the name, and its
    renewal would keep it taken for as long as the process lives."""
    manager = redlock_alias([redis_node.url])

    def boom(lead: Leadership) -> None:
        raise RuntimeError("on_elected failed")

    lead = manager.leader(unique_name, ttl=0.6, on_elected=boom)
    with pytest.raises(RuntimeError, match="on_elected failed"), lead:
        pytest.fail("the block ran")
    assert not lead.is_leader
    time.sleep(0.5)  # past a renewal: it did not take the name back either
    assert manager.acquire(unique_name, timeout=0).release()

    async def main() -> None:
        with pytest.raises(RuntimeError, match="on_elected failed"):
            async with manager.aleader(unique_name, ttl=0.6, on_elected=boom):
                pytest.fail("the block ran")
        await asyncio.sleep(0.5)
        assert manager.acquire(unique_name, timeout=0).release()

    asyncio.run(main())


def test_async_hooks_are_refused(
    redis_node: RedisNode, redlock_alias: Alias, unique_name: str
) -> None:
    """A hook is called, never awaited: a coroutine function would silently not run."""
    manager = redlock_alias([redis_node.url])

    async def hook(lead: Leadership) -> None:  # pragma: no cover - never called
        pass

    for make in (manager.leader, manager.aleader):
        with pytest.raises(TypeError, match="coroutine function"):
            make(unique_name, on_elected=hook)
        with pytest.raises(TypeError, match="coroutine function"):
            make(unique_name, on_demoted=hook)


def test_campaigning_for_a_name_this_thread_leads_is_refused(
    redis_node: RedisNode, redlock_alias: Alias, unique_name: str
) -> None:
    """A second campaign for a name this thread holds would wait for itself for ever."""
    manager = redlock_alias([redis_node.url])
    with manager.leader(unique_name, ttl=1.0) as lead:
        with pytest.raises(LockError, match="wait for itself"), manager.leader(unique_name):
            pytest.fail("elected twice")
        with pytest.raises(LockError, match="wait for itself"), lead:
            pytest.fail("elected twice")
        assert lead.is_leader
    assert manager.acquire(unique_name, timeout=0).release()


def test_a_leadership_entered_again_campaigns_afresh(
    redis_node: RedisNode, redlock_alias: Alias, unique_name: str
) -> None:
    """Entering a demoted ``Leadership`` again is a new campaign: once elected it is the
    leader (it used to hold the name with ``is_leader`` False and ``demoted`` True)."""
    manager = redlock_alias([redis_node.url])
    lead = manager.leader(unique_name, ttl=0.6)
    with lead:
        first = lead.term
        manager.force_release(unique_name)
        assert lead.wait_demoted(3)
    with lead:
        assert lead.is_leader and not lead.demoted and not lead.wait_demoted(0)
        assert lead.term is not None and first is not None and lead.term > first
    assert not lead.is_leader and not lead.demoted


def test_a_ttl_beyond_the_thread_timeout_limit_is_refused(
    redis_node: RedisNode, redlock_alias: Alias, unique_name: str
) -> None:
    """A third of such a TTL over ``threading.TIMEOUT_MAX`` used to kill the renewal thread
    with ``OverflowError``; a TTL over 1e9 s is refused before anything is taken."""
    manager = redlock_alias([redis_node.url])
    with pytest.raises(ValueError, match="too large"):
        manager.leader(unique_name, ttl=threading.TIMEOUT_MAX * 4)
    assert manager.acquire(unique_name, timeout=0).release()
