"""django-redlock: correct distributed locks for Django on Redis, fenced down to the row."""

from __future__ import annotations

from .locking.registry import lock, locks

__all__ = ["lock", "locks"]
__version__ = "0.1.0.dev0"
