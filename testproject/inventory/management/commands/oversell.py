"""``manage.py oversell``: many processes buy the last few items, with and without the lock.

Each worker is a real process ("spawn": a fresh interpreter with its own Django, database
connection and Redis connections, like one container of a web app). The workers share one
budget of buy attempts and run :func:`testproject.inventory.purchase.buy`, the same code path a
shop would run per request. They report every attempt on a queue; this process draws the
progress bar and the summary.
"""

from __future__ import annotations

import json
import queue
import time
from argparse import ArgumentParser
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from django.core.management.base import BaseCommand, CommandError
from django.db import connection

from testproject.inventory.demo_run import SPAWN, WorkerProcesses, console_for, recreate_product

PRODUCT_NAME = "Limited edition (oversell demo)"
SOLD, BUSY, OUT_OF_STOCK, ERROR, DONE = "sold", "busy", "out_of_stock", "error", "done"
START_TIMEOUT = 120.0  # seconds for every worker to start and set up Django
IDLE_TIMEOUT = 60.0  # seconds without a single report before the run is declared stuck


def take_attempt(remaining: Any) -> bool:
    """Take one attempt from the shared budget; False once it is spent."""
    with remaining.get_lock():
        if remaining.value <= 0:
            return False
        remaining.value -= 1
        return True


def worker(
    product_id: int,
    use_lock: bool,
    lock_timeout: float,
    remaining: Any,
    start: Any,
    reports: Any,
) -> None:
    """A worker process: wait for the start, buy until the budget is spent.

    Puts ``(outcome, lock_wait_seconds_or_None, error_or_None)`` per attempt, then ``DONE``.
    """
    from django_redlock.exceptions import LockNotAcquired
    from testproject.inventory.purchase import buy

    try:
        start.wait(START_TIMEOUT)
        while take_attempt(remaining):
            waits: list[float] = []
            error = None
            try:
                sold = buy(product_id, use_lock=use_lock, lock_timeout=lock_timeout, waits=waits)
                outcome = SOLD if sold else OUT_OF_STOCK
            except LockNotAcquired:
                outcome = BUSY
            except Exception as exc:  # reported and counted: the summary shows it
                outcome, error = ERROR, f"{type(exc).__name__}: {exc}"
            reports.put((outcome, waits[0] if waits else None, error))
    finally:
        reports.put((DONE, None, None))


def percentile(values: list[float], fraction: float) -> float | None:
    """Nearest-rank percentile of ``values`` (None when empty)."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, -(-len(ordered) * fraction // 1))  # ceil(n * fraction), at least 1
    return ordered[int(rank) - 1]


@dataclass
class Summary:
    """What one run did; also the ``--json`` line."""

    mode: str
    database: str
    workers: int
    attempts: int
    stock: int
    sold: int
    busy: int
    out_of_stock: int
    errors: int
    orders: int
    oversold: int
    final_stock: int
    seconds: float
    sold_out_after_s: float | None
    orders_per_s: float
    attempts_per_s: float
    lock_wait_p50_ms: float | None
    lock_wait_p99_ms: float | None
    serialised: bool
    ok: bool

    def problems(self) -> list[str]:
        """The invariants a locked run broke (empty when it kept them all)."""
        found = []
        if self.oversold:
            found.append(f"oversold by {self.oversold}")
        if self.orders != self.sold:
            found.append(f"{self.orders} orders for {self.sold} sales")
        if self.final_stock != self.stock - self.sold:
            found.append(f"final stock {self.final_stock} != {self.stock} - {self.sold} sold")
        if self.errors:
            found.append(f"{self.errors} attempts failed with an error")
        if self.sold != self.stock and not (self.busy and self.out_of_stock == 0):
            found.append(f"sold {self.sold} of {self.stock}")
        return found


class Command(BaseCommand):
    help = (
        "Reset a product to --stock items and let --workers processes make --attempts buy "
        "attempts on it, with the lock (exactly --stock are sold) or with --no-lock (oversold)."
    )

    def add_arguments(self, parser: ArgumentParser) -> None:
        parser.add_argument(
            "--no-lock", action="store_true", help="Buy with a plain read-check-write."
        )
        parser.add_argument("--workers", type=int, default=5, help="Worker processes (5).")
        parser.add_argument("--attempts", type=int, default=2000, help="Buy attempts (2000).")
        parser.add_argument("--stock", type=int, default=10, help="Items in stock (10).")
        parser.add_argument(
            "--lock-timeout",
            type=float,
            default=None,
            help="Seconds an attempt waits for the busy lock before it is rejected as busy "
            "(default: purchase.LOCK_TIMEOUT, 2; 0 = one try).",
        )
        parser.add_argument(
            "--json",
            nargs="?",
            const="-",
            default=None,
            metavar="PATH",
            help="Also write the counts as JSON: as the last line of the output, or to PATH.",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        from testproject.inventory import purchase

        workers, attempts, stock = options["workers"], options["attempts"], options["stock"]
        if workers < 1 or attempts < 0 or stock < 0:
            raise CommandError("--workers must be >= 1, --attempts and --stock >= 0.")
        use_lock = not options["no_lock"]
        lock_timeout = options["lock_timeout"]
        if lock_timeout is None:
            lock_timeout = purchase.LOCK_TIMEOUT
        console = console_for(self)
        product_id = int(recreate_product(PRODUCT_NAME, stock).pk)
        mode = "with the lock" if use_lock else "WITHOUT the lock (--no-lock)"
        console.print(
            f"[bold]oversell {mode}[/]: {stock} in stock, {attempts} buy attempts from "
            f"{workers} worker processes, {connection.vendor} database"
        )
        counts, waits, errors, seconds, last_sale = self.run_workers(
            console, product_id, use_lock, lock_timeout, workers, attempts
        )
        summary = self.summarise(
            product_id,
            use_lock,
            workers,
            attempts,
            stock,
            counts,
            waits,
            errors,
            seconds,
            last_sale,
        )
        self.report(console, summary, errors, lock_timeout)
        if options["json"] == "-":
            self.stdout.write(json.dumps(asdict(summary)))
        elif options["json"]:
            Path(options["json"]).write_text(json.dumps(asdict(summary)) + "\n")
        if not summary.ok:
            raise CommandError("invariant failed: " + "; ".join(summary.problems()))

    def run_workers(
        self,
        console: Any,
        product_id: int,
        use_lock: bool,
        lock_timeout: float,
        workers: int,
        attempts: int,
    ) -> tuple[Counter[str], list[float], list[str], float, float | None]:
        """Start the workers, show their progress.

        Returns the counts, the lock waits, the errors, the seconds the attempts took and the
        seconds until the last sale (None if nothing was sold).
        """
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn

        remaining = SPAWN.Value("i", attempts)
        start = SPAWN.Barrier(workers + 1)
        reports = SPAWN.Queue()
        processes = WorkerProcesses()
        for _ in range(workers):
            args = (product_id, use_lock, lock_timeout, remaining, start, reports)
            processes.add(worker, *args, daemon=True)
        counts: Counter[str] = Counter()
        waits: list[float] = []
        errors: list[str] = []
        columns = ("{task.description}", BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
        with Progress(*columns, console=console) as progress:
            task = progress.add_task(f"starting {workers} processes", total=attempts)
            processes.start()
            try:
                start.wait(START_TIMEOUT)
            except Exception as exc:
                processes.stop()
                raise CommandError(f"the worker processes did not start: {exc!r}") from exc
            began = time.monotonic()
            last_sale = None
            finished = 0
            while finished < workers:
                try:
                    outcome, wait, error = reports.get(timeout=IDLE_TIMEOUT)
                except queue.Empty:
                    processes.stop()
                    raise CommandError(f"no progress for {IDLE_TIMEOUT:g} s; stopped") from None
                if outcome == DONE:
                    finished += 1
                    continue
                counts[outcome] += 1
                if outcome == SOLD:
                    last_sale = time.monotonic() - began
                if wait is not None:
                    waits.append(wait)
                if error is not None:
                    errors.append(error)
                progress.update(
                    task,
                    advance=1,
                    description=f"sold {counts[SOLD]:>4} · busy {counts[BUSY]:>4} · "
                    f"out of stock {counts[OUT_OF_STOCK]:>5}",
                )
            seconds = time.monotonic() - began
        processes.stop(grace=10)
        return counts, waits, errors, seconds, last_sale

    def summarise(
        self,
        product_id: int,
        use_lock: bool,
        workers: int,
        attempts: int,
        stock: int,
        counts: Counter[str],
        waits: list[float],
        errors: list[str],
        seconds: float,
        last_sale: float | None,
    ) -> Summary:
        """The counts, checked against the database's rows."""
        from testproject.inventory.models import Order, Product

        final = Product.objects.get(pk=product_id)
        orders = Order.objects.filter(product_id=product_id).count()
        p50, p99 = percentile(waits, 0.50), percentile(waits, 0.99)
        summary = Summary(
            mode="lock" if use_lock else "no-lock",
            database=connection.vendor,
            workers=workers,
            attempts=attempts,
            stock=stock,
            sold=counts[SOLD],
            busy=counts[BUSY],
            out_of_stock=counts[OUT_OF_STOCK],
            errors=len(errors),
            orders=orders,
            oversold=max(0, orders - stock),
            final_stock=final.stock,
            seconds=round(seconds, 3),
            sold_out_after_s=None if last_sale is None else round(last_sale, 3),
            orders_per_s=round(orders / last_sale, 1) if last_sale else 0.0,
            attempts_per_s=round(attempts / seconds, 1) if seconds > 0 else 0.0,
            lock_wait_p50_ms=None if p50 is None else round(p50 * 1000, 2),
            lock_wait_p99_ms=None if p99 is None else round(p99 * 1000, 2),
            serialised=False,
            ok=True,
        )
        # Without the lock nothing stops the oversell but the database itself: if it did not
        # happen, the database ran the buyers one at a time (SQLite's single writer lock).
        summary.serialised = not use_lock and orders >= stock and summary.oversold == 0
        summary.ok = not use_lock or not summary.problems()
        return summary

    def report(self, console: Any, s: Summary, errors: list[str], lock_timeout: float) -> None:
        """Print the summary table and what it means."""
        from rich.table import Table

        def ms(value: float | None) -> str:
            return "—" if value is None else f"{value:.1f} ms"

        table = Table(title=f"oversell, {s.mode}, {s.database}", title_justify="left")
        table.add_column("metric")
        table.add_column("value", justify="right")
        oversold_style = "bold red" if s.oversold else "green"
        for metric, value in (
            ("in stock at start", str(s.stock)),
            ("sold (orders)", f"{s.sold} ({s.orders})"),
            ("rejected as busy", str(s.busy)),
            ("out of stock", str(s.out_of_stock)),
            ("errors", str(s.errors)),
            ("oversold", f"[{oversold_style}]{s.oversold}[/]"),
            ("final stock", str(s.final_stock)),
            ("all attempts took", f"{s.seconds:.2f} s"),
            ("attempts/s", f"{s.attempts_per_s:.0f}"),
            (
                "last sale after",
                "—" if s.sold_out_after_s is None else f"{s.sold_out_after_s:.2f} s",
            ),
            ("orders/s (until the last sale)", f"{s.orders_per_s:.1f}"),
            ("lock wait p50", ms(s.lock_wait_p50_ms)),
            ("lock wait p99", ms(s.lock_wait_p99_ms)),
        ):
            table.add_row(metric, value)
        console.print(table)
        for error in sorted(set(errors))[:5]:
            console.print(f"[red]error:[/] {error}", markup=True, soft_wrap=True)
        if s.mode == "lock":
            if s.ok:
                waiting = (
                    f"waited up to {lock_timeout:g} s for the lock before being turned away"
                    if lock_timeout
                    else "that found the lock held was turned away at once (--lock-timeout 0)"
                )
                console.print(
                    f"[green]Exactly {s.sold} sold, none oversold[/]: one buyer at a time held "
                    f"product:<id>, and each sale was fenced by its lease's token. An attempt "
                    f"{waiting}."
                )
            else:
                console.print("[bold red]Invariant failed:[/] " + "; ".join(s.problems()))
            return
        if s.oversold:
            console.print(
                f"[bold red]Oversold by {s.oversold}[/]: {s.orders} orders for {s.stock} items. "
                "Buyers read the same stock, each wrote back its own 'stock - 1', and every one "
                "of them created an order."
            )
        elif s.serialised and s.database == "sqlite":
            console.print(
                f"[yellow]No oversell this time: {s.database} serialised the writes.[/] "
                "SQLite lets one writer in at a time, which hides the race. Rerun on "
                "PostgreSQL: DATABASE_URL=postgres://USER@HOST:5432/DB python manage.py "
                "migrate && DATABASE_URL=... python manage.py oversell --no-lock"
            )
        elif s.serialised:
            console.print(
                "[yellow]No oversell this time[/]: the buyers happened not to overlap. Rerun "
                "with more --workers or --attempts."
            )
        else:
            console.print("Fewer attempts than items: nothing could be oversold.")
