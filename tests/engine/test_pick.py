"""Which idle channel a call takes (:mod:`django_redlock.engine.pools.pick`), on stand-ins
that say only whether their connections are all up and whether a task holds them."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from django_redlock.engine.pools.pick import apick, pick


@dataclass
class _Mutex:
    held: bool = False

    def locked(self) -> bool:
        return self.held


@dataclass(eq=False)
class _Channel:
    up: bool = True
    mutex: _Mutex = field(default_factory=_Mutex)

    def all_up(self) -> bool:
        return self.up


@pytest.mark.parametrize(
    ("ups", "expected"),
    [
        ([True], -1),
        ([False], -1),
        ([True, True, True], -1),
        ([True, True, False], 1),
        ([True, False, False], 0),
        ([False, False, False], -1),
        ([False, True, False], 1),
    ],
)
def test_the_last_returned_unless_it_is_down_and_another_is_up(
    ups: list[bool], expected: int
) -> None:
    assert pick([_Channel(up) for up in ups]) == expected


def test_an_event_loop_takes_the_last_free_channel_that_is_up() -> None:
    up, down, held = _Channel(), _Channel(up=False), _Channel(mutex=_Mutex(held=True))
    assert apick([up, down, held]) is up
    assert apick([down, up]) is up
    assert apick([up, down]) is up
    assert apick([down, held]) is down  # none up: the last free one, as before
    assert apick([held]) is None
    assert apick([]) is None
