"""WSGI entry of the gunicorn ``--preload`` test server (tests/test_demo_buy_endpoint.py): the
master process takes and releases a lock at import, as an app that warms up under a lock would,
so its workers inherit a lock manager that was used before the fork (docs/production.md)."""

from __future__ import annotations

from django_redlock import locks
from testproject.wsgi import application

__all__ = ["application"]

locks["default"].acquire("preload:import", timeout=5).release()
