"""What the tombstone check costs a FencedModel insert, and the tombstone a delete.

One thread, one lease, a real redis-server node; the cases take turns op by op (this VM's
speed drifts between blocks of operations) and each prints its median time per operation:

* insert without a lease (plain Django: the baseline);
* insert under a lease, a model whose only unique key is its auto pk (no lookup);
* insert under a lease, a model with a unique field (INSERT + one indexed tombstone lookup,
  in one transaction: in autocommit mode that transaction is new, BEGIN and COMMIT included);
* the same two inserts (no lease / a lease) inside ``atomic()``, where the check adds only
  its lookup;
* delete under a lease of each (stamp, SELECT of the keys, DELETE, tombstone upsert).

    .venv/bin/python benchmarks/fence_inserts.py [--ops 2000] [--tombstones 100000]
    DATABASE_URL=postgres://root@127.0.0.1:5432/test .venv/bin/python benchmarks/fence_inserts.py

SQLite (a file in a temporary directory, on /dev/shm where there is one, so that the numbers
are the SQL's and not the disk's fsync) unless ``DATABASE_URL`` is set; on PostgreSQL the
tables are created in a scratch database ``<name>_fence_bench`` and dropped at the end.
``--tombstones`` first fills the tombstone table with that many rows (the lookup is by primary
key, so its cost should not grow with them).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def database(url: str | None, directory: str) -> dict[str, Any]:
    """``DATABASES['default']``: SQLite in ``directory``, or the PostgreSQL server of ``url``."""
    if not url:
        return {"ENGINE": "django.db.backends.sqlite3", "NAME": f"{directory}/bench.sqlite3"}
    parts = urlsplit(url)
    return {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": (parts.path.lstrip("/") or "test") + "_fence_bench",
        "USER": parts.username or "",
        "PASSWORD": parts.password or "",
        "HOST": parts.hostname or "",
        "PORT": str(parts.port or ""),
    }


def setup(node_url: str, db: dict[str, Any]) -> None:
    import django
    from django.conf import settings

    settings.configure(
        INSTALLED_APPS=["django.contrib.contenttypes", "django.contrib.auth", "django_redlock"],
        DATABASES={"default": db},
        REDLOCK={"default": {"NODES": [node_url]}},
        USE_TZ=True,
        DEFAULT_AUTO_FIELD="django.db.models.BigAutoField",
    )
    django.setup()


def median_us(cases: dict[str, Callable[[], Any]], ops: int) -> dict[str, float]:
    """Per case, the median time of one call, microseconds; the cases take turns call by call."""
    times: dict[str, list[float]] = {label: [] for label in cases}
    for _ in range(ops):
        for label, call in cases.items():
            started = time.perf_counter()
            call()
            times[label].append(time.perf_counter() - started)
    return {label: statistics.median(t) * 1e6 for label, t in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ops", type=int, default=2000, help="operations per case")
    parser.add_argument("--tombstones", type=int, default=100_000, help="rows to prefill")
    args = parser.parse_args()

    from django_redlock.testing import RedisNodes

    url = os.environ.get("DATABASE_URL")
    shm = "/dev/shm" if os.path.isdir("/dev/shm") else None  # time the SQL, not the fsync
    with tempfile.TemporaryDirectory(dir=shm) as directory, RedisNodes.start(1) as nodes:
        setup(nodes.urls[0], database(url, directory))
        from django.db import connection

        if connection.vendor == "postgresql":
            create_database(connection.settings_dict)
        try:
            run(args)
        finally:
            connection.close()
            if connection.vendor == "postgresql":
                drop_database(connection.settings_dict)


def _admin_cursor(settings_dict: dict[str, Any], sql: str) -> None:
    import psycopg

    params = {
        "dbname": "postgres",
        "user": settings_dict["USER"],
        "host": settings_dict["HOST"],
        "port": settings_dict["PORT"] or None,
        "password": settings_dict["PASSWORD"] or None,
    }
    with psycopg.connect(autocommit=True, **{k: v for k, v in params.items() if v}) as conn:
        conn.execute(sql)


def create_database(settings_dict: dict[str, Any]) -> None:
    drop_database(settings_dict)
    _admin_cursor(settings_dict, f'CREATE DATABASE "{settings_dict["NAME"]}"')


def drop_database(settings_dict: dict[str, Any]) -> None:
    _admin_cursor(settings_dict, f'DROP DATABASE IF EXISTS "{settings_dict["NAME"]}"')


def run(args: argparse.Namespace) -> None:
    from django.core.management import call_command
    from django.db import connection, models, transaction

    from django_redlock import locks
    from django_redlock.locking import context
    from django_redlock.models import FencedModel

    call_command("migrate", verbosity=0)

    class Plain(FencedModel):  # the only unique key: the auto pk
        value = models.IntegerField(default=0)

        class Meta(FencedModel.Meta):
            app_label = "django_redlock"

    class Keyed(FencedModel):  # a unique field, like a product's sku
        code = models.CharField(max_length=40, unique=True)

        class Meta(FencedModel.Meta):
            app_label = "django_redlock"

    with connection.schema_editor() as editor:
        editor.create_model(Plain)
        editor.create_model(Keyed)
    prefilled = prefill(args.tombstones)

    lease = locks["default"].acquire("bench:fence", ttl=600)
    context.deactivate(lease)

    def leased(call: Callable[[], Any]) -> Callable[[], Any]:
        def run_leased() -> Any:
            entered = context.push(lease)
            try:
                return call()
            finally:
                context.pop(entered)

        return run_leased

    def code() -> str:
        return uuid.uuid4().hex

    def atomic(call: Callable[[], Any]) -> Callable[[], Any]:
        def run_atomic() -> Any:
            with transaction.atomic():
                return call()

        return run_atomic

    inserts = median_us(
        {
            "insert, no lease (plain Django)": lambda: Keyed.objects.create(code=code()),
            "insert under a lease, auto pk only": leased(lambda: Plain.objects.create()),
            "insert under a lease, unique field": leased(lambda: Keyed.objects.create(code=code())),
            "in atomic(): insert, no lease": atomic(lambda: Keyed.objects.create(code=code())),
            "in atomic(): insert under a lease, unique": leased(
                atomic(lambda: Keyed.objects.create(code=code()))
            ),
        },
        args.ops,
    )
    plain = list(Plain.objects.order_by("pk")[: args.ops])
    keyed = list(Keyed.objects.order_by("pk")[: args.ops])
    deletes = median_us(
        {
            "delete under a lease, auto pk only": leased(lambda: plain.pop().delete()),
            "delete under a lease, unique field": leased(lambda: keyed.pop().delete()),
        },
        min(len(plain), len(keyed)),
    )
    lease.release()
    print(
        f"{connection.vendor}, {args.ops} ops per case, {prefilled} tombstones prefilled "
        "(median per operation):"
    )
    for label, value in {**inserts, **deletes}.items():
        print(f"  {label:<42} {value:8.1f} us")


def prefill(count: int) -> int | str:
    """Fill the tombstone table with ``count`` rows (none if this version has no table)."""
    try:
        from django_redlock.models import FenceTombstone  # type: ignore[attr-defined]
    except ImportError:
        return "no table,"
    from django.utils import timezone

    now = timezone.now()
    rows = (
        FenceTombstone(key=uuid.uuid4().hex * 2, model="bench.other", token=1, deleted_at=now)
        for _ in range(count)
    )
    batch: list[Any] = []
    for row in rows:
        batch.append(row)
        if len(batch) == 5000:
            FenceTombstone.objects.bulk_create(batch)
            batch = []
    FenceTombstone.objects.bulk_create(batch)
    return count


if __name__ == "__main__":
    main()
