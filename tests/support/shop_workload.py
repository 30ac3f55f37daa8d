"""The shop workload of the fault suites, its worker processes, and oracles that do not use
django-redlock's own code to judge it.

Workload: N products with some stock; W worker processes ("containers") loop until a deadline:
pick a product at random, take ``product:<pk>`` on the alias, ``claim()`` the row, think a
random time, and if there is stock left, decrement it with a guarded ``save()`` and insert an
``Order`` (the append-only purchase log) in the same transaction. Every operation is written
to a per-worker JSON-lines history with ``time.monotonic_ns()`` timestamps (CLOCK_MONOTONIC is
one clock for every process of a Linux machine, so histories of different workers compare).

History lines: ``{"type": "invoke", "op", "pk", "t"}`` then one completion:

- ``ok``: the lease was granted and the block ran to the end (``token``, ``acquired``,
  ``enter``, ``exit``, ``sold``; ``lost`` when leaving the block raised ``LockLost`` after the
  transaction committed: the write is in the database but ran unprotected);
- ``fail``: nothing was written (busy, no quorum, stale token, a database error before commit);
- ``info``: indeterminate (an error while committing);
- ``error``: an exception the library should never let out (a raw redis-py error, ...).

A completion also carries ``sent`` (stamped right before the acquire call: every attempt of
it, the granting one included, went out after that), and a granted one ``shard`` (the name's
shard of a spread cluster alias, else 0) and ``node`` (the ports of the servers that granted
it). ``acquired`` is stamped once the block is entered, so the grant itself happened between
``sent`` and ``acquired``.

Modes: ``fenced`` (lock + claim + guarded save), ``unfenced`` (lock, plain read, then a raw
SQL write in a transaction: the guard disabled) and ``nolock`` (plain read, raw SQL write).
The last two are the negative controls.

Workers live in a pool started once per session (spawning 8 Django processes costs seconds on
a 2-core machine); each run sends every worker a task with the alias settings to use.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import queue
import random
import signal
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

SHOP_ALIAS = "faults"
#: Exceptions a worker may see and still count as a clean "fail": the documented lock errors
#: and database errors. Anything else (redis.exceptions.*, OSError, ...) is an ``error``.
CLEAN_FAILURES = ("LockNotAcquired", "NodesUnavailable", "StaleTokenError")


def now() -> int:
    return time.monotonic_ns()


# -- worker side ---------------------------------------------------------------------------


def _setup(db_name: str) -> None:
    os.environ["DJANGO_SETTINGS_MODULE"] = "tests.settings"
    from django.conf import settings

    settings.DATABASES["default"]["NAME"] = db_name
    import django

    django.setup()


def pool_main(index: int, db_name: str, tasks: Any, results: Any) -> None:
    """A pool worker: configure Django once, then run tasks until told to stop (None)."""
    _setup(db_name)
    results.put(("ready", index, os.getpid()))
    while True:
        task = tasks.get()
        if task is None:
            return
        try:
            summary = _run_task(index, task, results)
        except BaseException as exc:  # reported; the parent fails the run
            summary = {"crash": f"{type(exc).__name__}: {exc}"}
        results.put(("done", index, summary))


def _stop_self(results: Any, index: int) -> None:
    """SIGSTOP this process (the parent sends SIGCONT): a GC pause, swap, a frozen VM."""
    os.kill(os.getpid(), signal.SIGSTOP)


def _run_task(index: int, task: dict[str, Any], results: Any) -> dict[str, Any]:
    from django.conf import settings
    from django.db import connection, connections, transaction

    from django_redlock import locks
    from django_redlock.exceptions import LockLost
    from testproject.inventory.models import Order, Product

    settings.REDLOCK = task["redlock"]
    locks.reset()
    manager = locks[task.get("alias", SHOP_ALIAS)]
    rng = random.Random(task["seed"] * 1000 + index)
    mode: str = task["mode"]
    ttl: float = task["ttl"]
    think: tuple[float, float] = tuple(task["think"])  # type: ignore[assignment]
    zombie: dict[str, Any] | None = task.get("zombie")
    table = Product._meta.db_table
    deadline = time.monotonic() + task["duration"]
    ops = 0
    out = open(task["history"], "w", encoding="utf-8")  # noqa: SIM115 - closed below

    def write(event: dict[str, Any]) -> None:
        out.write(json.dumps(event) + "\n")

    def raw_write(pk: int, stock: int) -> None:
        with connection.cursor() as cursor:
            cursor.execute(f"UPDATE {table} SET stock = %s WHERE id = %s", [stock, pk])

    try:
        while time.monotonic() < deadline:
            ops += 1
            stall = zombie if (zombie and ops == 1) else None
            pk = stall["pk"] if stall else rng.choice(task["pks"])
            pause = rng.uniform(*think)
            write({"type": "invoke", "op": ops, "pk": pk, "t": now()})
            event: dict[str, Any] = {"op": ops, "pk": pk, "w": index}
            phase = "acquire"
            try:
                if mode == "nolock":
                    event["enter"] = now()
                    product = Product.objects.get(pk=pk)
                    time.sleep(pause)
                    event["sold"] = product.stock >= 1
                    if event["sold"]:
                        raw_write(pk, product.stock - 1)
                        Order.objects.create(product_id=pk, quantity=1)
                    event["exit"] = now()
                    event["type"] = "ok"
                elif mode == "cart":
                    phase = "block"
                    event = _sell_cart(manager, rng, task, index, ops, pause, write)
                else:
                    name = f"product:{pk}"
                    event["shard"] = manager.shard_index(name)
                    event["sent"] = now()
                    with manager.lock(name, ttl=ttl, timeout=task["timeout"]) as lease:
                        event["acquired"] = now()
                        event["token"] = lease.token
                        event["node"] = granted_by(lease)
                        phase = "block"
                        in_txn = bool(stall and stall["where"] == "in_txn")
                        if stall and not in_txn:
                            # read (claim) in its own transaction, stall, then write
                            if mode == "fenced":
                                with transaction.atomic():
                                    product = Product.objects.claim(pk=pk)
                            else:
                                product = Product.objects.get(pk=pk)
                            event["enter"] = now()
                            _stop_self(results, index)
                        if not stall and mode != "fenced":
                            # the guard disabled: read, compute, write (as apps often do)
                            product = Product.objects.get(pk=pk)
                            event["enter"] = now()
                        with transaction.atomic():
                            if in_txn or (not stall and mode == "fenced"):
                                if mode == "fenced":
                                    product = Product.objects.claim(pk=pk)
                                else:
                                    product = Product.objects.get(pk=pk)
                                event["enter"] = now()
                            if in_txn:
                                _stop_self(results, index)
                            time.sleep(pause)
                            event["sold"] = product.stock >= 1
                            if event["sold"]:
                                if mode == "fenced":
                                    product.stock -= 1
                                    product.save()
                                else:
                                    raw_write(pk, product.stock - 1)
                                Order.objects.create(product_id=pk, quantity=1)
                            phase = "commit"
                        phase = "committed"
                        event["exit"] = now()
                    event["type"] = "ok"
            except LockLost:
                # raised when leaving the block: the transaction had committed
                event.update(type="ok", lost=True)
                event.setdefault("exit", now())
            except Exception as exc:
                name = type(exc).__name__
                event["error"] = f"{type(exc).__module__}.{name}: {exc}"[:300]
                if phase == "commit" or phase == "committed":
                    event["type"] = "info"
                elif name in CLEAN_FAILURES or _is_db_error(exc):
                    event["type"] = "fail"
                else:
                    event["type"] = "error"
            event["t"] = now()
            write(event)
    finally:
        out.close()
        connections.close_all()
        locks.reset()
    return {"ops": ops, "pid": os.getpid()}


def _sell_cart(
    manager: Any,
    rng: random.Random,
    task: dict[str, Any],
    index: int,
    op: int,
    pause: float,
    write: Callable[[dict[str, Any]], None],
) -> dict[str, Any]:
    """Mode "cart": one unit of each of two products, all or none, under ``lock_many`` and a
    fenced ``claim_many``. Writes the first product's completion through ``write`` and returns
    the second's, each with its own lease's token (so the oracles judge each product). As for
    one product, leaving the block after the transaction committed completes both: ``ok`` and
    ``lost`` on ``LockLost`` (the orders are in the database), ``info`` on another error."""

    from django_redlock.exceptions import LockLost

    pks = rng.sample(task["pks"], 2)
    names = {pk: f"product:{pk}" for pk in pks}
    events = [{"op": op, "pk": pk, "w": index, "sent": now()} for pk in pks]
    committed: list[bool] = []
    try:
        _cart_block(manager, task, pause, names, events, committed)
    except LockLost:
        if not committed:
            raise
        for event in events:
            event.update(type="ok", lost=True, t=now())
            event.setdefault("exit", now())
    except Exception as exc:
        if not committed:
            raise
        for event in events:
            event.update(type="info", error=f"{type(exc).__name__}: {exc}"[:300], t=now())
    write(events[0])
    return events[1]


def _cart_block(
    manager: Any,
    task: dict[str, Any],
    pause: float,
    names: dict[int, str],
    events: list[dict[str, Any]],
    committed: list[bool],
) -> None:
    """The cart's block: the set taken, the rows claimed and sold in one transaction (then
    ``committed`` gets True), the events completed."""
    from django.db import transaction

    from testproject.inventory.models import Order, Product

    with manager.lock_many(list(names.values()), ttl=task["ttl"], timeout=task["timeout"]) as held:
        tokens = {pk: held.leases[name].token for pk, name in names.items()}
        for event in events:
            lease = held.leases[names[event["pk"]]]
            event.update(
                acquired=now(),
                token=tokens[event["pk"]],
                shard=manager.shard_index(lease.name),
                node=granted_by(lease),
            )
        with transaction.atomic():
            rows = Product.objects.claim_many(tokens)
            for event in events:
                event["enter"] = now()
            time.sleep(pause)
            sold = all(row.stock >= 1 for row in rows.values())
            for pk, row in rows.items():
                if sold:
                    row.stock -= 1
                    row.save(fence_token=tokens[pk])
                    Order.objects.create(product_id=pk, quantity=1)
        committed.append(True)
        for event in events:
            event.update(sold=sold, exit=now(), type="ok", t=now())


def granted_by(lease: Any) -> list[int]:
    """The ports of the servers whose grant made ``lease``'s quorum (a cluster node: the
    master its shard's connection was on), read from the engine's connections right after the
    grant; [] when that cannot be told (a test helper, not an API)."""
    try:
        record = lease.record
        links = record.pinned.links
        return [int(links[i]._conn.port) for i in record.voters]
    except Exception:  # a diagnostic only: never let it fail an operation
        return []


def _is_db_error(exc: BaseException) -> bool:
    from django.db import DatabaseError

    return isinstance(exc, DatabaseError)


# -- parent side ---------------------------------------------------------------------------


class WorkerPool:
    """``size`` spawned worker processes that run workload tasks."""

    def __init__(self, size: int, db_name: str) -> None:
        from tests.support.processes import PROCESSES as ctx

        self.size = size
        self.results: Any = ctx.Queue()
        self.tasks: list[Any] = [ctx.Queue() for _ in range(size)]
        self.processes = [
            ctx.Process(target=pool_main, args=(i, db_name, self.tasks[i], self.results))
            for i in range(size)
        ]
        for process in self.processes:
            process.daemon = True
            process.start()
        self.pids: dict[int, int] = {}
        self._pending: list[tuple[Any, ...]] = []
        for _ in range(size):
            kind, index, pid = self.results.get(timeout=120)
            assert kind == "ready", kind
            self.pids[index] = pid

    def close(self) -> None:
        for pid in self.pids.values():
            _signal(pid, signal.SIGCONT)
        for tasks in self.tasks:
            tasks.put(None)
        for process in self.processes:
            process.join(10)
            if process.is_alive():
                process.terminate()
                process.join(5)

    def message(self, kind: str, timeout: float) -> tuple[Any, ...]:
        """The next message of ``kind`` (others are kept for later)."""
        for i, msg in enumerate(self._pending):
            if msg[0] == kind:
                return self._pending.pop(i)
        deadline = time.monotonic() + timeout
        while True:
            msg = self.results.get(timeout=max(0.01, deadline - time.monotonic()))
            if msg[0] == kind:
                return msg  # type: ignore[no-any-return]
            self._pending.append(msg)

    def run(
        self,
        tasks: Sequence[dict[str, Any]],
        during: Callable[[WorkerPool], None] | None = None,
        timeout: float = 90.0,
    ) -> list[dict[str, Any]]:
        """Send one task per worker, run ``during`` (the fault injector), collect summaries."""
        assert len(tasks) <= self.size
        self._pending = []
        for i, task in enumerate(tasks):
            self.tasks[i].put(task)
        try:
            if during is not None:
                during(self)
            summaries: dict[int, dict[str, Any]] = {}
            while len(summaries) < len(tasks):
                _, index, summary = self.message("done", timeout)
                summaries[index] = summary
        finally:
            for i in range(len(tasks)):  # never leave a worker stopped
                _signal(self.pids[i], signal.SIGCONT)
        crashes = [s["crash"] for s in summaries.values() if "crash" in s]
        assert not crashes, crashes
        return [summaries[i] for i in range(len(tasks))]


def _signal(pid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, sig)


def wait_stopped(pid: int, timeout: float = 30.0) -> None:
    """Wait until ``pid`` is in the stopped state (``T`` in /proc/<pid>/stat)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        if state in ("T", "t"):
            return
        time.sleep(0.005)
    raise AssertionError(f"worker {pid} did not stop")


# -- histories and oracles -----------------------------------------------------------------


@dataclass
class History:
    """Every completion of a run, and the counts a report needs."""

    events: list[dict[str, Any]] = field(default_factory=list)
    invokes: int = 0

    @classmethod
    def load(cls, paths: Iterable[Path]) -> History:
        history = cls()
        for path in paths:
            for line in path.read_text(encoding="utf-8").splitlines():
                event = json.loads(line)
                if event["type"] == "invoke":
                    history.invokes += 1
                    invoke_t = event["t"]
                else:
                    event["invoke"] = invoke_t
                    history.events.append(event)
        return history

    def of(self, kind: str) -> list[dict[str, Any]]:
        return [e for e in self.events if e["type"] == kind]

    @property
    def granted(self) -> list[dict[str, Any]]:
        """Operations whose lease was granted (they carry a token)."""
        return [e for e in self.events if "token" in e]

    def summary(self) -> dict[str, Any]:
        counts: dict[str, int] = defaultdict(int)
        for event in self.events:
            counts[event["type"]] += 1
        return {
            "ops": self.invokes,
            **counts,
            "sold": sum(1 for e in self.of("ok") if e.get("sold")),
            "lost": sum(1 for e in self.of("ok") if e.get("lost")),
            "failures": dict(
                Counter(e["error"].split(":")[0].rsplit(".")[-1] for e in self.of("fail"))
            ),
        }


def errors_of(history: History) -> list[str]:
    """Exceptions the library must never let out (raw redis-py errors and the like)."""
    return [e["error"] for e in history.of("error")]


def conservation_anomalies(initial: dict[int, int], history: History | None = None) -> list[str]:
    """Stock conservation from the database alone: initial - stock == orders, stock >= 0;
    and the purchase log agrees with what the workers saw commit."""
    from testproject.inventory.models import Order, Product

    anomalies = []
    stocks = dict(Product.objects.filter(pk__in=initial).values_list("pk", "stock"))
    orders: dict[int, int] = defaultdict(int)
    for product_id in Order.objects.filter(product_id__in=initial).values_list(
        "product_id", flat=True
    ):
        orders[product_id] += 1
    for pk, start in initial.items():
        if stocks[pk] < 0:
            anomalies.append(f"product {pk}: negative stock {stocks[pk]}")
        if start - stocks[pk] != orders[pk]:
            anomalies.append(
                f"product {pk}: {start} - {stocks[pk]} in stock != {orders[pk]} orders"
            )
    if history is not None:
        ok_sold = sum(1 for e in history.of("ok") if e.get("sold"))
        maybe = len(history.of("info"))
        total = sum(orders.values())
        if not ok_sold <= total <= ok_sold + maybe:
            anomalies.append(f"{total} orders but {ok_sold} acknowledged sales (+{maybe} unsure)")
    return anomalies


def purchase_log_anomalies(pks: Iterable[int]) -> list[str]:
    """Per product, the orders (by insertion id) carry strictly increasing fence tokens."""
    from testproject.inventory.models import Order

    anomalies = []
    for pk in pks:
        tokens = list(Order.objects.filter(product_id=pk).order_by("id").values_list(
            "fence_token", flat=True
        ))  # fmt: skip
        for before, after in itertools.pairwise(tokens):
            if after <= before:
                anomalies.append(f"product {pk}: order token {after} after {before}")
    return anomalies


def token_anomalies(history: History) -> list[str]:
    """Per name: no duplicate tokens, and real-time order: if A's lease was granted before B
    was invoked, A's token is smaller than B's."""
    anomalies = []
    by_pk: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for event in history.granted:
        by_pk[event["pk"]].append(event)
    for pk, events in by_pk.items():
        tokens = [e["token"] for e in events]
        if len(set(tokens)) != len(tokens):
            dupes = sorted({t for t in tokens if tokens.count(t) > 1})
            anomalies.append(f"product {pk}: duplicate tokens {dupes[:5]}")
        granted = sorted(events, key=lambda e: e["acquired"])
        invoked = sorted(events, key=lambda e: e["invoke"])
        best = -1
        best_event: dict[str, Any] | None = None
        i = 0
        for event in invoked:
            while i < len(granted) and granted[i]["acquired"] < event["invoke"]:
                if granted[i]["token"] > best:
                    best, best_event = granted[i]["token"], granted[i]
                i += 1
            if best >= event["token"]:
                anomalies.append(
                    f"product {pk}: token {event['token']} invoked after token {best} was "
                    f"granted (op {best_event and best_event['op']})"
                )
    return anomalies


def overlap_anomalies(history: History) -> list[str]:
    """Per name, critical sections [enter, exit] of granted leases never overlap."""
    anomalies = []
    by_pk: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for event in history.granted:
        if "enter" in event and "exit" in event:
            by_pk[event["pk"]].append(event)
    for pk, events in by_pk.items():
        events.sort(key=lambda e: e["enter"])
        for before, after in itertools.pairwise(events):
            if after["enter"] < before["exit"]:
                anomalies.append(
                    f"product {pk}: token {after['token']} entered "
                    f"{(before['exit'] - after['enter']) / 1e6:.1f} ms before token "
                    f"{before['token']} left"
                )
    return anomalies


def lock_keys(clients: Sequence[Any], prefix: str) -> list[str]:
    """Lock keys of the alias on the given nodes: not the permanent fence hash, nor the
    engine's short-lived ``__``-prefixed helpers (waiting markers, wake-up lists: lock names
    may not start with ``__``)."""
    found = []
    for client in clients:
        for key in client.scan_iter(match=prefix.replace("*", r"\*") + "*", count=500):
            text = key.decode() if isinstance(key, bytes) else key
            if not text[len(prefix) :].startswith("__"):
                found.append(text)
    return found


def wait_no_lock_keys(clients: Sequence[Any], prefix: str, within: float) -> list[str]:
    """Poll until no lock key of ``prefix`` is left (or ``within`` seconds pass)."""
    deadline = time.monotonic() + within
    while True:
        left = lock_keys(clients, prefix)
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.05)


def drain(q: Any) -> None:
    while True:
        try:
            q.get_nowait()
        except queue.Empty:
            return
