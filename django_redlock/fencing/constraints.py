"""The ``fence_token >= 0`` check constraint of fenced tables, and its W101 system check."""

from __future__ import annotations

from typing import Any

import django
from django.core import checks
from django.db import models

from .tokens import FIELD

CONSTRAINT_NAME = "%(app_label)s_%(class)s_fence_token_gte_0"


def fence_constraint() -> models.CheckConstraint:
    """A new ``fence_token >= 0`` check constraint (``FencedModel.Meta.constraints``)."""
    rule = models.Q(**{f"{FIELD}__gte": 0})
    # Django 5.1 renamed ``check=`` to ``condition=`` (the old name warns, and is gone in 6.0).
    kwargs: dict[str, Any] = {"condition" if django.VERSION >= (5, 1) else "check": rule}
    return models.CheckConstraint(name=CONSTRAINT_NAME, **kwargs)


def owns_fence(model: type[models.Model]) -> bool:
    """True if ``model``'s own table holds the ``fence_token`` column."""
    return any(field.name == FIELD for field in model._meta.local_fields)


def is_fence_constraint(constraint: models.BaseConstraint) -> bool:
    """True for the constraint made by :func:`fence_constraint` (after name interpolation)."""
    return str(constraint.name).endswith("_fence_token_gte_0")


def missing_constraint_warnings(model: type[models.Model]) -> list[checks.CheckMessage]:
    """``django_redlock.W101`` if ``model`` owns the column but not its constraint."""
    if not owns_fence(model) or any(is_fence_constraint(c) for c in model._meta.constraints):
        return []
    return [
        checks.Warning(
            f"{model._meta.label} has no 'fence_token >= 0' check constraint.",
            hint="Declare its Meta as `class Meta(FencedModel.Meta):`, and keep "
            "FencedModel.Meta.constraints when setting constraints.",
            obj=model,
            id="django_redlock.W101",
        )
    ]
