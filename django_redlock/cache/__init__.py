"""Stampede-proof cache fill: :func:`get_or_set` and its asyncio twin :func:`aget_or_set`
(docs/effects.md, "Stampede-proof cache fill").

On a miss one process computes the value under a write lease of a read-write lock while the
others wait for a read lease (a writer's release wakes every waiting reader at once); the
value is stored with its lease's fencing token, by a Lua script that refuses a lower token.
"""

from __future__ import annotations

from .fill import aget_or_set, get_or_set

__all__ = ["aget_or_set", "get_or_set"]
