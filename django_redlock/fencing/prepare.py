"""What each concrete FencedModel subclass gets once Django has built it (``class_prepared``).

* Its base manager (``Model._base_manager``, which Django uses for related-object writes such
  as ``parent.children.add()``, for saves and for ``refresh_from_db()``) is a fenced one, so
  an ``update()`` through it is guarded and honours ``fence_required`` like ``objects``. Only
  Django's auto-created base manager is replaced (it filters nothing, and neither does the
  fenced one); a ``Meta.base_manager_name`` chosen by the model is kept as it is.
* A model that does not own the ``fence_token`` column (a multi-table-inheritance child, a
  proxy) drops the inherited ``fence_token >= 0`` constraint: it belongs to the parent's table,
  and Django refuses a constraint on a column of another table (``models.E016``).
"""

from __future__ import annotations

from typing import Any

from django.db import models
from django.db.models.options import Options
from django.utils.functional import cached_property

from .constraints import is_fence_constraint, owns_fence
from .queries import FencedManager, FencedQuerySet


class _FencedOptions(Options):  # type: ignore[type-arg]
    """``Options`` whose auto-created base manager is a :data:`FencedManager`."""

    @cached_property
    def base_manager(self) -> Any:
        manager: Any = super().base_manager
        if not manager.auto_created or issubclass(manager._queryset_class, FencedQuerySet):
            return manager
        fenced: Any = FencedManager()
        fenced.name = manager.name
        fenced.model = manager.model
        fenced.auto_created = True
        return fenced


_OPTIONS: dict[type[Options[Any]], type[Options[Any]]] = {}


def _fenced_options(base: type[Options[Any]]) -> type[Options[Any]]:
    """``base`` with the fenced base manager (one subclass per ``Options`` class)."""
    if issubclass(base, _FencedOptions):
        return base
    if base not in _OPTIONS:
        _OPTIONS[base] = (
            _FencedOptions if base is Options else type(base.__name__, (_FencedOptions, base), {})
        )
    return _OPTIONS[base]


def prepare_fenced_model(model: type[models.Model]) -> None:
    """Give ``model`` the fenced base manager; drop a constraint on a column it does not own."""
    opts = model._meta
    opts.__class__ = _fenced_options(type(opts))
    opts.__dict__.pop("base_manager", None)  # computed again, by the fenced class
    if not owns_fence(model):
        opts.constraints = [c for c in opts.constraints if not is_fence_constraint(c)]
