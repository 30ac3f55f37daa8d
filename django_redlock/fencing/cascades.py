"""Tombstones for the FencedModel rows Django deletes on its own: by cascade
(``on_delete=CASCADE`` from a deleted parent, fenced or not) and through querysets that are not
a ``FencedQuerySet`` (a plain manager, ``models.QuerySet.delete``).

Every concrete FencedModel gets a ``pre_delete`` receiver (:func:`watch`). That keeps Django's
deletion collector from deleting its rows without loading them (its "fast delete" is only for
models nobody listens to), so each deleted row reaches :func:`_deleted`, in the delete's
transaction, with the values read from the database. Under a token (the fenced delete's own,
else the active lease's) it records the row's tombstones (``tombstones``), like
``FencedModel.delete()`` does for the row it deletes; without a token it records nothing, as a
plain delete does not. The rows a fenced ``delete()`` records itself are skipped (:func:`covering`).

What it costs: a delete that reaches a FencedModel by cascade loads those rows (Django's
collector does, to send the signal) and, under a token, writes one tombstone statement per row.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterable, Iterator
from typing import Any

from django.db import models
from django.db.models.signals import pre_delete

from . import tombstones
from .tokens import resolve_token


class _Covered:
    """A fenced delete in progress: its token, and the rows it records tombstones for itself
    (by model table and pk)."""

    __slots__ = ("rows", "token")

    def __init__(self, token: int, rows: set[tuple[str, Any]]) -> None:
        self.token = token
        self.rows = rows


_covering: contextvars.ContextVar[_Covered | None] = contextvars.ContextVar(
    "django_redlock_fenced_delete", default=None
)


def _row(model: type[models.Model], pk: Any) -> tuple[str, Any]:
    concrete = model._meta.concrete_model or model
    return concrete._meta.db_table, pk


@contextlib.contextmanager
def covering(
    token: int, model: type[models.Model], pks: Iterable[Any], keep_parents: bool = False
) -> Iterator[None]:
    """Within the block, a fenced delete under ``token`` records the tombstones of ``model``'s
    rows ``pks`` (and of their multi-table parents, unless ``keep_parents``) itself; the rows
    it reaches by cascade get tombstones under ``token`` from :func:`_deleted`."""
    chain = [model._meta.concrete_model or model]
    if not keep_parents:
        opts = chain[0]._meta
        chain += list(getattr(opts, "all_parents", None) or opts.get_parent_list())
    rows = {_row(table, pk) for pk in pks for table in chain}
    reset = _covering.set(_Covered(token, rows))
    try:
        yield
    finally:
        _covering.reset(reset)


def _deleted(sender: type[models.Model], instance: models.Model, using: str, **_: Any) -> None:
    """``pre_delete`` of a FencedModel row: record its tombstones under the delete's token."""
    covered = _covering.get()
    if covered is not None:
        if _row(type(instance), instance.pk) in covered.rows:
            return  # the fenced delete records this row's keys itself
        token: int | None = covered.token
    else:
        token = resolve_token(None, type(instance), None)
    if token is None:
        return  # a delete without a token leaves no tombstone
    keys = tombstones.instance_keys(instance, tombstones.local_keys(type(instance)))
    tombstones.record(using, {key: keyset.label for key, keyset in keys.items()}, token)


def watch(model: type[models.Model]) -> None:
    """Connect :func:`_deleted` for a concrete FencedModel (once per model)."""
    if model._meta.abstract:
        return
    pre_delete.connect(
        _deleted,
        sender=model,
        weak=False,
        dispatch_uid=f"django_redlock.fencing.cascades:{model._meta.label_lower}:{id(model)}",
    )
