"""Stopping a process the tests (or a benchmark) started in a session of its own: the demo
project's helper, so the two stop processes the same way."""

from __future__ import annotations

from testproject.inventory.demo_run import stop_group

__all__ = ["stop_group"]
