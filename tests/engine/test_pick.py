"""Which idle channel a call takes, and which connections of idle channels are asked to
reconnect (:mod:`django_redlock.engine.pools.pick`), on stand-ins that say only whether
their connections are up, whether a task holds them and whether the next call reconnects
a connection itself."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from django_redlock.engine.pools.pick import apick, pick, reconnect_down


@dataclass
class _Mutex:
    held: bool = False

    def locked(self) -> bool:
        return self.held


@dataclass(eq=False)
class _Link:
    connected: bool = True
    revives_inline: bool = False
    asked: int = 0

    def usable(self) -> bool:
        self.asked += 1
        return self.connected


@dataclass(eq=False)
class _Channel:
    up: bool = True
    mutex: _Mutex = field(default_factory=_Mutex)
    reserved: object = None
    links: list[_Link] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.links = self.links or [_Link(), _Link(connected=self.up)]


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
    assert all(link.asked == 0 for c in channels for link in c.links)  # a choice, no call


def test_an_event_loop_takes_the_last_free_channel_that_is_up() -> None:
    up, down, held = _Channel(), _Channel(up=False), _Channel(mutex=_Mutex(held=True))
    handed = _Channel(reserved=object())
    assert apick([up, down, held]) is up
    assert apick([down, up]) is up
    assert apick([up, down]) is up
    assert apick([down, held]) is down  # none up: the last free one, as before
    assert apick([up, handed]) is up  # handed to a waiting task as it came back
    assert apick([held, handed]) is None
    assert apick([held]) is None
    assert apick([]) is None


def test_idle_channels_reconnect_their_connections_that_are_down() -> None:
    """Each connection down is asked to reconnect (its backoff decides when), but not one the
    next call reconnects itself, nor one that is up; the answer says whether one is down."""
    up, down = _Channel(), _Channel(up=False)
    revived = _Channel(links=[_Link(connected=False, revives_inline=True)])
    assert reconnect_down([up, down, revived]) is True
    assert [link.asked for link in up.links] == [0, 0]
    assert [link.asked for link in down.links] == [0, 1]
    assert revived.links[0].asked == 0
    assert reconnect_down([up]) is False
    assert reconnect_down([]) is False
