"""Fixtures of the composition suite: the second process, started once per test module."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
from django.conf import settings

from .machine import PeerProcess

#: ``REDLOCK_LONG=1``: the long profile (many more examples and steps).
LONG = os.environ.get("REDLOCK_LONG") == "1"


@pytest.fixture(scope="module")
def peer() -> Iterator[PeerProcess]:
    """A second process using the same ``REDLOCK`` settings, driven over a pipe."""
    process = PeerProcess(dict(settings.REDLOCK))
    yield process
    process.close()
