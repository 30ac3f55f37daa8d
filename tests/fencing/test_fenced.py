"""FencedModel (docs/fencedmodel.md): the database rejects stale lock holders, on SQLite and
PostgreSQL.

Leases are real ones from the session's Redis nodes. Where a scenario needs an *older* lease
next to a newer one, it takes two real leases in order and uses their tokens explicitly.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from asgiref.sync import async_to_sync
from django.core import checks
from django.db import IntegrityError, connection, models, transaction
from django.db.models import F
from django.db.transaction import TransactionManagementError
from django.db.utils import DatabaseError
from django.test.utils import isolate_apps

from django_redlock import locks
from django_redlock.exceptions import LockLost, StaleTokenError
from django_redlock.fencing import MAX_TOKEN, FencedQuerySet
from django_redlock.models import FencedModel
from testproject.inventory.models import Order, Product
from tests.support.fencing import fence_oracle, is_postgres

pytestmark = pytest.mark.usefixtures("fence_oracle")
__all__ = ["fence_oracle"]


class StrictProduct(Product):
    """Test-only proxy: every write needs a token."""

    fence_required = True

    class Meta:
        proxy = True
        app_label = "inventory"


class DefaultAliasProduct(Product):
    """Test-only proxy: fenced by leases of the ``default`` alias only."""

    fence_alias = "default"

    class Meta:
        proxy = True
        app_label = "inventory"


def two_tokens(name: str) -> tuple[int, int]:
    """Tokens of two real leases taken one after the other: (older, newer)."""
    tokens = []
    for _ in range(2):
        lease = locks["default"].acquire(name, ttl=5, timeout=2)
        tokens.append(lease.token)
        lease.release()
    return tokens[0], tokens[1]


@contextmanager
def rejected(match: str | None = None) -> Iterator[Any]:
    """Expect a ``StaleTokenError`` from a write run in its own ``atomic()`` block.

    A rejection found by the database marks the enclosing atomic block for rollback (like an
    IntegrityError), and every test runs inside one; the savepoint keeps the test usable.
    """
    with pytest.raises(StaleTokenError, match=match) as caught, transaction.atomic():
        yield caught


def row(pk: int) -> dict[str, Any]:
    rows = Product.objects.filter(pk=pk).values("name", "stock", "fence_token")
    return dict(rows.get())


@pytest.fixture
def product(db: None) -> Product:
    return Product.objects.create(name="widget", stock=10)


# -- the zombie: an expired lease writes after a newer one did ---------------------------------


def test_zombie_save_is_rejected_and_row_keeps_newer_values(product: Product, unique_name: str):
    with pytest.raises(LockLost), locks["default"].lock(unique_name, ttl=0.3) as lease_a:
        zombie = Product.objects.get(pk=product.pk)
        time.sleep(0.45)  # A pauses past its TTL
        lease_b = locks["default"].acquire(unique_name, ttl=5, timeout=2)
        assert lease_b.token > lease_a.token
        fresh = Product.objects.get(pk=product.pk)
        fresh.stock = 7
        fresh.save(fence_token=lease_b.token)
        lease_b.release()
        zombie.stock = 999
        with rejected() as caught:
            zombie.save()  # A's token from the context: the innermost lease is still A's
    err = caught.value
    assert (err.model, err.pk, err.token, err.row_token) == (
        Product,
        product.pk,
        lease_a.token,
        lease_b.token,
    )
    assert "newer lease" in str(err) and "Re-acquire the lock" in str(err)
    assert row(product.pk) == {"name": "widget", "stock": 7, "fence_token": lease_b.token}
    assert zombie.fence_token == 0  # the instance is left as it was


def test_zombie_fenced_update_and_delete_are_rejected(product: Product, unique_name: str):
    old, new = two_tokens(unique_name)
    zombie = Product.objects.get(pk=product.pk)
    assert Product.objects.fenced(new).filter(pk=product.pk).update(stock=F("stock") - 1) == 1
    assert Product.objects.fenced(old).filter(pk=product.pk).update(stock=0) == 0
    assert row(product.pk) == {"name": "widget", "stock": 9, "fence_token": new}
    with rejected() as caught:
        zombie.delete(fence_token=old)
    assert caught.value.row_token == new and "newer lease" in str(caught.value)
    assert Product.objects.fenced(old).filter(pk=product.pk).delete()[0] == 0
    assert Product.objects.filter(pk=product.pk).exists()
    assert Product.objects.fenced(new).filter(pk=product.pk).delete()[0] == 1


def test_row_written_under_t_rejects_older_tokens_forever(product: Product, unique_name: str):
    old, new = two_tokens(unique_name)
    product.save(fence_token=new)
    for _ in range(3):
        stale = Product.objects.get(pk=product.pk)
        stale.stock = 1
        with rejected():
            stale.save(fence_token=old)
    assert row(product.pk)["stock"] == 10


# -- the read-then-write race ----------------------------------------------------------------


def test_read_then_write_race_rejects_the_newer_lease_write(product: Product, unique_name: str):
    old, new = two_tokens(unique_name)
    b_view = Product.objects.get(pk=product.pk)  # B reads under its (newer) lease
    a_view = Product.objects.get(pk=product.pk)
    a_view.stock -= 1
    a_view.save(fence_token=old)  # A (stale) slips in: fence_token <= old holds, L matches
    b_view.stock -= 1
    with rejected() as caught:
        b_view.save(fence_token=new)  # a `fence_token <= T` guard alone would let this through
    err = caught.value
    assert (err.token, err.row_token) == (new, old)
    assert "changed since it was read" in str(err)
    assert row(product.pk)["stock"] == 9  # A's write stands; B's lost-update was refused
    b_view.refresh_from_db()  # B re-reads and redoes the change: no sale is lost
    b_view.stock -= 1
    b_view.save(fence_token=new)
    assert row(product.pk) == {"name": "widget", "stock": 8, "fence_token": new}


def test_claim_makes_the_stale_write_the_rejected_one(product: Product, unique_name: str):
    old, new = two_tokens(unique_name)
    a_view = Product.objects.get(pk=product.pk)
    b_view = Product.objects.claim(pk=product.pk, token=new)
    assert b_view.fence_token == new
    a_view.stock -= 1
    with rejected() as caught:
        a_view.save(fence_token=old)
    assert caught.value.row_token == new
    b_view.stock -= 1
    b_view.save(fence_token=new)
    assert row(product.pk) == {"name": "widget", "stock": 9, "fence_token": new}
    with rejected():
        Product.objects.claim(pk=product.pk, token=old)


def test_claim_uses_the_active_lease_and_needs_a_token(product: Product, unique_name: str):
    with locks["default"].lock(unique_name) as lease:
        claimed = Product.objects.claim(pk=product.pk)
        assert claimed.fence_token == lease.token == row(product.pk)["fence_token"]
        with pytest.raises(Product.DoesNotExist), transaction.atomic():
            Product.objects.claim(pk=product.pk + 1000)
    with pytest.raises(StaleTokenError, match="needs a fencing token"):
        Product.objects.claim(pk=product.pk)


def test_claim_many_stamps_each_row_with_its_names_token(db: None, unique_name: str):
    """Under lock_many, claim_many stamps each row with its own name's token, all or none."""
    products = [Product.objects.create(name=f"p{i}", stock=5) for i in range(3)]
    names = {p.pk: f"{unique_name}:{p.pk}" for p in products}
    with locks["five"].lock_many(list(names.values()), ttl=5) as held:
        tokens = {pk: held.leases[name].token for pk, name in names.items()}
        claimed = Product.objects.claim_many(tokens)
        assert {pk: p.fence_token for pk, p in claimed.items()} == tokens
        assert [row(pk)["fence_token"] for pk in tokens] == list(tokens.values())
        for claimed_row in claimed.values():  # saved under the set's leases (docs/primitives.md)
            claimed_row.stock -= 1
            claimed_row.save()
        assert [row(pk)["stock"] for pk in tokens] == [4, 4, 4]
    tokens = {pk: row(pk)["fence_token"] for pk in tokens}
    newer = {pk: token + 1000 for pk, token in tokens.items()}
    first = products[0].pk
    Product.objects.claim(pk=first, token=newer[first])  # a newer lease wrote row 0
    later = {pk: token + 500 for pk, token in tokens.items()}  # rows 1, 2: fine; row 0: stale
    with pytest.raises(StaleTokenError):  # (no atomic() of the test's around it)
        Product.objects.claim_many(later)  # all or none: rows 1 and 2 are not stamped either
    assert [row(p.pk)["fence_token"] for p in products[1:]] == [tokens[p.pk] for p in products[1:]]
    with pytest.raises(TypeError, match="non-empty mapping"):
        Product.objects.claim_many({})


# -- ordinary use ----------------------------------------------------------------------------


def test_same_lease_saves_twice_and_inserts_store_the_token(db: None, unique_name: str):
    with locks["default"].lock(unique_name) as lease:
        product = Product.objects.create(name="gadget", stock=3)
        assert row(product.pk)["fence_token"] == lease.token
        order = Order.objects.create(product=product)
        assert order.fence_token == lease.token
        product.stock -= 1
        product.save()
        product.stock -= 1
        product.save()
    assert row(product.pk) == {"name": "gadget", "stock": 1, "fence_token": lease.token}


def test_explicit_token_beats_the_context(product: Product, unique_name: str):
    other = locks["default"].acquire(f"{unique_name}:other", ttl=5)
    other.release()
    with locks["default"].lock(unique_name) as lease:
        assert lease.token > other.token
        product.stock = 4
        product.save(fence_token=other.token)
        assert row(product.pk)["fence_token"] == other.token
        with locks["default"].lock(f"{unique_name}:inner") as inner:  # the innermost wins
            product.save()
            assert row(product.pk)["fence_token"] == inner.token


def test_update_fields_are_honoured_and_carry_the_token(product: Product, unique_name: str):
    with locks["default"].lock(unique_name) as lease:
        product.name = "not saved"
        product.stock = 5
        product.save(update_fields=["stock"])
    assert row(product.pk) == {"name": "widget", "stock": 5, "fence_token": lease.token}


def test_empty_update_fields_is_a_no_op(
    product: Product, unique_name: str, django_assert_num_queries
):
    with locks["default"].lock(unique_name), django_assert_num_queries(0):
        product.save(update_fields=[])


def test_plain_update_inside_a_lease_is_guarded(db: None, unique_name: str):
    old, new = two_tokens(unique_name)
    a = Product.objects.create(name="a", stock=1)
    b = Product.objects.create(name="b", stock=1)
    Product.objects.fenced(new).filter(pk=b.pk).update(stock=2)
    with locks["default"].lock(f"{unique_name}:x") as lease:
        assert Product.objects.filter(pk__in=[a.pk, b.pk]).update(stock=F("stock") + 10) == 2
    assert row(a.pk)["fence_token"] == row(b.pk)["fence_token"] == lease.token
    assert Product.objects.fenced(old).update(stock=0) == 0  # every match is stale
    with pytest.raises(TypeError, match="sets fence_token itself"):
        Product.objects.fenced(new).update(fence_token=1)


def test_unguarded_save_is_plain_and_never_lowers_the_token(product: Product, unique_name: str):
    stale = Product.objects.get(pk=product.pk)
    with locks["default"].lock(unique_name) as lease:
        product.save()
    stale.stock = 3
    stale.save()  # no lease: a plain Django save
    assert row(product.pk) == {"name": "widget", "stock": 3, "fence_token": lease.token}
    assert Product.objects.filter(pk=product.pk).update(stock=2) == 1


def test_deleted_row_is_never_reinserted(product: Product, unique_name: str):
    _, new = two_tokens(unique_name)
    loaded = Product.objects.get(pk=product.pk)
    Product.objects.get(pk=product.pk).delete(fence_token=new)
    loaded.stock = 1
    with rejected("no longer exists") as caught:
        loaded.save(fence_token=new)
    assert caught.value.row_token is None
    assert not Product.objects.exists()
    fresh = Product(pk=product.pk, name="again", stock=1)  # a new instance with its own pk
    fresh.save(fence_token=new)
    assert row(product.pk)["fence_token"] == new


def test_refresh_from_db_refreshes_the_loaded_token(product: Product, unique_name: str):
    old, new = two_tokens(unique_name)
    view = Product.objects.get(pk=product.pk)
    Product.objects.get(pk=product.pk).save(fence_token=old)
    view.refresh_from_db(fields=["stock"])  # fence_token not reloaded: still a stale read
    with rejected():
        view.save(fence_token=new)
    view.refresh_from_db(fields=["fence_token"])
    view.save(fence_token=new)
    assert row(product.pk)["fence_token"] == new


def test_only_and_defer_keep_the_token_loaded(product: Product):
    assert "fence_token" in Product.objects.only("stock").get(pk=product.pk).__dict__
    assert "fence_token" in Product.objects.defer("fence_token").get(pk=product.pk).__dict__
    assert "name" not in Product.objects.defer("name").get(pk=product.pk).__dict__


def test_bulk_create_stores_the_token(db: None, unique_name: str):
    with locks["default"].lock(unique_name) as lease:
        Product.objects.bulk_create([Product(name="x", stock=1), Product(name="y", stock=1)])
    assert set(Product.objects.values_list("fence_token", flat=True)) == {lease.token}


# -- fence_required ---------------------------------------------------------------------------


def test_fence_required_refuses_unguarded_writes(
    product: Product, unique_name: str, django_assert_num_queries
):
    strict = StrictProduct.objects.get(pk=product.pk)
    strict.stock = 0
    with django_assert_num_queries(0):
        with pytest.raises(StaleTokenError, match="requires a fencing token"):
            strict.save()
        with pytest.raises(StaleTokenError):
            StrictProduct.objects.filter(pk=product.pk).update(stock=0)
        with pytest.raises(StaleTokenError):
            strict.delete()
        with pytest.raises(StaleTokenError):
            StrictProduct.objects.create(name="new", stock=1)
    assert row(product.pk)["stock"] == 10
    with locks["default"].lock(unique_name) as lease:
        strict.save()
        assert StrictProduct.objects.filter(pk=product.pk).update(stock=F("stock") + 1) == 1
    assert row(product.pk) == {"name": "widget", "stock": 1, "fence_token": lease.token}


# -- token validation -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("token", "error"),
    [
        (True, TypeError),
        (1.0, TypeError),
        ("3", TypeError),
        (-1, ValueError),
        (MAX_TOKEN, ValueError),
    ],
)
def test_bad_tokens_are_refused_before_any_sql(
    product: Product, token: Any, error: type[Exception], django_assert_num_queries
):
    with django_assert_num_queries(0):
        with pytest.raises(error):
            product.save(fence_token=token)
        with pytest.raises(error):
            Product.objects.fenced(token)
        with pytest.raises(error):
            Product.objects.claim(pk=product.pk, token=token)
        with pytest.raises(error):
            product.delete(fence_token=token)
    product.save(fence_token=MAX_TOKEN - 1)
    assert row(product.pk)["fence_token"] == MAX_TOKEN - 1


def test_check_constraint_refuses_negative_tokens(db: None):
    table = Product._meta.db_table
    with pytest.raises(IntegrityError), transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(  # a raw insert: the model refuses -1 before any SQL
            f"INSERT INTO {table} (name, stock, fence_token) VALUES (%s, %s, %s)", ["x", 1, -1]
        )


@isolate_apps("testproject.inventory")
def test_model_check_warns_when_meta_drops_the_constraint():
    class Loose(FencedModel):
        class Meta:
            app_label = "inventory"

    class Kept(FencedModel):
        class Meta(FencedModel.Meta):
            app_label = "inventory"

    assert [m.id for m in Loose.check()] == ["django_redlock.W101"]
    assert [m for m in Kept.check() if m.level >= checks.WARNING] == []
    assert [c.name for c in Kept._meta.constraints] == ["inventory_kept_fence_token_gte_0"]


# -- transactions -----------------------------------------------------------------------------


def _stale_pair(product: Product, name: str) -> tuple[Product, int]:
    old, new = two_tokens(name)
    stale = Product.objects.get(pk=product.pk)
    Product.objects.get(pk=product.pk).save(fence_token=new)
    return stale, old


def test_rejected_save_rolls_back_the_whole_atomic_block(product: Product, unique_name: str):
    stale, old = _stale_pair(product, unique_name)
    with pytest.raises(StaleTokenError), transaction.atomic():
        Order.objects.create(product=product)
        stale.save(fence_token=old)
    assert not Order.objects.exists()


def test_rejected_save_in_a_nested_atomic_lets_the_outer_block_go_on(
    product: Product, unique_name: str
):
    stale, old = _stale_pair(product, unique_name)
    with transaction.atomic():
        Order.objects.create(product=product)
        with pytest.raises(StaleTokenError), transaction.atomic():
            stale.save(fence_token=old)
        with pytest.raises(StaleTokenError), transaction.atomic():
            stale.delete(fence_token=old)
        Order.objects.create(product=product)
    assert Order.objects.count() == 2


def test_rejected_save_caught_without_savepoint_marks_block_for_rollback(
    product: Product, unique_name: str
):
    stale, old = _stale_pair(product, unique_name)
    with transaction.atomic():
        with pytest.raises(StaleTokenError):
            stale.save(fence_token=old)
        with pytest.raises(TransactionManagementError):
            Order.objects.count()


def test_errors_before_sql_leave_the_transaction_usable(product: Product):
    with transaction.atomic():
        with pytest.raises(ValueError):
            product.save(fence_token=-5)
        with pytest.raises(StaleTokenError):
            Product.objects.claim(pk=product.pk)
        Order.objects.create(product=product)
    assert Order.objects.count() == 1


def test_select_for_update_inside_atomic_and_lease(product: Product, unique_name: str):
    with locks["default"].lock(unique_name) as lease, transaction.atomic():
        locked = Product.objects.select_for_update().get(pk=product.pk)
        locked.stock -= 1
        locked.save()
    assert row(product.pk) == {"name": "widget", "stock": 9, "fence_token": lease.token}


# -- async -------------------------------------------------------------------------------------


def test_async_path_uses_each_tasks_own_lease(db: None, unique_name: str):
    import asyncio

    first = Product.objects.create(name="first", stock=5)
    second = Product.objects.create(name="second", stock=5)

    async def buy(pk: int, name: str, entered: asyncio.Event, other: asyncio.Event) -> int:
        async with locks["default"].alock(name, ttl=5) as lease:
            entered.set()
            await other.wait()  # both leases active at once, in two tasks
            claimed = await Product.objects.aclaim(pk)
            claimed.stock -= 1
            await claimed.asave()
            await Product.objects.filter(pk=pk).aupdate(stock=F("stock") - 1)
            return lease.token

    async def scenario() -> tuple[int, int]:
        one, two = asyncio.Event(), asyncio.Event()
        return await asyncio.gather(
            buy(first.pk, f"{unique_name}:1", one, two),
            buy(second.pk, f"{unique_name}:2", two, one),
        )

    token_one, token_two = async_to_sync(scenario)()
    assert token_one != token_two
    assert row(first.pk) == {"name": "first", "stock": 3, "fence_token": token_one}
    assert row(second.pk) == {"name": "second", "stock": 3, "fence_token": token_two}


def test_async_stale_save_and_delete_are_rejected(product: Product, unique_name: str):
    old, new = two_tokens(unique_name)

    async def load() -> Product:
        stale = await Product.objects.aget(pk=product.pk)
        await Product.objects.fenced(new).filter(pk=product.pk).aupdate(stock=1)
        return stale

    async def save(stale: Product) -> None:
        await stale.asave(fence_token=old)

    async def delete(stale: Product) -> None:
        await stale.adelete(fence_token=old)

    stale = async_to_sync(load)()
    with rejected():
        async_to_sync(save)(stale)
    with rejected():
        async_to_sync(delete)(stale)
    assert row(product.pk) == {"name": "widget", "stock": 1, "fence_token": new}


# -- upserts -----------------------------------------------------------------------------------

UPSERT: dict[str, Any] = {
    "update_conflicts": True,
    "unique_fields": ["id"],
    "update_fields": ["stock", "fence_token"],
}


def test_upsert_under_a_token_is_refused_before_any_sql(
    product: Product, unique_name: str, django_assert_num_queries
):
    old, new = two_tokens(unique_name)
    Product.objects.fenced(new).filter(pk=product.pk).update(stock=7)
    zombie = [Product(pk=product.pk, name="zombie", stock=1)]
    with django_assert_num_queries(0):
        with pytest.raises(ValueError, match=r"update_conflicts=True.*claim\(\)"):
            Product.objects.fenced(old).bulk_create(zombie, **UPSERT)
        with locks["default"].lock(unique_name), pytest.raises(ValueError, match="fenced"):
            Product.objects.bulk_create(zombie, **UPSERT)  # the active lease's token
        with pytest.raises(StaleTokenError, match="requires a fencing token"):
            StrictProduct.objects.bulk_create(zombie, **UPSERT)
    assert row(product.pk) == {"name": "widget", "stock": 7, "fence_token": new}
    fresh = Product(name="fresh", stock=2)  # ignore_conflicts never updates a row: allowed
    Product.objects.fenced(old).bulk_create([*zombie, fresh], ignore_conflicts=True)
    assert row(product.pk) == {"name": "widget", "stock": 7, "fence_token": new}
    assert Product.objects.get(name="fresh").fence_token == old


def test_unguarded_upsert_never_writes_the_token(product: Product, unique_name: str):
    _, new = two_tokens(unique_name)
    Product.objects.fenced(new).filter(pk=product.pk).update(stock=7)
    Product.objects.bulk_create([Product(pk=product.pk, name="x", stock=3)], **UPSERT)
    assert row(product.pk) == {"name": "widget", "stock": 3, "fence_token": new}
    with pytest.raises(ValueError, match="never writes fence_token"):
        Product.objects.bulk_create(
            [Product(pk=product.pk, name="x", stock=3)],
            **{**UPSERT, "update_fields": ["fence_token"]},
        )


# -- the base manager ---------------------------------------------------------------------------


def test_base_manager_writes_are_fenced(
    product: Product, unique_name: str, django_assert_num_queries
):
    assert issubclass(Product._base_manager._queryset_class, FencedQuerySet)
    assert Product._base_manager is not Product._default_manager  # never a filtering manager
    with django_assert_num_queries(0), pytest.raises(StaleTokenError, match="requires a fencing"):
        StrictProduct._base_manager.filter(pk=product.pk).update(stock=0)
    order = Order.objects.create(product=product)
    other = Product.objects.create(name="other", stock=1)
    with locks["default"].lock(unique_name):  # older than `newer`, whose token the rows hold
        newer = locks["default"].acquire(f"{unique_name}:newer", ttl=5)
        newer.release()
        Product.objects.fenced(newer.token).filter(pk=product.pk).update(stock=7)
        Order.objects.fenced(newer.token).filter(pk=order.pk).update(quantity=2)
        assert Product._base_manager.filter(pk=product.pk).update(stock=0) == 0
        other.orders.add(order)  # Django moves it with Order._base_manager...update()
    order.refresh_from_db()
    assert (order.product_id, order.fence_token) == (product.pk, newer.token)
    with locks["default"].lock(unique_name) as lease:
        assert Product._base_manager.filter(pk=product.pk).update(stock=6) == 1
    assert row(product.pk) == {"name": "widget", "stock": 6, "fence_token": lease.token}


# -- no-op saves ---------------------------------------------------------------------------------


def test_empty_update_fields_leaves_the_loaded_token_alone(product: Product, unique_name: str):
    with locks["default"].lock(unique_name) as lease:
        loaded = Product.objects.get(pk=product.pk)
        loaded.save(update_fields=[])  # "nothing changed": nothing is written
        assert loaded.fence_token == 0
        loaded.stock = 9
        loaded.save(update_fields=["stock"])  # nobody else wrote: must not be rejected
    assert row(product.pk) == {"name": "widget", "stock": 9, "fence_token": lease.token}


# -- nested leases and aliases -------------------------------------------------------------------


def test_nested_lease_write_rejects_the_outer_lease_and_says_why(
    product: Product, unique_name: str
):
    with locks["default"].lock(unique_name) as outer:
        claimed = Product.objects.claim(pk=product.pk)
        with locks["default"].lock(f"{unique_name}:audit") as inner:  # a helper's own lock
            Product.objects.filter(pk=product.pk).update(stock=9)
        claimed.refresh_from_db()
        claimed.stock = 8
        with rejected() as caught:
            claimed.save()
    assert (caught.value.token, caught.value.row_token) == (outer.token, inner.token)
    message = str(caught.value)
    assert "expired or was taken over" not in message
    assert "still holds its lock" in message and "nested" in message, message
    assert "fenced(lease.token)" in message
    assert row(product.pk)["stock"] == 9
    with locks["default"].lock(unique_name) as outer:  # the way out: one lease's token
        claimed = Product.objects.claim(pk=product.pk)
        with locks["default"].lock(f"{unique_name}:audit"):
            Product.objects.fenced(outer.token).filter(pk=product.pk).update(stock=7)
        claimed.refresh_from_db()
        claimed.stock -= 1
        claimed.save()
    assert row(product.pk) == {"name": "widget", "stock": 6, "fence_token": outer.token}


def test_valid_lease_of_another_alias_is_not_called_stale(product: Product, unique_name: str):
    probes = {alias: locks[alias].acquire(unique_name, ttl=5) for alias in ("default", "multi")}
    for probe in probes.values():
        probe.release()
    high, low = sorted(probes, key=lambda alias: probes[alias].token, reverse=True)
    with locks[high].lock(unique_name):  # the alias whose counter is ahead writes the row
        Product.objects.claim(pk=product.pk)
    with locks[low].lock(unique_name) as lease:
        assert lease.token < row(product.pk)["fence_token"]  # per-alias counters: incomparable
        with rejected() as caught:
            Product.objects.claim(pk=product.pk)
    message = str(caught.value)
    assert "expired or was taken over" not in message
    assert f"alias {low!r}" in message and "another alias" in message, message


def test_fence_alias_refuses_leases_of_another_alias_before_any_sql(
    product: Product, unique_name: str, django_assert_num_queries
):
    loaded = DefaultAliasProduct.objects.get(pk=product.pk)
    writes = [
        loaded.save,
        loaded.delete,
        lambda: DefaultAliasProduct.objects.filter(pk=product.pk).update(stock=0),
        lambda: DefaultAliasProduct.objects.claim(pk=product.pk),
        lambda: DefaultAliasProduct.objects.bulk_create([DefaultAliasProduct(name="n")]),
    ]
    with locks["multi"].lock(unique_name) as other, django_assert_num_queries(0):
        for write in writes:
            with pytest.raises(StaleTokenError, match="fenced by alias 'default'") as caught:
                write()
            assert (caught.value.token, caught.value.row_token) == (other.token, None)
    with locks["default"].lock(unique_name) as lease:
        claimed = DefaultAliasProduct.objects.claim(pk=product.pk)
        claimed.stock = 4
        claimed.save()
    assert row(product.pk) == {"name": "widget", "stock": 4, "fence_token": lease.token}


# -- multi-table inheritance ---------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_multi_table_child_passes_checks_and_is_fenced(unique_name: str):
    with isolate_apps("testproject.inventory") as registry:

        class Item(FencedModel):  # the recipe of docs/fencedmodel.md
            __module__ = Product.__module__
            stock = models.IntegerField(default=0)

            class Meta(FencedModel.Meta):
                pass

        class Special(Item):  # a multi-table child without a Meta of its own
            __module__ = Product.__module__
            extra = models.IntegerField(default=0)

        app = registry.get_app_config("inventory")
        found = checks.run_checks([app], tags=[checks.Tags.models], databases=["default"])
        assert [(m.id, str(m.obj)) for m in found if m.level >= checks.WARNING] == []
        assert [c.name for c in Item._meta.constraints] == ["inventory_item_fence_token_gte_0"]
        assert Special._meta.constraints == []
        with connection.schema_editor() as editor:
            editor.create_model(Item)
            editor.create_model(Special)
        try:
            with locks["default"].lock(unique_name) as first:
                special = Special.objects.create(stock=3, extra=1)
            with locks["default"].lock(unique_name) as second:
                fresh = Special.objects.claim(pk=special.pk)
                fresh.extra = 2
                fresh.save()
            special.stock = 0
            with rejected("newer lease"):
                special.save(fence_token=first.token)
            stored = Special.objects.values_list("stock", "extra", "fence_token").get()
            assert stored == (3, 2, second.token)
        finally:
            with connection.schema_editor() as editor:
                editor.delete_model(Special)
                editor.delete_model(Item)


# -- tokens stored by unguarded inserts ----------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "error"),
    [(2**60, ValueError), (MAX_TOKEN, ValueError), (-1, ValueError), ("5", TypeError)],
)
def test_unguarded_writes_refuse_bad_tokens_before_any_sql(
    db: None, value: Any, error: type[Exception], django_assert_num_queries
):
    with django_assert_num_queries(0):
        with pytest.raises(error):
            Product.objects.create(name="x", stock=1, fence_token=value)
        with pytest.raises(error):
            Product(pk=10**6, name="x", stock=1, fence_token=value).save()
        with pytest.raises(error):
            Product.objects.bulk_create([Product(name="x", stock=1, fence_token=value)])
        with pytest.raises(error):
            Product.objects.filter(name="x").update(fence_token=value)
    assert not Product.objects.exists()
    copied = Product.objects.create(name="copied", stock=1, fence_token=41)  # in range: kept
    assert row(copied.pk)["fence_token"] == 41


# -- the PostgreSQL oracle ----------------------------------------------------------------------


def test_oracle_trigger_is_live(product: Product, unique_name: str, fence_oracle: bool):
    if not is_postgres():
        pytest.skip("the trigger oracle is PostgreSQL-only")
    assert fence_oracle
    product.save(fence_token=two_tokens(unique_name)[1])
    with pytest.raises(DatabaseError, match="fence oracle"), transaction.atomic():
        Product.objects.filter(pk=product.pk).update(fence_token=F("fence_token") - 1)


def test_field_is_a_bigint_with_default_zero():
    field = Product._meta.get_field("fence_token")
    assert isinstance(field, models.BigIntegerField)
    assert field.default == 0 and not field.editable


def test_demo_models_are_in_the_admin():
    from django.contrib import admin

    assert {Product, Order} <= set(admin.site._registry)
    assert "fence_token" in admin.site._registry[Product].get_readonly_fields(None)  # type: ignore[arg-type]
