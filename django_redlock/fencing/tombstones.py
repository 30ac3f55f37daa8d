"""Tombstones: a fenced delete remembers its token so a stale lease cannot insert the row again.

A guarded delete of a FencedModel row (``instance.delete()`` or a queryset's ``delete()`` under
a token T) records, in the same transaction, one tombstone per unique key of the row: the
primary key and every unique field, ``unique_together`` and ``UniqueConstraint`` (without
condition or expressions) whose values are all set. A tombstone is the SHA-256 of the model's
label and the key's values, with the highest token that deleted that key.

A guarded insert under token t (``save()`` of a new instance, ``create()``,
``get_or_create()``, ``update_or_create()``, ``bulk_create()``) runs its INSERT, then, in the
same transaction, one indexed lookup: is there a tombstone for one of the new row's keys with a
token above t? If so, ``StaleTokenError`` and the insert is rolled back. Checking *after* the
INSERT is what makes it atomic with the delete: an INSERT of a key whose deleting transaction
has not committed yet waits for it (PostgreSQL's unique index; SQLite's database lock), so the
lookup that follows sees its tombstone (docs/fencedmodel.md, "Deleted rows stay deleted").
"""

from __future__ import annotations

import contextlib
import datetime
import decimal
import hashlib
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from django.core.exceptions import ValidationError
from django.db import connections, models
from django.utils import timezone

from .errors import resurrect_error

#: Keys per lookup or per upsert statement (SQLite allows 999 parameters in one statement).
BATCH = 200


class FenceTombstone(models.Model):
    """One unique key of a FencedModel row deleted under a fencing token (see the module)."""

    key = models.CharField(
        max_length=64, primary_key=True, help_text="SHA-256 of the model label and key values."
    )
    model = models.CharField(max_length=255, help_text="app_label.model of the deleted row.")
    token = models.BigIntegerField(help_text="Highest fencing token that deleted this key.")
    deleted_at = models.DateTimeField(help_text="When the key was last deleted.")

    class Meta:
        app_label = "django_redlock"
        verbose_name = "fence tombstone"
        verbose_name_plural = "fence tombstones"

    def __str__(self) -> str:
        return f"{self.model} {self.key[:12]} (token {self.token})"


@dataclass(frozen=True)
class KeySet:
    """One unique key of one table: its model's label and its fields (``is_pk``: the pk)."""

    label: str
    fields: tuple[models.Field[Any, Any], ...]
    is_pk: bool

    @property
    def attnames(self) -> tuple[str, ...]:
        return tuple(field.attname for field in self.fields)


_LOCAL: dict[type[models.Model], tuple[KeySet, ...]] = {}


def local_keys(model: type[models.Model]) -> tuple[KeySet, ...]:
    """The unique keys enforced by ``model``'s own table (cached per model class)."""
    model = model._meta.concrete_model or model
    found = _LOCAL.get(model)
    if found is not None:
        return found
    opts = model._meta
    label = opts.label_lower
    local = {field.name: field for field in opts.local_concrete_fields}
    pk_fields = tuple(getattr(opts, "pk_fields", None) or [opts.pk])
    sets: list[KeySet] = [KeySet(label, pk_fields, True)]
    seen = {frozenset(field.name for field in pk_fields)}

    def add(names: Iterable[str]) -> None:
        names = tuple(names)
        if not names or frozenset(names) in seen or any(name not in local for name in names):
            return  # a set on another table's columns (never for a valid model) is skipped
        seen.add(frozenset(names))
        sets.append(KeySet(label, tuple(local[name] for name in names), False))

    for field in opts.local_concrete_fields:
        if field.unique and not field.primary_key:
            add([field.name])
    for together in opts.unique_together:
        add(together)
    for constraint in opts.total_unique_constraints:
        add(constraint.fields)
    found = _LOCAL[model] = tuple(sets)
    return found


def deleted_keys(model: type[models.Model], keep_parents: bool = False) -> tuple[KeySet, ...]:
    """The keys a delete of a ``model`` row removes: its table's, and its MTI parents' tables'
    unless ``keep_parents``."""
    concrete = model._meta.concrete_model or model
    chain = [concrete]
    if not keep_parents:
        opts = concrete._meta
        chain += list(getattr(opts, "all_parents", None) or opts.get_parent_list())
    return tuple(keyset for table in chain for keyset in local_keys(table))


def _canonical(field: models.Field[Any, Any], value: Any) -> str | None:
    """One value as text that is equal for equal values (``None``: no key to check)."""
    if value is None or hasattr(value, "resolve_expression"):
        return None
    with contextlib.suppress(ValidationError):  # the database took it: keep it as given
        value = field.to_python(value)
    if value is None:
        return None
    if isinstance(value, datetime.datetime) and value.tzinfo is not None:
        value = value.astimezone(datetime.UTC)
    elif isinstance(value, decimal.Decimal):
        value = value.normalize()
    elif isinstance(value, bytes | memoryview):
        value = bytes(value).hex()
    return str(value)


def digest(keyset: KeySet, values: Sequence[Any]) -> str | None:
    """The tombstone key of ``keyset`` with ``values``, or None if a value is not set."""
    parts = [keyset.label]
    for field, value in zip(keyset.fields, values, strict=True):
        text = _canonical(field, value)
        if text is None:
            return None
        parts.append(f"{field.column}={len(text)}:{text}")
    return hashlib.sha256("\x1f".join(parts).encode()).hexdigest()


def instance_keys(
    instance: models.Model, keysets: Iterable[KeySet], skip_pk: bool = False
) -> dict[str, KeySet]:
    """The tombstone keys of ``instance``'s values (``skip_pk``: a pk it did not choose)."""
    found: dict[str, KeySet] = {}
    for keyset in keysets:
        if skip_pk and keyset.is_pk:
            continue
        key = digest(keyset, [getattr(instance, name) for name in keyset.attnames])
        if key is not None:
            found[key] = keyset
    return found


def row_keys(rows: Iterable[dict[str, Any]], keysets: Sequence[KeySet]) -> dict[str, str]:
    """Tombstone keys -> model labels for ``rows`` (dicts of attname -> value)."""
    found: dict[str, str] = {}
    for row in rows:
        for keyset in keysets:
            key = digest(keyset, [row[name] for name in keyset.attnames])
            if key is not None:
                found[key] = keyset.label
    return found


def queryset_keys(
    queryset: models.QuerySet[Any],
    keysets: Sequence[KeySet],
    stream: bool = False,
    pks: list[Any] | None = None,
) -> dict[str, str]:
    """Tombstone keys -> labels of the rows ``queryset`` matches (one SELECT; ``stream``:
    read in chunks, for a delete of many rows); ``pks``: filled with the rows' primary keys."""
    pk = queryset.model._meta.pk
    assert pk is not None
    names = sorted({name for keyset in keysets for name in keyset.attnames} | {pk.attname})
    rows = queryset.order_by().values_list(*names)
    values = rows.iterator(chunk_size=2000) if stream else rows

    def read() -> Iterator[dict[str, Any]]:
        for row in values:
            found = dict(zip(names, row, strict=True))
            if pks is not None:
                pks.append(found[pk.attname])
            yield found

    return row_keys(read(), keysets)


def _table(db: str) -> tuple[Any, str, str, str]:
    connection = connections[db]
    quote = connection.ops.quote_name
    return connection, quote(FenceTombstone._meta.db_table), quote("key"), quote("token")


def record(db: str, keys: dict[str, str], token: int) -> None:
    """Record ``keys`` (key -> label) as deleted under ``token``; a key keeps its highest."""
    if not keys:
        return
    connection, table, key, tok = _table(db)
    model, when = connection.ops.quote_name("model"), connection.ops.quote_name("deleted_at")
    now = FenceTombstone._meta.get_field("deleted_at").get_db_prep_value(timezone.now(), connection)
    items = list(keys.items())
    with connection.cursor() as cursor:
        for start in range(0, len(items), BATCH):
            batch = items[start : start + BATCH]
            rows = ", ".join(["(%s, %s, %s, %s)"] * len(batch))
            cursor.execute(
                f"INSERT INTO {table} ({key}, {model}, {tok}, {when}) VALUES {rows} "
                f"ON CONFLICT ({key}) DO UPDATE SET {when} = excluded.{when}, "
                f"{tok} = CASE WHEN excluded.{tok} > {table}.{tok} "
                f"THEN excluded.{tok} ELSE {table}.{tok} END",
                [value for k, label in batch for value in (k, label, token, now)],
            )


def newer(db: str, keys: Sequence[str], token: int) -> tuple[str, int] | None:
    """The key among ``keys`` deleted under the highest token above ``token``, with that
    token; None if there is none (one lookup by primary key per ``BATCH`` keys)."""
    best: tuple[str, int] | None = None
    connection, table, key, tok = _table(db)
    with connection.cursor() as cursor:
        for start in range(0, len(keys), BATCH):
            batch = keys[start : start + BATCH]
            where = (
                f"{key} = %s" if len(batch) == 1 else f"{key} IN ({', '.join(['%s'] * len(batch))})"
            )
            cursor.execute(
                f"SELECT {key}, {tok} FROM {table} WHERE {where} AND {tok} > %s", [*batch, token]
            )
            for found, deleted in cursor.fetchall():  # at most one row per key
                if best is None or deleted > best[1]:
                    best = (found, int(deleted))
    return best


def refuse_resurrection(
    db: str, model: type[models.Model], pk: Any, keys: dict[str, KeySet], token: int
) -> None:
    """Raise ``StaleTokenError`` if one of ``keys`` (just inserted under ``token``) was
    deleted under a newer token. Call it after the INSERT, in the INSERT's transaction."""
    if not keys:
        return
    found = newer(db, list(keys), token)
    if found is not None:
        fields = tuple(field.name for field in keys[found[0]].fields)
        raise resurrect_error(model, pk, fields, token=token, deleted=found[1])


def prune(older_than: datetime.timedelta, using: str = "default") -> int:
    """Delete the tombstones last written more than ``older_than`` ago; the number deleted.

    Afterwards a lease older than those deletes could insert their rows again: prune only
    tombstones older than any lease, paused worker included, can live.
    """
    if older_than < datetime.timedelta(0):
        raise ValueError(f"older_than must not be negative, not {older_than}.")
    try:
        cutoff = timezone.now() - older_than
    except OverflowError:  # before year 1: no tombstone is that old
        return 0
    deleted, _ = FenceTombstone.objects.using(using).filter(deleted_at__lt=cutoff).delete()
    return deleted
