"""FencedModel: the abstract mixin whose ``save()`` and ``delete()`` are fenced in the database.

``django_redlock.models`` re-exports :class:`FencedModel`; import it from there.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, ClassVar

from asgiref.sync import sync_to_async
from django.core import checks
from django.db import models, router, transaction
from django.db.models.signals import class_prepared

from . import cascades, tombstones
from .constraints import fence_constraint, missing_constraint_warnings, owns_fence
from .errors import stale_error, unguarded_error
from .prepare import prepare_fenced_model
from .queries import FencedManager
from .tokens import FIELD, resolve_token, validate_stored

if TYPE_CHECKING:
    from typing import Self


class _Guard:
    """The fence of one ``save()`` call, read by ``_do_update``."""

    def __init__(self, token: int | None, loaded: int | None, adding: bool, fresh_pk: bool) -> None:
        self.token = token  # None: unguarded (the row's fence_token is left as it is)
        self.loaded = loaded  # L: the token the instance was loaded or last saved with
        self.adding = adding
        self.fresh_pk = fresh_pk  # no pk before the save: the database picks a new one
        self.updated = False  # set when the row was UPDATEd (not INSERTed)


class FencedModel(models.Model):
    """Abstract mixin whose writes are fenced by the lock's token, enforced in the database.

    Adds ``fence_token`` (the token of the last guarded write) with a ``>= 0`` check constraint
    (declare ``class Meta(FencedModel.Meta)`` to keep it). Under a token (the innermost active
    lease's, or ``save(fence_token=T)``), saving an existing row runs one
    ``UPDATE ... SET ..., fence_token = T WHERE pk = %s AND fence_token <= T AND fence_token = L``
    where L is the token the instance was loaded (or last saved, or refreshed) with. If it
    matches no row nothing is written and :class:`StaleTokenError` is raised; it never falls back
    to an INSERT. ``delete()`` is guarded the same way, and leaves tombstones of the row's unique
    keys: an insert under an older token of a deleted key raises :class:`StaleTokenError`
    (``tombstones``). Without a token a save is a plain Django
    save that leaves ``fence_token`` as it is in the row, unless ``fence_required = True``.
    ``fence_alias = "a"`` lets only leases of alias ``a`` guard the model's writes (tokens of
    two aliases are not comparable); ``_base_manager`` is fenced too (``prepare``).

    Transactions: a rejection found by the database (a stale token) raises inside Django's save
    machinery, so like an ``IntegrityError`` it marks the enclosing ``atomic()`` block for
    rollback; leaving the block with the exception rolls back all of the block's writes, and to
    catch it and carry on, wrap the write in its own ``atomic()``. Errors raised before any SQL
    (a bad token, a missing lease under ``fence_required``) leave the transaction untouched.
    """

    fence_token = models.BigIntegerField(
        default=0, editable=False, help_text="Fencing token of the last guarded write."
    )

    fence_required: ClassVar[bool] = False
    #: if set, only leases of this alias guard writes (tokens of two aliases are not comparable)
    fence_alias: ClassVar[str | None] = None
    #: L: the token the instance was loaded, claimed, saved or reloaded with (None: never
    #: read from the database); a guarded write also requires ``fence_token = L``
    fence_loaded: int | None = None
    _fence_guard: _Guard | None = None

    objects = FencedManager()

    class Meta:
        abstract = True
        constraints: ClassVar[list[models.BaseConstraint]] = [fence_constraint()]

    def save(
        self,
        *,
        force_insert: bool | tuple[models.base.ModelBase, ...] = False,
        force_update: bool = False,
        using: str | None = None,
        update_fields: Iterable[str] | None = None,
        fence_token: int | None = None,
    ) -> None:
        """Save, guarded by ``fence_token`` or the innermost active lease's token."""
        token = resolve_token(fence_token, type(self), self.fence_loaded)
        if token is None and self.fence_required:
            raise unguarded_error(type(self), self.pk, "save()")
        if update_fields is not None:
            update_fields = set(update_fields)
            if not update_fields:
                return  # Django writes nothing: no token bookkeeping either
            if token is not None:
                update_fields.add(FIELD)
        if token is None and self._state.adding:
            validate_stored(self.__dict__.get(FIELD))  # an unguarded insert stores its own
        previous = self.__dict__.get(FIELD)
        if token is not None:
            self.fence_token = token
        guard = self._fence_guard = _Guard(
            token, self.fence_loaded, self._state.adding, self.pk is None
        )
        try:
            super().save(
                force_insert=force_insert,
                force_update=force_update,
                using=using,
                update_fields=update_fields,
            )
        except BaseException:
            if token is not None:
                if previous is None:
                    self.__dict__.pop(FIELD, None)
                else:
                    self.__dict__[FIELD] = previous
            raise
        finally:
            self._fence_guard = None
        if token is not None or not guard.updated:  # guarded, or inserted: the row has it
            self.fence_loaded = self.__dict__.get(FIELD)

    save.alters_data = True  # type: ignore[attr-defined]

    async def asave(self, *, fence_token: int | None = None, **kwargs: Any) -> None:
        """Async :meth:`save`; the active lease is found in the calling task's context."""
        await sync_to_async(self.save)(fence_token=fence_token, **kwargs)

    asave.alters_data = True  # type: ignore[attr-defined]

    def delete(
        self, using: Any = None, keep_parents: bool = False, *, fence_token: int | None = None
    ) -> tuple[int, dict[str, int]]:
        """Delete, guarded like :meth:`save`: a stale lease's delete raises, deletes nothing."""
        token = resolve_token(fence_token, type(self), self.fence_loaded)
        if token is None:
            if self.fence_required:
                raise unguarded_error(type(self), self.pk, "delete()")
            return super().delete(using=using, keep_parents=keep_parents)
        db = using or router.db_for_write(type(self), instance=self)
        rows = type(self)._base_manager.using(db).filter(pk=self.pk)
        conditions = {f"{FIELD}__lte": token}
        if self.fence_loaded is not None:
            conditions[FIELD] = self.fence_loaded
        with transaction.atomic(using=db, savepoint=False):
            if not models.QuerySet.update(rows.filter(**conditions), **{FIELD: token}):
                row_token = rows.values_list(FIELD, flat=True).first()
                raise stale_error(
                    type(self), self.pk, token=token, loaded=self.fence_loaded, row_token=row_token
                )
            keysets = tombstones.deleted_keys(type(self), keep_parents)
            if all(keyset.is_pk for keyset in keysets):  # what Django deletes by
                keys = {key: k.label for key, k in tombstones.instance_keys(self, keysets).items()}
            else:  # the row's unique values, not the instance's (it may have changed them)
                keys = tombstones.queryset_keys(rows, keysets)
            with cascades.covering(token, type(self), [self.pk], keep_parents):
                deleted = super().delete(using=db, keep_parents=keep_parents)
            tombstones.record(db, keys, token)
            return deleted

    delete.alters_data = True  # type: ignore[attr-defined]

    async def adelete(
        self, using: Any = None, keep_parents: bool = False, *, fence_token: int | None = None
    ) -> tuple[int, dict[str, int]]:
        """Async :meth:`delete`."""
        return await sync_to_async(self.delete)(
            using=using, keep_parents=keep_parents, fence_token=fence_token
        )

    adelete.alters_data = True  # type: ignore[attr-defined]

    @classmethod
    def from_db(cls, db: str | None, field_names: Any, values: Any, **kwargs: Any) -> Self:
        """Load a row and remember its token as L."""
        instance = super().from_db(db, field_names, values, **kwargs)
        instance.fence_loaded = instance.__dict__.get(FIELD)
        return instance

    def refresh_from_db(
        self,
        using: str | None = None,
        fields: Iterable[str] | None = None,
        *args: Any,
        **kwargs: Any,
    ) -> None:
        """Reload fields; if ``fence_token`` is among them, L becomes the reloaded token."""
        fields = None if fields is None else list(fields)
        kept = self.__dict__.get(FIELD)
        super().refresh_from_db(using, fields, *args, **kwargs)
        if fields is not None and FIELD not in fields:
            if kept is not None:  # the fenced base manager loads it anyway: keep it as it was
                self.__dict__[FIELD] = kept
        elif FIELD in self.__dict__:
            self.fence_loaded = self.__dict__[FIELD]

    def _do_insert(self, manager: Any, using: Any, fields: Any, *args: Any, **kwargs: Any) -> Any:
        """Django's INSERT step: a row stores only a valid token (also for raw saves); a
        guarded insert is refused if a newer token deleted one of the row's unique keys."""
        if any(field.name == FIELD for field in fields):
            validate_stored(self.__dict__.get(FIELD))
        insert = super()._do_insert  # type: ignore[misc]
        guard = self._fence_guard
        if guard is None or guard.token is None:  # unguarded: a plain Django insert
            return insert(manager, using, fields, *args, **kwargs)
        keysets = tombstones.local_keys(manager.model)
        if guard.fresh_pk and len(keysets) == 1:  # only a pk, which the database picks new
            return insert(manager, using, fields, *args, **kwargs)
        with transaction.atomic(using=using, savepoint=False):  # the lookup after the INSERT
            result = insert(manager, using, fields, *args, **kwargs)
            keys = tombstones.instance_keys(self, keysets, skip_pk=guard.fresh_pk)
            tombstones.refuse_resurrection(using, manager.model, self.pk, keys, guard.token)
            return result

    def _do_update(
        self,
        base_qs: Any,
        using: Any,
        pk_val: Any,
        values: Any,
        update_fields: Any,
        forced_update: Any,
        *args: Any,
        **kwargs: Any,
    ) -> Any:
        """Django's UPDATE step of ``save()``, with the fence guard added to its WHERE."""
        guard = self._fence_guard
        if guard is None or not owns_fence(base_qs.model):
            return super()._do_update(
                base_qs, using, pk_val, values, update_fields, forced_update, *args, **kwargs
            )
        if guard.token is None:  # unguarded: never write (so never lower) the row's token
            values = [value for value in values if value[0].name != FIELD]
            result = super()._do_update(
                base_qs, using, pk_val, values, update_fields, forced_update, *args, **kwargs
            )
            guard.updated = bool(result)
            return result
        conditions = {f"{FIELD}__lte": guard.token}
        if guard.loaded is not None:
            conditions[FIELD] = guard.loaded
        updated = super()._do_update(
            base_qs.filter(**conditions),
            using,
            pk_val,
            values,
            update_fields,
            forced_update,
            *args,
            **kwargs,
        )
        if updated:
            guard.updated = True
            return updated
        row_token = base_qs.filter(pk=pk_val).values_list(FIELD, flat=True).first()
        if row_token is None and guard.adding:
            return updated  # a new instance with an explicit pk: Django inserts it
        raise stale_error(
            type(self), pk_val, token=guard.token, loaded=guard.loaded, row_token=row_token
        )

    @classmethod
    def check(cls, **kwargs: Any) -> list[checks.CheckMessage]:
        """Django's model checks, plus: the ``fence_token >= 0`` constraint is declared."""
        errors = super().check(**kwargs)
        errors.extend(missing_constraint_warnings(cls))
        return errors


def _on_class_prepared(sender: type[models.Model], **kwargs: Any) -> None:
    if issubclass(sender, FencedModel):
        prepare_fenced_model(sender)
        cascades.watch(sender)


class_prepared.connect(_on_class_prepared, dispatch_uid="django_redlock.fencing.prepare")
