"""Fixtures of the scheduler tests."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture
def log(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The file the scheduled jobs of tests/support/schedule_jobs.py append their runs to."""
    path = tmp_path / "runs"
    monkeypatch.setenv("SCHEDULE_LOG", str(path))
    return path
