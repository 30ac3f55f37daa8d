"""Fencing tokens: the ``fence_token`` column's name, validation, and the token in effect."""

from __future__ import annotations

from typing import Any

from ..engine import TOKEN_LIMIT
from ..locking import context
from .errors import alias_error

MAX_TOKEN = TOKEN_LIMIT
FIELD = "fence_token"


def validate_token(token: object) -> int:
    """``token`` if it is a valid fencing token (an ``int``, not ``bool``, 0 <= T < 2**53)."""
    if isinstance(token, bool) or not isinstance(token, int):
        raise TypeError(f"A fencing token must be an int, not {type(token).__name__}.")
    if not 0 <= token < MAX_TOKEN:
        raise ValueError(f"A fencing token must satisfy 0 <= token < 2**53, got {token}.")
    return token


def validate_stored(value: object) -> None:
    """Refuse a ``fence_token`` an unguarded write would store, unless it is a valid token.

    Expressions (``F("fence_token") + 1``) are left to the database and its check constraint.
    """
    if not hasattr(value, "resolve_expression"):
        validate_token(value)


def resolve_token(explicit: object = None, model: Any = None, loaded: Any = None) -> int | None:
    """The explicit token if given; else ``loaded`` (the token an instance was claimed,
    loaded or last saved with) when an active lease of this thread or task has that token
    (each row of a ``lock_many`` set keeps its own name's token); else the innermost active
    lease's; else ``None``.

    If ``model`` sets ``fence_alias``, the lease must be of that alias (``StaleTokenError``
    otherwise, before any SQL): tokens of two aliases are not comparable. An explicit token
    is taken to be of the model's alias.
    """
    if explicit is not None:
        return validate_token(explicit)
    wanted = getattr(model, "fence_alias", None)
    if isinstance(loaded, int) and loaded > 0:
        owner = context.active_with_token(loaded)
        if owner is not None and (wanted is None or getattr(owner, "alias", None) == wanted):
            return loaded
    lease = context.current_lease()
    if lease is None:
        return None
    if wanted is not None and getattr(lease, "alias", None) != wanted:
        raise alias_error(model, lease, wanted)
    return validate_token(lease.token)
