"""FencedQuerySet and FencedManager: ``fenced(T)``, ``claim()`` and guarded bulk writes."""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from contextlib import nullcontext
from typing import TYPE_CHECKING, Any, TypeVar

from asgiref.sync import sync_to_async
from django.db import models, transaction

from ..exceptions import StaleTokenError
from . import cascades, tombstones
from .errors import model_label, resurrect_error, stale_error, unguarded_error, upsert_error
from .tokens import FIELD, resolve_token, validate_stored, validate_token

if TYPE_CHECKING:
    from typing import Self

_M = TypeVar("_M", bound=models.Model)


class FencedQuerySet(models.QuerySet[_M]):
    """A queryset whose ``update()`` is guarded by a fencing token.

    ``fenced(T)`` fixes the token; otherwise the innermost active lease's token is used, and
    without either ``update()`` is a plain Django update (refused if ``fence_required``).
    """

    _fence: int | None = None

    def _clone(self) -> Self:
        clone: Self = super()._clone()  # type: ignore[misc]
        clone._fence = self._fence
        return clone

    def fenced(self, token: int) -> Self:
        """This queryset with its writes guarded by ``token`` (validated before any SQL)."""
        fence = validate_token(token)
        clone = self.all()
        clone._fence = fence
        return clone

    def _token(self) -> int | None:
        return self._fence if self._fence is not None else resolve_token(model=self.model)

    def _stamp(self, token: int) -> int:
        """Set ``fence_token = T`` on the rows with ``fence_token <= T``; the count updated."""
        return models.QuerySet.update(self.filter(**{f"{FIELD}__lte": token}), **{FIELD: token})

    def update(self, **kwargs: Any) -> int:
        """Update the rows; under a token only those with ``fence_token <= T``, stamping T."""
        token = self._token()
        if token is None:
            if getattr(self.model, "fence_required", False):
                raise unguarded_error(self.model, None, "update()")
            if FIELD in kwargs:
                validate_stored(kwargs[FIELD])
            return super().update(**kwargs)
        if FIELD in kwargs:
            raise TypeError(f"A guarded update() sets {FIELD} itself; do not pass it.")
        guarded = self.filter(**{f"{FIELD}__lte": token})
        return models.QuerySet.update(guarded, **kwargs, **{FIELD: token})

    update.alters_data = True  # type: ignore[attr-defined]

    def delete(self) -> tuple[int, dict[str, int]]:
        """Delete the rows; under a token only those with ``fence_token <= T``."""
        token = self._token()
        if token is None:
            if getattr(self.model, "fence_required", False):
                raise unguarded_error(self.model, None, "delete()")
            return super().delete()
        with transaction.atomic(using=self.db, savepoint=False):
            self._stamp(token)  # locks the rows it may delete until the transaction ends
            doomed = self.filter(**{FIELD: token})
            keysets = tombstones.deleted_keys(self.model)
            pks: list[Any] = []
            keys = tombstones.queryset_keys(doomed, keysets, stream=True, pks=pks)
            with cascades.covering(token, self.model, pks):
                deleted = models.QuerySet.delete(doomed)
            tombstones.record(self.db, keys, token)
            return deleted

    delete.alters_data = True  # type: ignore[attr-defined]
    delete.queryset_only = True  # type: ignore[attr-defined]

    def bulk_create(
        self,
        objs: Iterable[_M],
        batch_size: int | None = None,
        ignore_conflicts: bool = False,
        update_conflicts: bool = False,
        update_fields: Collection[str] | None = None,
        unique_fields: Collection[str] | None = None,
    ) -> list[_M]:
        """Insert ``objs``; under a token each row stores it, and the call is refused
        (``StaleTokenError``, nothing written) if a newer token deleted a key it inserted.

        Under a token ``update_conflicts=True`` is refused (``ValueError``, before any SQL):
        the conflict update cannot carry the guard. Without one, the conflict update never
        writes ``fence_token``, and inserted rows store theirs only if it is a valid token.
        """
        objs = list(objs)
        token = self._token()
        if token is None and getattr(self.model, "fence_required", False):
            raise unguarded_error(self.model, None, "bulk_create()")
        if update_conflicts and token is not None:
            raise upsert_error(self.model)
        if update_conflicts and update_fields is not None:
            update_fields = [name for name in update_fields if name != FIELD]
            if not update_fields:
                raise ValueError(
                    f"{model_label(self.model)}: bulk_create(update_conflicts=True) never "
                    f"writes {FIELD} (it would lower the row's token); name other fields."
                )
        for obj in objs:
            if token is None:
                validate_stored(getattr(obj, FIELD))
            else:
                obj.fence_token = obj.fence_loaded = token  # type: ignore[attr-defined]
        keysets = tombstones.local_keys(self.model)
        fresh = [obj.pk is None for obj in objs]  # pks the database picks are new ones
        check = token is not None and (len(keysets) > 1 or not all(fresh))
        with transaction.atomic(using=self.db, savepoint=False) if check else nullcontext():
            created = super().bulk_create(
                objs,
                batch_size=batch_size,
                ignore_conflicts=ignore_conflicts,
                update_conflicts=update_conflicts,
                update_fields=update_fields,
                unique_fields=unique_fields,
            )
            if check and token is not None:
                self._refuse_resurrection(objs, fresh, keysets, token, ignore_conflicts)
        return created

    def _refuse_resurrection(
        self,
        objs: list[_M],
        fresh: list[bool],
        keysets: tuple[tombstones.KeySet, ...],
        token: int,
        ignore_conflicts: bool,
    ) -> None:
        """``bulk_create()``'s tombstone check, after its INSERTs (see ``tombstones``)."""
        keys: dict[str, tuple[_M, tombstones.KeySet]] = {}
        for obj, new_pk in zip(objs, fresh, strict=True):
            found = tombstones.instance_keys(obj, keysets, skip_pk=new_pk)
            keys.update((key, (obj, keyset)) for key, keyset in found.items())
        while keys:
            hit = tombstones.newer(self.db, list(keys), token)
            if hit is None:
                return
            obj, keyset = keys.pop(hit[0])
            if ignore_conflicts:  # a conflicting row was left alone: was this one inserted?
                values = {name: getattr(obj, name) for name in keyset.attnames}
                landed = self.model._base_manager.using(self.db).filter(**values, **{FIELD: token})
                if not landed.exists():
                    continue  # the row with that key is someone else's: nothing resurrected
            fields = tuple(field.name for field in keyset.fields)
            raise resurrect_error(self.model, obj.pk, fields, token=token, deleted=hit[1])

    def only(self, *fields: str) -> Self:
        """Like ``QuerySet.only()``, but ``fence_token`` is always loaded (the guard needs it)."""
        return super().only(*fields, FIELD) if fields else super().only(*fields)

    def defer(self, *fields: Any) -> Self:
        """Like ``QuerySet.defer()``, but ``fence_token`` is never deferred."""
        return super().defer(*[name for name in fields if name != FIELD])

    def claim(self, pk: Any, *, token: int | None = None) -> _M:
        """Stamp row ``pk`` with the lease's token and return it freshly read, atomically.

        After a claim no older lease can write the row, and a save of the returned instance
        fails if anyone else wrote it since. Raises ``DoesNotExist`` if there is no such row
        and ``StaleTokenError`` if a newer lease already wrote it.
        """
        fence = validate_token(token) if token is not None else self._token()
        if fence is None:
            raise StaleTokenError(
                self.model,
                pk,
                row_token=None,
                token=None,
                message=f"{model_label(self.model)}.objects.claim(pk={pk!r}) needs a fencing "
                "token: call it inside `with locks[alias].lock(name):` or pass token=.",
            )
        with transaction.atomic(using=self.db, savepoint=False):
            if not self.filter(pk=pk)._stamp(fence):
                row_token = self.filter(pk=pk).values_list(FIELD, flat=True).first()
                if row_token is None:
                    raise self.model.DoesNotExist(  # type: ignore[attr-defined]
                        f"{self.model._meta.object_name} matching pk={pk!r} does not exist."
                    )
                raise stale_error(self.model, pk, token=fence, loaded=None, row_token=row_token)
            return self.get(pk=pk)

    async def aclaim(self, pk: Any, *, token: int | None = None) -> _M:
        """Async :meth:`claim`."""
        return await sync_to_async(self.claim)(pk, token=token)

    def claim_many(self, tokens: Mapping[Any, int]) -> dict[Any, _M]:
        """:meth:`claim` several rows at once, all or none: ``tokens`` maps each row's pk to
        the token to stamp it with (from ``lock_many``: ``{pk: held.leases[name].token}``).
        Returns the rows freshly read, by pk. One transaction: if any row is missing or was
        written by a newer lease, nothing is stamped and the error is raised."""
        if not isinstance(tokens, Mapping) or not tokens:
            raise TypeError("claim_many() takes a non-empty mapping of pk -> fencing token.")
        checked = {pk: validate_token(token) for pk, token in tokens.items()}
        with transaction.atomic(using=self.db):
            for pk, token in sorted(checked.items(), key=lambda item: str(item[0])):
                self.claim(pk, token=token)  # a fixed order: two claims cannot deadlock
            rows = self.in_bulk(list(checked))
        return {pk: rows[pk] for pk in checked}

    async def aclaim_many(self, tokens: Mapping[Any, int]) -> dict[Any, _M]:
        """Async :meth:`claim_many`."""
        return await sync_to_async(self.claim_many)(tokens)


# The default manager of FencedModel: ``objects.fenced(T)``, ``objects.claim(pk=...)``.
FencedManager = models.Manager.from_queryset(FencedQuerySet)
