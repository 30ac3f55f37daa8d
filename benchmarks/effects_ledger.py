"""What the effect ledger (``lease.once(key)``, docs/effects.md) costs a lock block: a table,
same run.

One thread, a real redis-server node; the cases take turns call by call and each prints its
median time per block:

* ``with lock(name)`` and a row update inside (the baseline);
* the same with ``lease.once(new key)`` around the update (begin: INSERT, completion: UPDATE);
* the same with a key already done (one SELECT; the block's body is skipped);
* inside ``transaction.atomic()``: the lock block alone, and with ``lease.once(new key)``,
  whose begin is committed on a connection of its own (the committer thread's).

    .venv/bin/python benchmarks/effects_ledger.py [--ops 500]
    DATABASE_URL=postgres://root@127.0.0.1:5432/test .venv/bin/python benchmarks/effects_ledger.py

SQLite (a file on /dev/shm where there is one) unless ``DATABASE_URL`` is set; on PostgreSQL a
scratch database ``<name>_fence_bench`` is created and dropped.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.fence_inserts import (  # noqa: E402
    create_database,
    database,
    drop_database,
    median_us,
    setup,
)


def run(ops: int) -> None:
    from django.core.management import call_command
    from django.db import connection, models, transaction

    from django_redlock import lock

    call_command("migrate", verbosity=0)

    class Counter(models.Model):
        value = models.IntegerField(default=0)

        class Meta:
            app_label = "django_redlock"

        def __str__(self) -> str:
            return str(self.value)

    with connection.schema_editor() as editor:
        editor.create_model(Counter)
    row = Counter.objects.create()
    rows = Counter.objects.filter(pk=row.pk)

    def plain() -> None:
        with lock("bench:effect"):
            rows.update(value=models.F("value") + 1)

    def once_new() -> None:
        with lock("bench:effect") as lease, lease.once(uuid.uuid4().hex) as effect:
            if effect.pending:
                rows.update(value=models.F("value") + 1)

    done_key = uuid.uuid4().hex
    once_new_key = done_key
    with lock("bench:effect") as lease, lease.once(once_new_key):
        pass

    def once_done() -> None:
        with lock("bench:effect") as lease, lease.once(done_key) as effect:
            if effect.pending:
                rows.update(value=models.F("value") + 1)

    def atomic_plain() -> None:
        with lock("bench:effect"), transaction.atomic():
            rows.update(value=models.F("value") + 1)

    def atomic_once() -> None:
        key = uuid.uuid4().hex
        with lock("bench:effect") as lease, transaction.atomic(), lease.once(key) as effect:
            if effect.pending:
                rows.update(value=models.F("value") + 1)

    times = median_us(
        {
            "lock block + update (baseline)": plain,
            "+ once(new key)": once_new,
            "+ once(done key): body skipped": once_done,
            "in atomic(): lock block + update": atomic_plain,
            "in atomic(): + once(new key)": atomic_once,
        },
        ops,
    )
    base, base_atomic = times["lock block + update (baseline)"], times[
        "in atomic(): lock block + update"]  # fmt: skip
    print(f"\n{connection.vendor}, {ops} blocks per case, median per block")
    print(f"{'case':<36} {'µs':>8} {'vs baseline':>12}")
    for label, value in times.items():
        against = base_atomic if label.startswith("in atomic") else base
        print(f"{label:<36} {value:>8.0f} {value / against:>11.2f}x")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ops", type=int, default=500, help="blocks per case")
    args = parser.parse_args()

    from django_redlock.testing import RedisNodes

    url = os.environ.get("DATABASE_URL")
    shm = "/dev/shm" if os.path.isdir("/dev/shm") else None
    with tempfile.TemporaryDirectory(dir=shm) as directory, RedisNodes.start(1) as nodes:
        setup(nodes.urls[0], database(url, directory))
        from django.db import connection

        if connection.vendor == "postgresql":
            create_database(connection.settings_dict)
        try:
            run(args.ops)
        finally:
            connection.close()
            if connection.vendor == "postgresql":
                drop_database(connection.settings_dict)


if __name__ == "__main__":
    main()
