"""``lease.once(key)``: the effect ledger against real redis-server nodes and the database.

``transaction=True``: a begin inside a transaction is committed on a connection of its own,
which must see (and be seen by) the test's writes."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable

import pytest
from django.core.management import call_command
from django.db import connection, transaction
from django.test import Client

from django_redlock import lock, locks
from django_redlock.effects import ledger
from django_redlock.exceptions import LockError, LockLost, StaleTokenError
from django_redlock.locking.manager import LockManager
from django_redlock.models import Effect
from django_redlock.testing import RedisNodes

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_new_effect_is_pending_then_done(unique_name: str) -> None:
    with lock(unique_name) as lease, lease.once(f"charge:{unique_name}") as effect:
        assert (effect.pending, effect.interrupted, effect.done) == (True, False, False)
        assert effect.attempts == 1
        row = Effect.objects.get(key=f"charge:{unique_name}")
        assert (row.state, row.token, row.lock_name) == ("begun", lease.token, unique_name)
    row.refresh_from_db()
    assert (row.state, row.token) == ("done", lease.token)
    assert row.done_at is not None
    with lock(unique_name) as later, later.once(f"charge:{unique_name}") as effect:
        assert (effect.done, effect.pending, effect.interrupted) == (True, False, False)
    row.refresh_from_db()
    assert (row.state, row.token) == ("done", lease.token)  # a done effect is left as it is


def test_a_block_that_raised_leaves_it_interrupted(unique_name: str) -> None:
    key = f"mail:{unique_name}"
    with pytest.raises(RuntimeError), lock(unique_name) as lease, lease.once(key):
        raise RuntimeError("the SMTP server hung up")
    assert Effect.objects.get(key=key).state == "begun"
    with lock(unique_name) as lease, lease.once(key) as effect:
        assert (effect.pending, effect.interrupted, effect.done) == (True, True, False)
        assert effect.attempts == 2
    assert Effect.objects.get(key=key).state == "done"


def test_done_is_written_in_the_callers_transaction(unique_name: str) -> None:
    """A rollback of the caller's transaction takes "done" with it, and the begin stays
    (committed on its own connection): the next holder sees the effect interrupted."""
    key = f"ship:{unique_name}"
    with pytest.raises(RuntimeError), lock(unique_name) as lease, transaction.atomic():
        with lease.once(key) as effect:
            assert effect.pending
        assert Effect.objects.get(key=key).state == "done"  # inside the transaction
        raise RuntimeError("a later step of the transaction failed")
    assert Effect.objects.get(key=key).state == "begun"
    with lock(unique_name) as lease, lease.once(key) as effect:
        assert effect.interrupted


def test_a_committed_transaction_keeps_it_done(unique_name: str) -> None:
    key = f"ship:{unique_name}"
    with lock(unique_name) as lease, transaction.atomic(), lease.once(key):
        pass
    assert Effect.objects.get(key=key).state == "done"


class Zombie:
    """A holder in a thread of its own: takes the lock (TTL 0.3 s), begins the effect, and
    finishes its block only when told to, long after its lease ran out."""

    def __init__(self, name: str, key: str) -> None:
        self.began = threading.Event()
        self.go = threading.Event()
        self.token = 0
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, args=(name, key))
        self._thread.start()
        assert self.began.wait(10)
        time.sleep(0.4)  # its lease runs out

    def _run(self, name: str, key: str) -> None:
        lease = locks["default"].acquire(name, ttl=0.3)
        self.token = lease.token
        try:
            with lease.once(key):
                self.began.set()
                self.go.wait(10)
        except BaseException as exc:
            self.error = exc
        finally:
            lease.release()
            connection.close()

    def finish(self) -> BaseException | None:
        self.go.set()
        self._thread.join(10)
        return self.error


def test_a_zombies_late_completion_is_refused(unique_name: str) -> None:
    """The holder whose lease ran out finishes after a newer holder began the effect: its
    completion raises StaleTokenError and writes nothing."""
    key = f"pay:{unique_name}"
    zombie = Zombie(unique_name, key)
    with lock(unique_name) as newer, newer.once(key) as effect:
        assert effect.interrupted
        assert newer.token > zombie.token
        assert isinstance(zombie.finish(), StaleTokenError)
        row = Effect.objects.get(key=key)
        assert (row.state, row.token) == ("begun", newer.token)
    assert Effect.objects.get(key=key).state == "done"


def test_a_zombie_completing_after_the_newer_holder_is_refused(unique_name: str) -> None:
    key = f"pay:{unique_name}"
    zombie = Zombie(unique_name, key)
    with lock(unique_name) as newer, newer.once(key):
        pass
    assert isinstance(zombie.finish(), StaleTokenError)
    row = Effect.objects.get(key=key)
    assert (row.state, row.token) == ("done", newer.token)


def test_a_stale_holder_cannot_begin(unique_name: str) -> None:
    """A begin under a token older than the effect's last holder's is refused by the
    database (a holder paused between its own validity check and the write)."""
    key = f"pay:{unique_name}"
    with lock(unique_name) as older:
        pass
    with lock(unique_name) as newer, newer.once(key):
        pass
    Effect.objects.filter(key=key).update(state="begun")  # as if the newer one was killed
    holder = ledger.Holder("default", unique_name, older.token)
    with pytest.raises(StaleTokenError):
        ledger.begin(key, holder, "default")
    with pytest.raises(StaleTokenError):
        ledger.complete(key, holder, "default")
    assert Effect.objects.get(key=key).token == newer.token


def test_a_cancelled_async_entry_leaves_the_effect_closed_under_the_lease(
    unique_name: str,
) -> None:
    """``async with lease.once(key)`` cancelled while it enters (its begin runs in a worker
    thread, which the cancellation cannot stop): the key is not left marked open under the
    lease, so the next ``once(key)`` under it enters (it used to raise "already open" for the
    rest of the lease). The cancelled begin is seen interrupted, as any block that did not end."""

    async def scenario() -> None:
        async with locks["default"].alock(unique_name) as lease:

            async def enter(key: str) -> None:
                async with lease.once(key):
                    raise AssertionError("the body of a cancelled entry ran")

            for round_ in range(5):
                key = f"cancelled:{unique_name}:{round_}"
                task = asyncio.ensure_future(enter(key))
                await asyncio.sleep(0)  # the begin is in the worker thread now
                task.cancel()
                with pytest.raises(asyncio.CancelledError):
                    await task
                async with lease.once(key) as effect:
                    assert effect.pending

    asyncio.run(scenario())


def test_async_with_under_alock(unique_name: str) -> None:
    asyncio.run(_async_effect(unique_name))
    assert Effect.objects.get(key=f"report:{unique_name}").state == "done"


async def _async_effect(unique_name: str) -> None:
    key = f"report:{unique_name}"
    async with locks["default"].alock(unique_name) as lease, lease.once(key) as effect:
        assert effect.pending
    async with locks["default"].alock(unique_name) as lease, lease.once(key) as effect:
        assert effect.done


def test_a_lease_from_acquire(unique_name: str) -> None:
    lease = locks["default"].acquire(unique_name)
    try:
        with lease.once(f"k:{unique_name}") as effect:
            assert effect.pending
    finally:
        lease.release()
    assert Effect.objects.get(key=f"k:{unique_name}").state == "done"


@pytest.mark.parametrize(
    ("key", "error", "match"),
    [
        (None, TypeError, "must be a str"),
        (b"bytes", TypeError, "must be a str"),
        ("", ValueError, "1 to 255"),
        ("x" * 256, ValueError, "1 to 255"),
        ("\ud800", ValueError, "valid text"),
    ],
)
def test_bad_keys_are_refused_before_anything_is_written(
    unique_name: str, key: object, error: type[Exception], match: str
) -> None:
    with lock(unique_name) as lease, pytest.raises(error, match=match):
        lease.once(key)  # type: ignore[arg-type]
    assert not Effect.objects.exists()


def test_a_released_or_lost_lease_cannot_begin(unique_name: str) -> None:
    lease = locks["default"].acquire(unique_name)
    lease.release()
    with pytest.raises(LockError, match="already released"):
        lease.once("k").__enter__()
    short = locks["default"].acquire(unique_name, ttl=0.2)
    time.sleep(0.3)
    with pytest.raises(LockLost):
        short.once("k").__enter__()
    short.release()
    assert not Effect.objects.exists()


def test_a_shared_lease_is_refused(unique_name: str) -> None:
    with locks["default"].semaphore(unique_name, 2) as permit, pytest.raises(TypeError):
        permit.once("k")


def test_an_effect_cannot_run_inside_itself(unique_name: str) -> None:
    with lock(unique_name) as lease, lease.once("k"), pytest.raises(LockError, match="open"):
        lease.once("k").__enter__()
    assert Effect.objects.get(key="k").state == "done"
    with lock(unique_name) as lease, lease.once("k2"), lease.once("k3"):  # other keys: fine
        pass


def test_an_effect_keeps_to_one_alias(
    unique_name: str,
    session_nodes: RedisNodes,
    redlock_alias: Callable[..., LockManager],
) -> None:
    other = redlock_alias(session_nodes)
    with lock(unique_name) as lease, lease.once("shared-key"):
        pass
    with other.lock(unique_name) as lease, pytest.raises(LockError, match="alias"):
        lease.once("shared-key").__enter__()


def test_manage_py_redlock_effects_lists_them(
    unique_name: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with lock(unique_name) as lease, lease.once("done-one"):
        pass
    with pytest.raises(RuntimeError), lock(unique_name) as lease, lease.once("cut-one"):
        raise RuntimeError
    call_command("redlock", "effects")
    out = capsys.readouterr().out
    assert "done-one" in out and "cut-one" in out and "KEY" in out
    call_command("redlock", "effects", "--pending")
    out = capsys.readouterr().out
    assert "cut-one" in out and "done-one" not in out
    call_command("redlock", "effects", "--json")
    assert '"state": "done"' in capsys.readouterr().out


def test_the_admin_lists_effects_read_only(unique_name: str, admin_client: Client) -> None:
    with lock(unique_name) as lease, lease.once(f"admin:{unique_name}"):
        pass
    page = admin_client.get("/admin/django_redlock/effect/")
    assert page.status_code == 200
    assert f"admin:{unique_name}" in page.content.decode()
    assert admin_client.get("/admin/django_redlock/effect/add/").status_code == 403


def test_an_effect_done_earlier_in_the_same_transaction_is_done(unique_name: str) -> None:
    """Its row is locked by this transaction: the begin must not wait for it on another
    connection (that wait would never end). SQLite's writer lock is covered by the docs."""
    if connection.vendor == "sqlite":
        pytest.skip("PostgreSQL row locks; on SQLite the begin is refused (docs/effects.md)")
    key = f"twice:{unique_name}"
    with lock(unique_name) as lease, transaction.atomic():
        with lease.once(key) as first:
            assert first.pending
        with lease.once(key) as second:
            assert second.done
    assert Effect.objects.get(key=key).state == "done"
