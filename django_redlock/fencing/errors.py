"""The :class:`StaleTokenError` of a refused fenced write, with a message naming the way out."""

from __future__ import annotations

from typing import Any

from django.db import models

from ..exceptions import StaleTokenError
from ..locking import context


def model_label(model: Any) -> str:
    """``app_label.ModelName`` of a model class, or ``str(model)`` for anything else."""
    return str(getattr(getattr(model, "_meta", None), "label", model))


def _holding_lease(token: int) -> Any:
    """The innermost active lease if it carries ``token`` and still holds its lock, else None."""
    lease = context.current_lease()
    if lease is None or lease.token != token or getattr(lease, "released", False):
        return None
    return lease if getattr(lease, "validity", 0) > 0 else None


def _newer_row(token: int, row_token: int) -> tuple[str, str]:
    """Why a row with a larger token refused ``token``, and what to do about it."""
    lease = _holding_lease(token)
    if lease is None:
        return (
            f"a newer lease (token {row_token}) wrote the row after this lease (token {token}) "
            "was granted, so this lease is stale (it expired or was taken over); if the token "
            "came from another alias than the row's writers, see 'Nested leases and aliases' "
            "in docs/fencedmodel.md",
            "Re-acquire the lock, re-read the row (Model.objects.claim(pk=...)) "
            "and redo the change.",
        )
    return (
        f"this lease (alias {lease.alias!r}, name {lease.name!r}, token {token}) still holds "
        f"its lock ({lease.validity:.1f} s left), so it is not stale (unless it was "
        f"force-released): the row was written under token {row_token} by a lease taken "
        "later, for another name (a lock nested inside this one, e.g. a helper's) or of "
        "another alias (tokens are ordered only within one alias)",
        "Write a row under one lease: in a nested lock, write it with the outer lease's "
        "token (fenced(lease.token).update(), save(fence_token=lease.token)), and fence a "
        "model with one alias (fence_alias = ...). See 'Nested leases and aliases' in "
        "docs/fencedmodel.md.",
    )


def stale_error(
    model: type[models.Model], pk: Any, *, token: int, loaded: int | None, row_token: int | None
) -> StaleTokenError:
    """A :class:`StaleTokenError` whose message names the case and the way out."""
    where = f"{model_label(model)} pk={pk!r}"
    todo = "Re-acquire the lock, re-read the row (Model.objects.claim(pk=...)) and redo the change."
    if row_token is None:
        why = f"the row no longer exists (it was deleted after this lease (token {token}) read it)"
    elif row_token > token:
        why, todo = _newer_row(token, row_token)
    else:
        why = (
            f"the row changed since it was read (read with token {loaded}, now {row_token}): "
            "another writer changed it between this lease's read and its write"
        )
    return StaleTokenError(
        model,
        pk,
        row_token=row_token,
        token=token,
        message=f"{where}: write with fencing token {token} rejected, nothing was written: "
        f"{why}. {todo}",
    )


def resurrect_error(
    model: type[models.Model], pk: Any, fields: tuple[str, ...], *, token: int, deleted: int
) -> StaleTokenError:
    """The refusal of an insert whose key a newer token deleted (``deleted_token`` is set)."""
    key = ", ".join(fields)
    lease = _holding_lease(token)
    if lease is None:
        why = (
            f"a row with the same {key} was deleted under token {deleted}, by a newer lease "
            f"than this one (token {token}), so this lease is stale (it expired or was taken "
            "over) and the insert would bring the deleted row back"
        )
        todo = "Re-acquire the lock, look the row up again and decide afresh."
    else:
        why = (
            f"a row with the same {key} was deleted under token {deleted} by a lease taken "
            f"later than this one (alias {lease.alias!r}, name {lease.name!r}, token {token}, "
            "which still holds its lock): a lock nested inside this one, or of another alias "
            "(tokens are ordered only within one alias)"
        )
        todo = (
            "Delete and insert a row under one lease (delete(fence_token=lease.token)), and "
            "fence a model with one alias. See 'Nested leases and aliases' in "
            "docs/fencedmodel.md."
        )
    error = StaleTokenError(
        model,
        pk,
        row_token=None,
        token=token,
        message=f"{model_label(model)} pk={pk!r}: insert with fencing token {token} rejected, "
        f"nothing was written: {why}. {todo}",
    )
    error.deleted_token = deleted
    return error


def alias_error(model: Any, lease: Any, wanted: str) -> StaleTokenError:
    """The error of a write to a ``fence_alias`` model under a lease of another alias."""
    return StaleTokenError(
        model,
        None,
        row_token=None,
        token=lease.token,
        message=f"{model_label(model)} is fenced by alias {wanted!r} (fence_alias), but the "
        f"innermost active lease is of alias {lease.alias!r} (name {lease.name!r}, token "
        f"{lease.token}); tokens of two aliases are not comparable, so nothing was written. "
        f"Take the lock with locks[{wanted!r}], or pass that lease's token explicitly "
        "(save(fence_token=...), fenced(...), claim(token=...)).",
    )


def upsert_error(model: Any) -> ValueError:
    """The refusal of ``bulk_create(update_conflicts=True)`` under a token."""
    return ValueError(
        f"{model_label(model)}: bulk_create(update_conflicts=True) under a fencing token was "
        "refused before any SQL: the conflict update cannot carry the fence guard, so a "
        "stale lease's upsert would overwrite rows a newer lease wrote. Insert new rows with "
        "bulk_create() (ignore_conflicts=True is fine) and change existing ones with "
        "fenced(T).update(), or claim() and save() (update_or_create() saves through the "
        "guard too)."
    )


def unguarded_error(model: type[models.Model], pk: Any, action: str) -> StaleTokenError:
    """The error of an unguarded write to a model with ``fence_required = True``."""
    return StaleTokenError(
        model,
        pk,
        row_token=None,
        token=None,
        message=f"{model_label(model)} requires a fencing token (fence_required = True): "
        f"{action} outside any lock was refused and nothing was written. Run it inside "
        "`with locks[alias].lock(name):`, or pass the lease's token explicitly.",
    )
