"""``manage.py checkout``: carts of several products bought at once, with and without locks.

``--products`` products get ``--stock`` items each; ``--workers`` processes buy random carts of
2-3 of them, listed in random order, ``--carts`` times in all. With the lock each cart is one
``lock_many`` of its products (all or nothing, no deadlock whatever the order) and one
``claim_many`` of their rows: exactly the stock is sold and no cart is half-sold. With
``--no-lock`` the carts read, check and write back, and the products are oversold.
"""

from __future__ import annotations

import json
import random
from argparse import ArgumentParser
from typing import Any

from django.core.management.base import BaseCommand, CommandError

from testproject.inventory.demo_run import SPAWN, WorkerProcesses, emit_result, recreate_product
from testproject.inventory.management.commands.oversell import START_TIMEOUT

PRODUCT_PREFIX = "Checkout demo product"


def cart_worker(
    product_ids: list[int], use_lock: bool, remaining: Any, start: Any, seed: int, out: Any
) -> None:
    """A worker process: wait for the others, buy random carts until the shared budget is
    spent; report the counts."""
    from django_redlock.exceptions import LockNotAcquired
    from testproject.inventory.management.commands.oversell import take_attempt
    from testproject.inventory.purchase import buy_cart

    rng = random.Random(seed)
    start.wait(START_TIMEOUT)  # every worker set up: the carts race from the first one
    counts = {"sold": 0, "items": 0, "refused": 0, "busy": 0, "errors": 0}
    while take_attempt(remaining):
        cart = rng.sample(product_ids, rng.randint(2, min(3, len(product_ids))))
        try:
            sold = buy_cart(cart, use_lock=use_lock)
            counts["sold" if sold else "refused"] += 1
            counts["items"] += len(cart) if sold else 0
        except LockNotAcquired:
            counts["busy"] += 1
        except Exception:  # counted: the summary shows it
            counts["errors"] += 1
    out.put(counts)


class Command(BaseCommand):
    help = "Workers buy random multi-product carts, with lock_many (exact) or --no-lock."

    def add_arguments(self, parser: ArgumentParser) -> None:
        parser.add_argument("--no-lock", action="store_true", help="Read-check-write carts.")
        parser.add_argument("--workers", type=int, default=5, help="Worker processes (5).")
        parser.add_argument("--carts", type=int, default=300, help="Cart attempts (300).")
        parser.add_argument("--products", type=int, default=4, help="Products (4).")
        parser.add_argument("--stock", type=int, default=10, help="Items of each (10).")
        parser.add_argument("--json", nargs="?", const="-", metavar="PATH", help="Also as JSON.")

    def handle(self, *args: Any, **options: Any) -> None:
        from testproject.inventory.models import Order, Product

        workers, carts, stock = options["workers"], options["carts"], options["stock"]
        if workers < 1 or carts < 0 or stock < 0 or options["products"] < 2:
            raise CommandError("--workers >= 1, --products >= 2, --carts and --stock >= 0.")
        use_lock = not options["no_lock"]
        products = [
            recreate_product(f"{PRODUCT_PREFIX} {i}", stock) for i in range(options["products"])
        ]
        ids = [int(product.pk) for product in products]
        remaining, out = SPAWN.Value("i", carts), SPAWN.Queue()
        start = SPAWN.Barrier(workers + 1)
        run = WorkerProcesses()
        for seed in range(workers):
            run.add(cart_worker, ids, use_lock, remaining, start, seed, out)
        try:
            run.start()
            start.wait(START_TIMEOUT)
            reports = [out.get(timeout=300) for _ in range(workers)]
        finally:
            run.stop(grace=5)
        counts = {key: sum(r[key] for r in reports) for key in reports[0]}
        final = {p.pk: p.stock for p in Product.objects.filter(pk__in=ids)}
        orders = {pk: Order.objects.filter(product_id=pk).count() for pk in ids}
        result = {
            "lock": use_lock,
            "carts": carts,
            **counts,
            "stock_each": stock,
            "sold_each": [orders[pk] for pk in ids],
            "final_stock": [final[pk] for pk in ids],
            "oversold": sum(max(0, orders[pk] - stock) for pk in ids),
            # every order belongs to a whole cart: no cart was half sold
            "whole_carts": sum(orders.values()) == counts["items"],
        }
        label = "with lock_many" if use_lock else "WITHOUT the lock (--no-lock)"
        line = (
            f"checkout {label}: {counts['sold']} carts sold, {counts['refused']} refused "
            f"(an item sold out), {counts['busy']} busy, {counts['errors']} errors; per product "
            f"sold {result['sold_each']} of {stock}, final stock {result['final_stock']}, "
            f"oversold by {result['oversold']} in all"
        )
        emit_result(self, line, result, options["json"])
        if use_lock and (result["oversold"] or counts["errors"] or not result["whole_carts"]):
            raise CommandError("invariant failed with the lock: " + json.dumps(result))
