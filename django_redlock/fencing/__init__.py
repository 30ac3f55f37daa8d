"""FencedModel: the database rejects writes from stale lock holders (docs/fencedmodel.md).

``django_redlock.models`` re-exports :class:`FencedModel`; import it from there.

Modules: ``tokens`` (the column, token validation, the token in effect), ``errors`` (the
``StaleTokenError`` messages), ``constraints`` (``fence_token >= 0`` and its W101 check),
``queries`` (``FencedQuerySet``/``FencedManager``), ``model`` (``FencedModel``), ``prepare``
(per concrete model: the fenced base manager, no constraint copied to MTI children),
``tombstones`` (the unique keys a fenced delete removed, which older tokens may not insert).
"""

from __future__ import annotations

from .model import FencedModel
from .queries import FencedManager, FencedQuerySet
from .tokens import MAX_TOKEN, validate_token

__all__ = ["MAX_TOKEN", "FencedManager", "FencedModel", "FencedQuerySet", "validate_token"]
