"""``manage.py redlock leader NAME -- COMMAND`` as real subprocesses against real nodes
(docs/leaders.md): a second campaigner waits, then runs once the first command exits, with a
higher term; a leadership taken away stops the command (SIGTERM) and exits 70."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from django_redlock.locking.manager import LockManager
from django_redlock.testing import RedisNodes

from .run_support import Wrapper, free_now, wait_for

Alias = Callable[..., LockManager]


@pytest.fixture
def leader(
    redis_nodes: RedisNodes, redlock_alias: Alias, tmp_path: Path
) -> Iterator[tuple[Wrapper, LockManager]]:
    manager = redlock_alias(redis_nodes)
    made = Wrapper(manager, tmp_path)
    made.subcommand = "leader"
    yield made, manager
    made.close()


def _script(marker: Path, finish: Path | None) -> str:
    wait = f"while not os.path.exists({str(finish)!r}): time.sleep(0.01)\n" if finish else ""
    return (
        "import os, time\n"
        f"open({str(marker)!r}, 'w').write(os.environ['REDLOCK_TOKEN'] + chr(10))\n" + wait
    )


def test_the_second_campaigner_runs_once_the_first_command_exits(
    leader: tuple[Wrapper, LockManager], tmp_path: Path, unique_name: str
) -> None:
    run, manager = leader
    first_in, first_done, second_in = tmp_path / "a", tmp_path / "a-done", tmp_path / "b"
    first = run.start(unique_name, _script(first_in, first_done), "--ttl", "2")
    first_term = int(wait_for(first_in))
    second = run.start(unique_name, _script(second_in, None), "--ttl", "2")
    time.sleep(2.5)  # over a TTL: the first is renewed, the second still campaigns
    assert second.poll() is None and not second_in.exists()
    first_done.touch()
    assert first.wait(20) == 0
    assert int(wait_for(second_in)) > first_term  # elected, with a higher term
    assert second.wait(20) == 0
    free_now(manager, unique_name)


def test_a_leadership_taken_away_stops_the_command_and_exits_70(
    leader: tuple[Wrapper, LockManager], tmp_path: Path, unique_name: str
) -> None:
    run, manager = leader
    marker = tmp_path / "in"
    process = run.start(unique_name, _script(marker, tmp_path / "never"), "--ttl", "1")
    wait_for(marker)
    assert manager.force_release(unique_name) >= 1
    _, err = process.communicate(timeout=20)
    assert process.returncode == 70, err
    assert "redlock leader" in err or "lost" in err
