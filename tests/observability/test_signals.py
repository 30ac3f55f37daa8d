"""Signals (docs/index.md): who gets what, and a receiver that raises never changes what the lock
call does (a raising ``lock_acquired`` receiver used to leak the lock for its whole TTL)."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import pytest
from django.dispatch import Signal

from django_redlock import locks, signals


@pytest.fixture
def raising_receiver() -> Iterator[Signal]:
    def receiver(**kwargs: Any) -> None:
        raise RuntimeError("metrics backend down")

    for signal in (signals.lock_acquired, signals.lock_released, signals.lock_failed):
        signal.connect(receiver)
    yield signals.lock_acquired
    for signal in (signals.lock_acquired, signals.lock_released, signals.lock_failed):
        signal.disconnect(receiver)


def test_a_raising_receiver_never_leaves_a_lock_behind(
    raising_receiver: Signal, unique_name: str, caplog: pytest.LogCaptureFixture
) -> None:
    """acquire() still hands out the lease (so it can be released), the block runs and
    releases, and the receiver's error is logged with its traceback on django_redlock."""
    manager = locks["default"]
    with caplog.at_level(logging.ERROR, logger="django_redlock"):
        lease = manager.acquire(unique_name, timeout=0)
        assert lease.release() is True
        with manager.lock(unique_name, timeout=0):
            pass
        again = manager.acquire(unique_name, timeout=0)  # nothing left behind
        again.release()
    errors = [r for r in caplog.records if r.name == "django_redlock" and r.exc_info]
    assert len(errors) >= 6 and "metrics backend down" in str(errors[0].exc_info[1])
