"""Fixtures of the request-lock tests: fresh ids and Idempotency-Key values."""

from __future__ import annotations

import uuid

import pytest


@pytest.fixture
def item_id() -> int:
    """An id no other test uses (the session's Redis nodes are shared)."""
    return uuid.uuid4().int % 10**12


@pytest.fixture
def key() -> str:
    """A fresh Idempotency-Key value."""
    return str(uuid.uuid4())
