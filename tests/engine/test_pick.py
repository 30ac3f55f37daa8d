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

    kicked: int = 0
    reserved: object = None

    def all_up(self) -> bool:
        return self.up

    def reconnect_soon(self) -> None:
        self.kicked += 1


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
    channels = [_Channel(up) for up in ups]
    assert pick(channels) == expected
    # the ones passed over (down, after the one taken) are asked to reconnect
    taken = len(ups) - 1 if expected == -1 else expected
    assert [c.kicked for c in channels] == [int(i > taken) for i in range(len(ups))]


def test_an_event_loop_takes_the_last_free_channel_that_is_up() -> None:
    up, down, held = _Channel(), _Channel(up=False), _Channel(mutex=_Mutex(held=True))
    assert apick([up, down, held]) is up
    assert apick([down, up]) is up
    assert apick([up, down]) is up
    assert apick([down, held]) is down  # none up: the last free one, as before
    kicked = down.kicked
    assert apick([up, down]) is up and down.kicked == kicked + 1  # passed over: reconnect
    assert apick([held]) is None
    assert apick([]) is None
