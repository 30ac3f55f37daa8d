"""The markers of unique tasks (django_redlock.jobs.notes) on three real redis-server nodes:
a change never touches another task's marker, a marker reads as what a quorum agree on, a
marker expires on its own, and too few nodes raise NodesUnavailable."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest

from django_redlock.exceptions import NodesUnavailable
from django_redlock.jobs.notes import Note, Notes
from django_redlock.testing import RedisNodes


@pytest.fixture
def notes(redis_nodes: RedisNodes, redlock_alias: Callable[..., Any]) -> Notes:
    manager = redlock_alias(redis_nodes, NODE_TIMEOUT=0.2)
    return Notes(manager.engine)


def test_a_change_never_touches_another_tasks_marker(notes: Notes) -> None:
    notes.write("k", Note("queued", "A"), 30)
    assert not notes.delete("k", "B")
    assert not notes.replace("k", "B", Note("running", "B"), 30)
    assert notes.read("k") == Note("queued", "A")
    assert notes.replace("k", "A", Note("running", "A"), 30)
    assert notes.read("k") == Note("running", "A")
    assert notes.delete("k", "A")
    assert notes.read("k") is None
    assert notes.replace("k", "C", Note("running", "C"), 30)  # none there: taken
    assert notes.read("k") == Note("running", "C")


def test_a_marker_expires_on_its_own(notes: Notes) -> None:
    notes.write("k", Note("queued", "A"), 0.3)
    assert notes.read("k") == Note("queued", "A")
    time.sleep(0.5)
    assert notes.read("k") is None


def test_a_marker_reads_as_what_a_quorum_agree_on(redis_nodes: RedisNodes, notes: Notes) -> None:
    notes.write("k", Note("queued", "A"), 30)
    redis_nodes[0].client().set(notes.key("k"), "queued|X")  # one node disagrees
    assert notes.read("k") == Note("queued", "A")
    redis_nodes[1].client().delete(notes.key("k"))  # no value on a quorum any more
    assert notes.read("k") is None
    redis_nodes[2].stop()
    notes.write("k", Note("queued", "B"), 30)  # two of three nodes are a quorum
    assert notes.read("k") == Note("queued", "B")
    redis_nodes[1].stop()
    with pytest.raises(NodesUnavailable):
        notes.read("k")
    with pytest.raises(NodesUnavailable):
        notes.write("k", Note("queued", "C"), 30)
