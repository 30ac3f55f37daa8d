"""One sale of one unit: the code path the demo's worker processes run.

``buy(pk, use_lock=True)`` is the right way: the lock ``product:<pk>`` serialises the buyers and
``claim()`` stamps the row with the lease's fencing token, so a buyer whose lease ran out cannot
write it any more. ``buy(pk, use_lock=False)`` is the classic bug: read the stock, do some work,
write it back, with nothing stopping two buyers from selling the same last unit.
"""

from __future__ import annotations

import time

from django.db import transaction

from django_redlock import locks

from .models import Order, Product

ALIAS = "default"
LOCK_TTL = 5.0  # far longer than one sale takes
LOCK_TIMEOUT = 2.0  # a shopper waits this long for the lock before being turned away as busy
RACE_WINDOW = 0.005  # the app's work between reading and writing the stock (payment, ...)


def lock_name(product_id: int) -> str:
    """The lock every writer of product ``product_id`` takes."""
    return f"product:{product_id}"


def buy(
    product_id: int,
    *,
    use_lock: bool,
    lock_timeout: float = LOCK_TIMEOUT,
    race_window: float = RACE_WINDOW,
    waits: list[float] | None = None,
) -> bool:
    """Sell one unit of ``product_id``: True if sold, False if it was out of stock.

    With ``use_lock`` a sold-out product is turned away without the lock (a cheap read that
    decides nothing else); otherwise the sale runs under the lock and a fenced ``claim()``,
    which re-checks the stock. It raises ``LockNotAcquired`` if the lock stays busy for
    ``lock_timeout`` seconds (0: one attempt) and appends the seconds spent acquiring it to
    ``waits`` when given. Without ``use_lock`` it is a plain read-check-write that sleeps
    ``race_window`` seconds between the read and the write.
    """
    if not use_lock:
        product = Product.objects.get(pk=product_id)
        if product.stock < 1:
            return False
        time.sleep(race_window)
        product.stock -= 1
        product.save()  # unguarded: writes back what it read minus one
        Order.objects.create(product=product, quantity=1)
        return True
    if not Product.objects.filter(pk=product_id, stock__gt=0).exists():
        return False  # sold out: no need to queue for the lock (the real check is below)
    started = time.monotonic()
    with locks[ALIAS].lock(lock_name(product_id), ttl=LOCK_TTL, timeout=lock_timeout):
        if waits is not None:
            waits.append(time.monotonic() - started)
        with transaction.atomic():
            product = Product.objects.claim(pk=product_id)  # stamped with the lease's token
            if product.stock < 1:
                return False
            product.stock -= 1
            product.save()  # guarded: rejected if a newer lease wrote the row since the claim
            Order.objects.create(product=product, quantity=1)
            return True


def buy_cart(
    product_ids: list[int],
    *,
    use_lock: bool,
    lock_timeout: float = LOCK_TIMEOUT,
    race_window: float = RACE_WINDOW,
) -> bool:
    """Sell one unit of every product of a cart, all or nothing: True if sold, False if one
    of them was out of stock (then nothing is sold).

    With ``use_lock`` the cart's products are locked together (``lock_many``: all or none,
    whatever order the cart lists them in, so two carts never deadlock) and their rows are
    claimed with each product's own token (``claim_many``). Without it: read every product,
    check, work ``race_window`` seconds, write every product back.
    """
    if not use_lock:
        products = [Product.objects.get(pk=pk) for pk in product_ids]
        if any(product.stock < 1 for product in products):
            return False
        time.sleep(race_window)
        for product in products:
            product.stock -= 1
            product.save()
            Order.objects.create(product=product, quantity=1)
        return True
    names = {pk: lock_name(pk) for pk in product_ids}
    cart_lock = locks[ALIAS].lock_many(list(names.values()), ttl=LOCK_TTL, timeout=lock_timeout)
    with cart_lock as held, transaction.atomic():
        tokens = {pk: held.leases[name].token for pk, name in names.items()}
        products = Product.objects.claim_many(tokens)
        if any(product.stock < 1 for product in products.values()):
            return False
        for product in products.values():
            product.stock -= 1
            product.save()  # guarded: rejected if a newer lease wrote the row since
            Order.objects.create(product=product, quantity=1)
        return True
