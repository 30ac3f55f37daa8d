"""The demo commands (``manage.py oversell``, ``zombie`` and ``nightly``) run as real
subprocesses.

Each run gets fresh Redis nodes and a migrated SQLite file of its own; the assertions read the
``--json`` line (the invariants), never the wording.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from django_redlock.testing import RedisNodes

ROOT = Path(__file__).resolve().parent.parent
SMALL = ("--workers", "3", "--attempts", "60", "--stock", "5")


@pytest.fixture(scope="module")
def demo_db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An SQLite file with the testproject's tables."""
    path = tmp_path_factory.mktemp("demo") / "demo.sqlite3"
    manage({"DEMO_SQLITE_PATH": str(path), "REDLOCK_NODES": "redis://127.0.0.1:1/0"}, "migrate")
    return path


@pytest.fixture
def demo_env(demo_db: Path, redis_nodes: RedisNodes) -> dict[str, str]:
    """The environment of a demo command: this test's nodes and the migrated SQLite file."""
    return {"DEMO_SQLITE_PATH": str(demo_db), "REDLOCK_NODES": ",".join(redis_nodes.urls)}


def manage(extra_env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    """Run ``manage.py args`` on testproject's settings; fail the test if it fails."""
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "testproject.settings", **extra_env}
    env.pop("DATABASE_URL", None)
    result = subprocess.run(
        [sys.executable, "manage.py", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    return result


def outcome(env: dict[str, str], *args: str) -> dict[str, Any]:
    """The JSON object on the last line of a demo command's output."""
    result: dict[str, Any] = json.loads(manage(env, *args, "--json").stdout.splitlines()[-1])
    return result


def test_locked_oversell_sells_exactly_the_stock(demo_env: dict[str, str]) -> None:
    """With the lock, 3 processes x 60 attempts on 5 items sell exactly 5, oversell none."""
    out = outcome(demo_env, "oversell", *SMALL)
    assert (out["mode"], out["ok"], out["errors"]) == ("lock", True, 0)
    assert out["sold"] == out["orders"] == out["stock"] == 5
    assert (out["oversold"], out["final_stock"]) == (0, 0)
    assert out["sold"] + out["busy"] + out["out_of_stock"] == out["attempts"] == 60
    assert out["lock_wait_p50_ms"] is not None


def test_unlocked_oversell_reports_what_the_database_holds(demo_env: dict[str, str]) -> None:
    """Without the lock, the reported oversell is the orders beyond the stock, and a run that
    did not oversell says the database serialised the writes."""
    out = outcome(demo_env, "oversell", "--no-lock", *SMALL)
    assert (out["mode"], out["errors"]) == ("no-lock", 0)
    assert out["orders"] == out["sold"] >= 5
    assert out["oversold"] == out["orders"] - 5
    assert out["serialised"] is (out["oversold"] == 0)
    assert out["lock_wait_p50_ms"] is None


def test_zombie_write_is_rejected_by_the_fence(demo_env: dict[str, str]) -> None:
    """A holder frozen by SIGSTOP past its TTL writes after B took over: the database rejects
    it, B's value stands, and the zombie's order was rolled back."""
    out = outcome(demo_env, "zombie", "--ttl", "0.5")
    assert out["ok"] is True
    assert out["a_write"] == "rejected"
    assert out["b_token"] > out["a_token"]
    assert out["final_token"] == out["a_row_token"] == out["b_token"]
    assert (out["final_stock"], out["orders"]) == (50, 0)


def test_race_variant_rejects_the_lost_update(demo_env: dict[str, str]) -> None:
    """Both read without claim(): the stale holder's write lands first, and the newer holder's
    write (based on an older read) is refused, then redone, so both sales count."""
    out = outcome(demo_env, "zombie", "--variant", "race", "--ttl", "0.5")
    assert out["ok"] is True
    assert (out["a_write"], out["b_first_write"]) == ("saved", "rejected")
    assert out["b_bare_guard_would_accept"] is True
    assert (out["final_stock"], out["orders"], out["final_token"]) == (8, 2, out["b_token"])


def test_nightly_job_on_three_servers_runs_once_with_redlock_run(
    demo_env: dict[str, str],
) -> None:
    """Three "servers" start the nightly report at once: three reports without the lock,
    exactly one through `redlock run --skip-busy` (the others exit 0)."""
    unlocked = outcome(demo_env, "nightly", "--no-lock")
    assert (unlocked["reports"], unlocked["exit_statuses"]) == (3, [0, 0, 0])
    locked = outcome(demo_env, "nightly")
    assert (locked["reports"], locked["exit_statuses"]) == (1, [0, 0, 0])


def test_nightly_job_on_three_schedulers_runs_each_tick_once(demo_env: dict[str, str]) -> None:
    """Three "servers" run `redlock scheduler` (every second) and the one running the first
    report is SIGKILLed in the middle of it: every other tick's report is written once, the
    killed run is never run again, no tick twice."""
    out = outcome(demo_env, "nightly", "--scheduler", "--seconds", "5")
    assert out["duplicates"] == 0 and out["runs_started"] == out["ticks"] >= 3, out
    assert out["interrupted"] == [out["killed_tick"]], out
    assert out["reports"] == out["ticks"] - 1


def test_checkout_of_carts_sells_exactly_the_stock_with_lock_many(
    demo_env: dict[str, str],
) -> None:
    """3 processes buy random carts of 2-3 of 3 products (4 each): with lock_many no product is
    oversold, every sale is counted in the stock, no cart is half sold and the carts sell until
    a product is sold out; without the lock, products are oversold."""
    small = ("--workers", "3", "--carts", "60", "--products", "3", "--stock", "4")
    locked = outcome(demo_env, "checkout", *small)
    assert (locked["lock"], locked["errors"], locked["oversold"]) == (True, 0, 0)
    sold, left = locked["sold_each"], locked["final_stock"]
    assert all(s + f == 4 and f >= 0 for s, f in zip(sold, left, strict=True)), locked
    assert 0 in left  # carts sold until a product ran out (the others may be left over)
    assert locked["whole_carts"] is True
    assert locked["sold"] + locked["refused"] + locked["busy"] == 60
    unlocked = outcome(demo_env, "checkout", "--no-lock", *small)
    assert unlocked["errors"] == 0
    assert unlocked["oversold"] > 0, unlocked


# long profile; the guarantee: tests/jobs/test_celery.py::test_two_beat_schedulers_one_run_per_tick
@pytest.mark.slow
def test_nightly_job_with_two_celery_beat_schedulers(demo_env: dict[str, str]) -> None:
    """Two real `celery beat` processes send the nightly report every 2 s to a real prefork
    worker: the plain task runs for each scheduler's send, the LockedTask (lock_min_hold)
    once per tick: about half as many reports."""
    # 8 s: on a loaded machine the schedulers can take seconds to start sending
    unlocked = outcome(demo_env, "nightly", "--celery", "--no-lock", "--seconds", "8")
    locked = outcome(demo_env, "nightly", "--celery", "--seconds", "8")
    assert unlocked["reports"] >= 4, unlocked  # at least two ticks of two schedulers
    assert 1 <= locked["reports"] <= unlocked["reports"] // 2 + 1, (locked, unlocked)
    # ticks: the sends of one scheduler; the plain task ran some ticks twice, the LockedTask
    # once per tick (a second scheduler stopped a moment later may add one tick of its own)
    assert unlocked["reports"] > unlocked["ticks"] >= 2, unlocked
    assert locked["ticks"] >= 2 and locked["reports"] <= locked["ticks"] + 1, locked


def test_pay_charges_once_per_payment_with_the_key(demo_env: dict[str, str]) -> None:
    """``manage.py pay``: answers the client gave up on are sent again; with an
    Idempotency-Key each payment is charged once (the retries replayed or told 409), without
    it the lost answers' payments are charged again."""
    small = ("--payments", "6", "--client-timeout", "0.2")  # 3 slow first calls
    keyed = outcome(demo_env, "pay", *small)
    assert keyed["failed"] == []
    assert keyed["charges"] == keyed["payments"] == 6
    assert keyed["charged_more_than_once"] == 0
    assert keyed["client_timeouts"] > 0 and keyed["replayed"] > 0
    unkeyed = outcome(demo_env, "pay", "--no-key", *small)
    assert unkeyed["failed"] == []
    assert unkeyed["charged_more_than_once"] >= 3  # each slow payment, again by its retry
    assert unkeyed["charges"] >= 9


# long profile; the guarantee: test_eight_processes_missing_at_once_compute_once (tests/cache)
@pytest.mark.slow
def test_stampede_computes_once_with_the_fill(demo_env: dict[str, str]) -> None:
    """``manage.py stampede``: processes missing one cache key at once compute it once with
    ``django_redlock.cache.get_or_set``, once each with Django's ``cache.get_or_set``."""
    small = ("--processes", "4", "--compute", "0.5")
    filled = outcome(demo_env, "stampede", *small)
    assert (filled["computes"], filled["distinct_values"]) == (1, 1)
    plain = outcome(demo_env, "stampede", "--no-fill", *small)
    assert plain["computes"] == 4
