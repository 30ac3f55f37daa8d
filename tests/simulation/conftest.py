"""Every test here runs on aliases whose nodes are traps (``tests/support/offline.py``): a
connection to one fails the test at teardown."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support.offline import Trap, connected, offline_aliases


@pytest.fixture
def traps() -> Iterator[list[Trap]]:
    with offline_aliases() as traps:
        yield traps
        assert connected(traps) == 0, "a simulated lock reached a node"
