"""``manage.py zombie``: a lock holder frozen past its lease, and the fence that stops it.

Two real worker processes ("spawn"), A and B, talk to this process over pipes; this process
orchestrates them and prints the timeline as their messages arrive.

``--variant zombie`` (Kleppmann's story): A takes ``product:<id>`` (with auto-extend, like a
careful holder), claims the row and waits for a slow payment reply. This process freezes A with
SIGSTOP: every thread stops, renewal too, so A's lease runs out. B takes the lock (a higher
token) and restocks the product. A is resumed with SIGCONT, gets its reply and writes its sale:
the database rejects it (``StaleTokenError``), because the row carries B's newer token.

``--variant race``: the same freeze, but A and B both read the row with a plain ``get()``
instead of ``claim()``. A's late write now gets through (no newer token is on the row yet), and
B's write, built on what it read before A wrote, is the one rejected: the guard also demands
that the row still has the token B read (``fence_token = L``). A bare ``fence_token <= T``
check would have let B overwrite A's sale. B re-reads and redoes its sale: nothing is lost.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from argparse import ArgumentParser
from multiprocessing.connection import Connection, wait
from typing import Any

from django.core.management.base import BaseCommand, CommandError

from testproject.inventory.demo_run import (
    CAN_FREEZE,
    SPAWN,
    WorkerProcesses,
    console_for,
    recreate_product,
)

PRODUCT_NAME = "Zombie demo"
INITIAL_STOCK = 10
RESTOCK = 50  # what B writes in the zombie variant
B_TTL = 10.0
STEP_TIMEOUT = 60.0  # seconds any one step may take before the demo gives up


class Events:
    """A worker's end of its pipe: timeline events, also from other threads and the log."""

    def __init__(self, conn: Connection, who: str) -> None:
        self.conn, self.who = conn, who
        self.token: int | None = None
        self._lock = threading.Lock()

    def __call__(self, text: str, **data: Any) -> None:
        """Send one event: (monotonic time, who, token, text, data)."""
        with self._lock:
            self.conn.send((time.monotonic(), self.who, self.token, text, data))

    def forward_logs(self) -> None:
        """Send ``django_redlock`` warnings (e.g. the renewal thread's) as events too."""
        events = self

        class Forward(logging.Handler):
            def emit(self, record: logging.LogRecord) -> None:
                events(f"[{record.threadName}] {record.getMessage()}")

        logger = logging.getLogger("django_redlock")
        logger.addHandler(Forward(logging.WARNING))
        logger.propagate = False


def worker_a(conn: Connection, product_id: int, lock_name: str, ttl: float, variant: str) -> None:
    """Process A: lock, read the row, wait for the "payment reply", then write a sale."""
    from django.db import transaction

    from django_redlock import locks
    from django_redlock.exceptions import LockLost, StaleTokenError
    from testproject.inventory.models import Order, Product

    event = Events(conn, "A")
    event.forward_logs()
    try:
        # Auto-extend keeps the lease alive while A is merely slow; a frozen process cannot.
        with locks["default"].lock(lock_name, ttl=ttl, timeout=5, auto_extend=CAN_FREEZE) as lease:
            event.token = lease.token
            event(f"acquired {lock_name} (ttl {ttl:g} s, auto-extend)")
            if variant == "zombie":
                product = Product.objects.claim(pk=product_id)
                how = "claimed the row (stamped it with its token) and read"
            else:
                product = Product.objects.get(pk=product_id)
                how = "read the row with a plain get()"
            event(
                f"{how} stock={product.stock} (row token L={product.fence_token}); "
                "calls the payment provider and waits for its reply",
                waiting=True,
            )
            conn.recv()  # the reply; while A waits here, the orchestrator freezes the process
            event(f"resumed: got the reply, writes stock={product.stock - 1}")
            product.stock -= 1
            try:
                with transaction.atomic():
                    product.save()
                    Order.objects.create(product=product, quantity=1)
            except StaleTokenError as exc:
                event(
                    f"write REJECTED by the database: StaleTokenError (row token "
                    f"{exc.row_token}); its sale and order were rolled back",
                    write="rejected",
                    row_token=exc.row_token,
                )
            else:
                event("write ACCEPTED (sale and order saved)", write="saved")
    except LockLost:
        event("leaving the lock block raised LockLost: the lease was gone")
    finally:
        event("exits", done=True)


def worker_b(conn: Connection, product_id: int, lock_name: str, variant: str) -> None:
    """Process B: wait for the lock, then restock (zombie) or sell one unit (race)."""
    from django.db import transaction

    from django_redlock import locks
    from django_redlock.exceptions import StaleTokenError
    from testproject.inventory.models import Order, Product

    event = Events(conn, "B")
    event("waits for the lock")
    with locks["default"].lock(lock_name, ttl=B_TTL, timeout=STEP_TIMEOUT) as lease:
        token = event.token = lease.token
        event(f"acquired {lock_name}: A's lease had expired")
        if variant == "zombie":
            product = Product.objects.claim(pk=product_id)
            product.stock = RESTOCK
            product.save()
            event(f"claimed the row and restocked it: stock={RESTOCK}")
        else:
            product = Product.objects.get(pk=product_id)
            loaded = product.fence_token
            event(
                f"read the row with a plain get(): stock={product.stock} "
                f"(L={product.fence_token}); prepares its sale",
                waiting=True,
            )
            conn.recv()  # go on once A has written
            product.stock -= 1
            try:
                with transaction.atomic():
                    product.save()
                    Order.objects.create(product=product, quantity=1)
                event("write ACCEPTED", first_write="saved")
            except StaleTokenError as exc:
                bare = Product.objects.filter(pk=product_id, fence_token__lte=token).exists()
                event(
                    f"write of stock={product.stock} REJECTED: the row changed since B read it "
                    f"(row token {exc.row_token} != L={loaded}). A bare "
                    f"'fence_token <= {token}' guard would have "
                    + ("ACCEPTED it and lost A's sale" if bare else "rejected it too"),
                    first_write="rejected",
                    bare_guard_would_accept=bare,
                )
                product.refresh_from_db()
                product.stock -= 1
                with transaction.atomic():
                    product.save()
                    Order.objects.create(product=product, quantity=1)
                event(f"re-read and redid its sale: stock={product.stock}, saved")
    event("released the lock and exits", done=True)


class Command(BaseCommand):
    help = (
        "Freeze a lock holder (SIGSTOP) past its TTL, let another process take over, resume "
        "it, and watch the database reject the late write (the fencing token)."
    )

    def add_arguments(self, parser: ArgumentParser) -> None:
        parser.add_argument(
            "--ttl", type=float, default=1.0, help="Lease of worker A, seconds (1.0)."
        )
        parser.add_argument(
            "--variant",
            choices=("zombie", "race"),
            default="zombie",
            help="zombie: A's late write is rejected. race: the read-then-write race.",
        )
        parser.add_argument(
            "--json", action="store_true", help="End with the outcome as one JSON line."
        )

    def handle(self, *args: Any, **options: Any) -> None:
        from testproject.inventory.models import Order, Product
        from testproject.inventory.purchase import lock_name

        ttl, variant = options["ttl"], options["variant"]
        if not 0 < ttl <= 30:
            raise CommandError("--ttl must be in (0, 30] seconds.")
        self.console = console_for(self)
        product = recreate_product(PRODUCT_NAME, INITIAL_STOCK)
        name = lock_name(product.pk)
        self.console.print(
            f"[bold]zombie --variant {variant}[/]: product {product.pk}, stock={INITIAL_STOCK}, "
            f"lock {name}; A's lease is {ttl:g} s"
        )
        self.console.print(f"{'elapsed':>9}  {'who':<6} {'token':>16}  event")
        self.began = time.monotonic()
        self.outcome: dict[str, Any] = {"variant": variant, "ttl": ttl}
        a_conn, a_child = SPAWN.Pipe()
        b_conn, b_child = SPAWN.Pipe()
        processes = WorkerProcesses()
        a = processes.add(worker_a, a_child, product.pk, name, ttl, variant)
        b = processes.add(worker_b, b_child, product.pk, name, variant)
        try:
            processes.start(a)
            self.until(a_conn, "waiting")
            if processes.freeze(a):
                self.line(
                    "demo", None, "SIGSTOP A: the whole process freezes, its renewal thread too"
                )
            processes.start(b)
            if variant == "zombie":
                self.until(b_conn, "done")
            else:
                self.until(b_conn, "waiting")
            if processes.thaw(a):
                self.line("demo", None, "SIGCONT A: it carries on, unaware it was frozen")
            a_conn.send("payment ok")
            self.until(a_conn, "done")
            if variant == "race":
                b_conn.send("go")
                self.until(b_conn, "done")
        finally:
            processes.stop(grace=10)
        final = Product.objects.get(pk=product.pk)
        orders = Order.objects.filter(product=final).count()
        self.outcome.update(final_stock=final.stock, final_token=final.fence_token, orders=orders)
        self.report(final.pk, final.stock, final.fence_token, orders)
        if options["json"]:
            self.stdout.write(json.dumps(self.outcome))
        if not self.outcome["ok"]:
            raise CommandError("the fence did not behave as the story says; see the timeline")

    def line(self, who: str, token: int | None, text: str, at: float | None = None) -> None:
        """Print one timeline line (``at``: a monotonic time, default now)."""
        from rich.text import Text

        elapsed = ((time.monotonic() if at is None else at) - self.began) * 1000
        style = {"A": "magenta", "B": "cyan"}.get(who, "dim")
        row = Text(f"{elapsed:>6.0f} ms  ")
        row.append(f"{who:<6}", style=style)
        row.append(f" {'' if token is None else token:>16}  {text}")
        self.console.print(row, soft_wrap=True)

    def until(self, conn: Connection, flag: str) -> None:
        """Print ``conn``'s events until one carries ``flag``; fail after STEP_TIMEOUT."""
        deadline = time.monotonic() + STEP_TIMEOUT
        while True:
            if not wait([conn], timeout=max(0.0, deadline - time.monotonic())):
                raise CommandError(f"no event from a worker within {STEP_TIMEOUT:g} s")
            try:
                at, who, token, text, data = conn.recv()
            except EOFError:
                raise CommandError("a worker exited early; see its traceback above") from None
            self.line(who, token, text, at)
            key = {"A": "a_", "B": "b_"}[who]
            if token is not None:
                self.outcome[key + "token"] = token
            for name, value in data.items():
                if name not in ("waiting", "done", "token"):
                    self.outcome[key + name] = value
            if data.get(flag):
                return

    def report(self, pk: int, stock: int, token: int, orders: int) -> None:
        """Print the final row and whether the fence did its job."""
        from rich.table import Table

        out = self.outcome
        table = Table(title="final row", title_justify="left")
        for column in ("product", "stock", "fence_token", "orders"):
            table.add_column(column, justify="right")
        table.add_row(str(pk), str(stock), str(token), str(orders))
        self.console.print(table)
        b_token = out.get("b_token", 0)
        if out["variant"] == "zombie":
            out["ok"] = (
                out.get("a_write") == "rejected"
                and stock == RESTOCK
                and token == b_token
                and orders == 0
            )
            verdict = (
                f"A's late write was rejected: the row carried B's token {b_token}, newer than "
                f"A's {out.get('a_token')}. B's restock stands and A left no order behind."
            )
        else:
            out["ok"] = (
                out.get("a_write") == "saved"
                and out.get("b_first_write") == "rejected"
                and stock == INITIAL_STOCK - 2
                and orders == 2
            )
            verdict = (
                f"Two sales, stock {INITIAL_STOCK} -> {stock}: A's late write got through (no "
                "newer token was on the row: neither used claim()), and B's write, based on a "
                "read from before A's, was rejected instead of overwriting it. With claim() (the "
                "zombie variant) A's write would have been the rejected one."
            )
        style = "green" if out["ok"] else "bold red"
        self.console.print(f"[{style}]{'OK' if out['ok'] else 'UNEXPECTED'}:[/] {verdict}")
