"""Deleted rows stay deleted (docs/fencedmodel.md): a row deleted under token T is not inserted
again under a token below T, whichever insert path the stale lease takes.

The stale lease is a real one: acquired, then force-released (an operator, or its TTL ran out
while its holder was paused), so that a newer lease takes the name and deletes the row; the
"zombie" then wakes up inside its old lease. SQLite and PostgreSQL.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import timedelta
from io import StringIO
from typing import Any

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connection, models, transaction
from django.test.utils import isolate_apps
from django.utils import timezone

from django_redlock import locks
from django_redlock.exceptions import StaleTokenError
from django_redlock.fencing import tombstones
from django_redlock.locking import context
from django_redlock.models import FencedModel, FenceTombstone
from testproject.inventory.models import Product
from tests.fencing_app.models import Coupon, Event, Hall, Pass, Seat, Ticket
from tests.support.fencing import fence_oracle

pytestmark = pytest.mark.usefixtures("fence_oracle")
__all__ = ["fence_oracle"]


@contextmanager
def zombie(name: str, delete: Callable[[], Any]) -> Iterator[tuple[Any, Any]]:
    """Yield (stale lease A, newer lease B): B ran ``delete`` after A lost the name; inside
    the block A is the innermost active lease again (the zombie woke up)."""
    stale = locks["default"].acquire(name, ttl=30)
    context.deactivate(stale)
    locks["default"].force_release(name)  # A loses the name without knowing it
    with locks["default"].lock(name) as newer:
        delete()
    assert newer.token > stale.token
    entered = context.push(stale)
    try:
        yield stale, newer
    finally:
        context.pop(entered)


@contextmanager
def refused(stale: Any, newer: Any) -> Iterator[Any]:
    """Expect the insert to be refused for the newer lease's delete, in its own savepoint."""
    with (
        pytest.raises(StaleTokenError, match="insert with fencing token") as caught,
        transaction.atomic(),
    ):
        yield caught
    assert caught.value.token == stale.token
    assert caught.value.deleted_token == newer.token
    assert caught.value.row_token is None


def coupons() -> list[tuple[str, int, int]]:
    return list(Coupon.objects.values_list("code", "amount", "fence_token"))


@pytest.fixture
def coupon(db: None) -> Coupon:
    return Coupon.objects.create(code="rs-1", amount=10)


def delete_coupon() -> None:
    Coupon.objects.get(code="rs-1").delete()


# -- each insert path of a stale lease is refused ---------------------------------------------


def test_zombie_update_or_create_does_not_bring_back_a_deleted_row(
    coupon: Coupon, unique_name: str
):
    """update_or_create() of a stale lease, after a newer lease deleted the row,
    raises StaleTokenError and inserts nothing."""
    with zombie(unique_name, delete_coupon) as (stale, newer), refused(stale, newer) as caught:
        Coupon.objects.update_or_create(code="rs-1", defaults={"amount": 99})
    assert "same code was deleted under token" in str(caught.value)
    assert coupons() == []


def test_zombie_get_or_create_does_not_bring_back_a_deleted_row(coupon: Coupon, unique_name: str):
    """get_or_create() of a stale lease does not re-insert a row a newer lease deleted."""
    with zombie(unique_name, delete_coupon) as (stale, newer), refused(stale, newer):
        Coupon.objects.get_or_create(code="rs-1", defaults={"amount": 99})
    assert coupons() == []


def test_zombie_create_and_save_of_a_new_instance_are_refused(coupon: Coupon, unique_name: str):
    """create() and save() of a new instance with a deleted unique value are refused, and the
    instance is left unsaved."""
    with zombie(unique_name, delete_coupon) as (stale, newer):
        with refused(stale, newer):
            Coupon.objects.create(code="rs-1", amount=99)
        fresh = Coupon(code="rs-1", amount=98)
        with refused(stale, newer):
            fresh.save()
        assert fresh._state.adding and fresh.fence_token == 0
        Coupon.objects.create(code="rs-2", amount=1)  # another key: not fenced by the delete
    assert coupons() == [("rs-2", 1, stale.token)]


def test_zombie_bulk_create_is_refused_whole(coupon: Coupon, unique_name: str):
    """bulk_create() of a stale lease with one deleted key inserts none of its rows, also with
    ignore_conflicts=True (the deleted key's row would be inserted)."""
    with zombie(unique_name, delete_coupon) as (stale, newer):
        for options in ({}, {"ignore_conflicts": True}):
            batch = [Coupon(code="rs-0"), Coupon(code="rs-1", amount=99), Coupon(code="rs-2")]
            with refused(stale, newer):
                Coupon.objects.bulk_create(batch, **options)
    assert coupons() == []


def test_zombie_reinsert_by_primary_key_is_refused(db: None, unique_name: str):
    """A model whose only unique key is its primary key: save(), create() and
    update_or_create() with the deleted row's pk are refused under an older token."""
    product = Product.objects.create(name="widget", stock=10)

    def delete() -> None:
        Product.objects.filter(pk=product.pk).delete()  # a queryset delete, under the lease

    with zombie(unique_name, delete) as (stale, newer):
        with refused(stale, newer) as caught:
            Product.objects.update_or_create(pk=product.pk, defaults={"stock": 99})
        assert caught.value.pk == product.pk and "same id" in str(caught.value)
        with refused(stale, newer):
            Product.objects.create(pk=product.pk, name="again", stock=1)
        with refused(stale, newer):
            Product(pk=product.pk, name="again", stock=1).save()
        with refused(stale, newer):
            Product.objects.bulk_create([Product(pk=product.pk, name="again")])
        Product.objects.create(name="new", stock=1)  # a new pk: allowed
    assert list(Product.objects.values_list("name", flat=True)) == ["new"]


def test_a_composite_unique_key_is_fenced(db: None, unique_name: str):
    """A UniqueConstraint over two fields: the deleted (hall, number) is refused, another
    number in the same hall is not."""
    Seat.objects.create(hall="A", number=1, holder="ann")
    Seat.objects.create(hall="A", number=2, holder="bob")

    def delete() -> None:
        Seat.objects.filter(hall="A", number=1).delete()

    with zombie(unique_name, delete) as (stale, newer):
        with refused(stale, newer) as caught:
            Seat.objects.update_or_create(hall="A", number=1, defaults={"holder": "zed"})
        assert "same hall, number" in str(caught.value)
        Seat.objects.create(hall="A", number=3, holder="cy")
    assert sorted(Seat.objects.values_list("number", "holder")) == [(2, "bob"), (3, "cy")]


def test_a_delete_records_the_rows_key_not_the_instances(coupon: Coupon, unique_name: str):
    """An instance whose unique value was changed in memory but not saved: its delete fences
    the value the row had."""
    loaded = Coupon.objects.get(code="rs-1")
    loaded.code = "edited-not-saved"

    with zombie(unique_name, loaded.delete) as (stale, newer):
        with refused(stale, newer):
            Coupon.objects.create(code="rs-1")
        Coupon.objects.create(code="edited-not-saved")
    assert [code for code, _, _ in coupons()] == ["edited-not-saved"]


@pytest.mark.django_db(transaction=True)
def test_a_multi_table_child_fences_its_parents_key_too(unique_name: str):
    """Deleting a multi-table-inheritance child deletes its parent's row too: neither the
    child nor the parent can be inserted again with that pk under an older token."""
    with isolate_apps("testproject.inventory"):

        class Item(FencedModel):
            __module__ = Product.__module__
            stock = models.IntegerField(default=0)

            class Meta(FencedModel.Meta):
                pass

        class Special(Item):
            __module__ = Product.__module__
            extra = models.IntegerField(default=0)

        with connection.schema_editor() as editor:
            editor.create_model(Item)
            editor.create_model(Special)
        try:
            pk = Special.objects.create(stock=1, extra=1).pk

            def delete() -> None:
                Special.objects.get(pk=pk).delete()

            with zombie(unique_name, delete) as (stale, newer):
                with refused(stale, newer):
                    Special.objects.create(pk=pk, stock=2)
                with refused(stale, newer):
                    Item.objects.create(pk=pk, stock=2)
            assert not Item.objects.exists()
        finally:
            with connection.schema_editor() as editor:
                editor.delete_model(Special)
                editor.delete_model(Item)


# -- what stays allowed ------------------------------------------------------------------------


def test_newer_or_equal_token_may_create_the_row_again(coupon: Coupon, unique_name: str):
    """Once deleted under T, the key is refused below T but can be created again under T (the
    deleting lease itself) and by any newer lease."""
    with zombie(unique_name, delete_coupon) as (stale, newer), refused(stale, newer):
        Coupon.objects.create(code="rs-1")
    Coupon(code="rs-1", amount=1).save(fence_token=newer.token)
    assert coupons() == [("rs-1", 1, newer.token)]
    with locks["default"].lock(unique_name) as newest:
        Coupon.objects.get(code="rs-1").delete()
        Coupon.objects.update_or_create(code="rs-1", defaults={"amount": 3})
    assert coupons() == [("rs-1", 3, newest.token)]


def test_a_tombstone_keeps_its_highest_token(coupon: Coupon, unique_name: str):
    """A key deleted under T3, created again without a lease and deleted under T1 < T3 still
    refuses a token between them."""
    tokens = []
    for _ in range(3):
        lease = locks["default"].acquire(unique_name, ttl=5)
        tokens.append(lease.token)
        lease.release()
    low, middle, high = tokens
    Coupon.objects.get(code="rs-1").delete(fence_token=high)
    Coupon.objects.create(code="rs-1")  # no lease: an unguarded insert stores token 0
    Coupon.objects.get(code="rs-1").delete(fence_token=low)
    with pytest.raises(StaleTokenError) as caught, transaction.atomic():
        Coupon.objects.fenced(middle).bulk_create([Coupon(code="rs-1")])
    assert caught.value.deleted_token == high
    assert coupons() == []


def test_ignore_conflicts_refuses_only_a_deleted_key_it_would_insert(
    coupon: Coupon, unique_name: str
):
    """bulk_create(ignore_conflicts=True) of a stale lease: a deleted key that a newer lease
    created again conflicts and is skipped, so the call goes through; a deleted key that it
    would insert is refused."""
    Coupon.objects.create(code="rs-3", amount=30)

    def delete_two_and_recreate_one() -> None:
        Coupon.objects.filter(code__in=["rs-1", "rs-3"]).delete()
        Coupon.objects.create(code="rs-1", amount=50)

    with zombie(unique_name, delete_two_and_recreate_one) as (stale, newer):
        Coupon.objects.bulk_create(
            [Coupon(code="rs-1", amount=99), Coupon(code="rs-9")], ignore_conflicts=True
        )
        with refused(stale, newer):
            Coupon.objects.bulk_create([Coupon(code="rs-3", amount=99)], ignore_conflicts=True)
    assert sorted(coupons()) == [("rs-1", 50, newer.token), ("rs-9", 0, stale.token)]


def test_inserts_without_a_lease_are_not_checked(coupon: Coupon, unique_name: str):
    """An unguarded insert (no lease, no token) is a plain Django insert: it is not checked
    against tombstones (fence_required refuses it instead)."""
    with locks["default"].lock(unique_name) as lease:
        delete_coupon()
    assert FenceTombstone.objects.filter(token=lease.token).count() == 2  # the pk and the code
    Coupon.objects.create(code="rs-1", amount=5)
    assert coupons() == [("rs-1", 5, 0)]


# -- cost and housekeeping ---------------------------------------------------------------------


def test_the_insert_path_costs_one_lookup_and_none_for_a_new_pk(
    db: None, unique_name: str, django_assert_num_queries
):
    """Under a lease, an insert with a database-chosen pk and no other unique key runs only
    its INSERT; one with a unique field runs one tombstone lookup more."""
    with locks["default"].lock(unique_name):
        with django_assert_num_queries(1):
            Product.objects.create(name="p", stock=1)
        with django_assert_num_queries(2) as captured:
            Coupon.objects.create(code="c-1")
    assert "django_redlock_fencetombstone" in captured.captured_queries[1]["sql"]


def test_prune_tombstones_deletes_only_old_ones(coupon: Coupon, unique_name: str):
    """`manage.py redlock prune-tombstones --days N` deletes tombstones older than N days."""
    with locks["default"].lock(unique_name):
        delete_coupon()
    assert FenceTombstone.objects.count() == 2
    FenceTombstone.objects.update(deleted_at=timezone.now() - timedelta(days=40))
    Coupon.objects.create(code="kept")
    with locks["default"].lock(unique_name):
        Coupon.objects.get(code="kept").delete()
    out = StringIO()
    call_command("redlock", "prune-tombstones", "--days", "30", stdout=out)
    assert "Deleted 2 tombstone(s) older than 30 day(s)" in out.getvalue()
    assert FenceTombstone.objects.count() == 2
    assert tombstones.prune(timedelta(0)) == 2
    assert tombstones.prune(timedelta.max) == 0  # was an OverflowError
    with pytest.raises(ValueError, match="negative"):
        tombstones.prune(timedelta(days=-1))
    for bad in ("-1", "1e9", "1e400", "nan", "inf"):  # 1e9 and 1e400 were OverflowError
        with pytest.raises(CommandError, match="--days must be a number from 0 to 36525"):
            call_command("redlock", "prune-tombstones", "--days", bad)


# -- rows Django deletes by cascade, and plain querysets ---------------------------------------


def _halls() -> tuple[Hall, Hall]:
    doomed, other = Hall.objects.create(name="doomed"), Hall.objects.create(name="other")
    Ticket.objects.create(hall=doomed, code="t-1")
    Ticket.objects.create(hall=doomed, code="t-2")
    return doomed, other


@pytest.mark.parametrize(
    "delete",
    [
        lambda: Hall.objects.get(name="doomed").delete(),
        lambda: Hall.objects.filter(name="doomed").delete(),
        lambda: models.QuerySet.delete(Ticket.objects.filter(code__startswith="t-")),
    ],
    ids=["parent.delete()", "parent queryset.delete()", "plain QuerySet.delete()"],
)
def test_a_cascaded_delete_leaves_tombstones(db: None, unique_name: str, delete: Any) -> None:
    """A newer lease deletes an unfenced parent (or the rows through a plain queryset); Django
    deletes the fenced children by cascade: the zombie cannot create a child again under
    another parent (it used to: a cascaded row left no tombstone)."""
    _, other = _halls()
    with zombie(unique_name, delete) as (stale, newer):
        for code in ("t-1", "t-2"):
            with refused(stale, newer):
                Ticket.objects.create(hall=other, code=code)
    assert list(Ticket.objects.values_list("code", flat=True)) == []


def test_a_fenced_parents_delete_fences_its_cascaded_children(db: None, unique_name: str) -> None:
    """A fenced parent's delete under token T: its cascaded fenced children get tombstones
    under T too; the parent's own keys are recorded once (by its fenced delete)."""
    event = Event.objects.create(name="gala")
    Pass.objects.create(event=event, code="p-1")
    spare = Event.objects.create(name="spare")
    before = FenceTombstone.objects.count()
    with zombie(unique_name, lambda: Event.objects.get(name="gala").delete()) as (stale, newer):
        with refused(stale, newer):
            Pass.objects.create(event=spare, code="p-1")
        with refused(stale, newer):
            Event.objects.create(name="gala")
    # the parent's pk and name, the child's pk and code: four keys, no more
    assert FenceTombstone.objects.count() - before == 4
    assert set(FenceTombstone.objects.values_list("token", flat=True)) == {newer.token}


def test_a_cascade_without_a_lease_leaves_no_tombstone(db: None) -> None:
    """A plain delete (no active lease, no token) records nothing, cascade or not."""
    _halls()
    before = FenceTombstone.objects.count()
    Hall.objects.get(name="doomed").delete()
    assert FenceTombstone.objects.count() == before
    assert Ticket.objects.count() == 0
