"""Every kind can be force-released by an operator, audited: read leases of a read-write lock
included (``redlock release``, ``redlock clear``, the admin action), and listings name the
kinds ``lock``, ``semaphore``, ``read`` and ``write``."""

from __future__ import annotations

import json
from io import StringIO

import pytest
from django.contrib.admin.models import DELETION, LogEntry
from django.core.management import call_command
from django.test import Client
from django.urls import reverse

from django_redlock import inspection, locks
from django_redlock import inspection as inspect
from django_redlock.exceptions import LockError, LockLost, LockNotAcquired
from django_redlock.locking.lease import Lease

pytestmark = pytest.mark.django_db
RELEASE = "admin:django_redlock_lock_release"


def run(*args: str) -> str:
    out = StringIO()
    call_command("redlock", *args, stdout=out, stderr=StringIO())
    return out.getvalue()


def readers_of(alias: str, name: str, count: int) -> list[Lease]:
    return [locks[alias].acquire(name, ttl=30, timeout=0, rw="read") for _ in range(count)]


def assert_evicted(alias: str, name: str, readers: list[Lease]) -> None:
    """The readers lost their leases: a renewal raises ``LockLost`` (and never marks the name
    "readers" again over the writer that comes next), a release says it was not held."""
    writer = locks[alias].acquire(name, ttl=5, timeout=0, rw="write")
    for reader in readers:
        with pytest.raises(LockLost):
            reader.extend(30)
        assert reader.release() is False
    with pytest.raises(LockNotAcquired):  # the writer still excludes readers
        locks[alias].acquire(name, timeout=0, rw="read")
    assert writer.token > max(reader.token for reader in readers)
    assert writer.release() is True


@pytest.mark.parametrize("alias", ["default", "five"])
def test_listing_names_the_four_kinds(alias: str, unique_name: str) -> None:
    """``list --json`` and the table say ``lock``, ``semaphore``, ``read``, ``write``: a write
    lease is no longer listed as a plain lock."""
    manager = locks[alias]
    held = [
        manager.acquire(f"{unique_name}:a-lock", ttl=30, timeout=0),
        manager.acquire(f"{unique_name}:b-sem", ttl=30, timeout=0, permits=2),
        *readers_of(alias, f"{unique_name}:c-read", 2),
        manager.acquire(f"{unique_name}:d-write", ttl=30, timeout=0, rw="write"),
    ]
    try:
        rows = json.loads(run("list", "--using", alias, "--prefix", unique_name, "--json"))
        assert [row["kind"] for row in rows] == ["lock", "semaphore", "read", "write"]
        assert [len(row["holders"]) for row in rows] == [1, 1, 2, 1]
        table = run("list", "--using", alias, "--prefix", unique_name).splitlines()
        kinds = [line.split("  ")[-1].strip() for line in table[1:]]
        assert kinds == ["lock", "semaphore 1/2 permits", "read: 2 readers", "write"]
        assert "write" in run("show", f"{unique_name}:d-write", "--using", alias)
    finally:
        for lease in held:
            lease.release()


@pytest.mark.parametrize("alias", ["default", "five"])
def test_release_evicts_every_reader(alias: str, unique_name: str) -> None:
    """``redlock release NAME`` on a name held by readers releases every read lease on every
    node (the fence advances, a waiter is woken); no reader can renew afterwards."""
    readers = readers_of(alias, unique_name, 3)
    out = run("release", unique_name, "--using", alias)
    total = len(locks[alias].config.nodes)
    assert f"Released the 3 read leases of {unique_name!r}" in out and f"{total}/{total}" in out
    assert inspect.get_lock(alias, unique_name) == (None, [])
    assert_evicted(alias, unique_name, readers)


def test_a_write_lease_is_released_as_a_write_lease(unique_name: str) -> None:
    """``release`` of a write lease names it as one; readers may come in afterwards."""
    writer = locks["multi"].acquire(unique_name, ttl=30, timeout=0, rw="write")
    out = run("release", unique_name, "--using", "multi")
    assert f"Released write lease {unique_name!r}" in out and "3/3" in out
    assert writer.release() is False
    reader = locks["multi"].acquire(unique_name, ttl=5, timeout=0, rw="read")
    assert reader.token > writer.token
    assert reader.release() is True


def test_readers_that_changed_are_left_alone(unique_name: str) -> None:
    """A release naming the readers listed (their ``lease_id``) is refused, and releases
    nothing, once another reader has joined them."""
    readers = readers_of("multi", unique_name, 2)
    info, _ = inspect.get_lock("multi", unique_name)
    assert info is not None and info.kind == "read"
    readers += readers_of("multi", unique_name, 1)
    with pytest.raises(inspection.HolderChanged):
        inspection.force_release("multi", unique_name, info.token, info.lease_id)
    for reader in readers:
        reader.extend(30)  # still held
        assert reader.release() is True


def test_clear_releases_every_kind_and_counts_them(unique_name: str) -> None:
    """``clear --yes`` releases locks, semaphores, read leases and write leases, and its count
    is what it released."""
    manager = locks["five"]
    readers = readers_of("five", f"{unique_name}:read", 3)
    others = [
        manager.acquire(f"{unique_name}:lock", ttl=30, timeout=0),
        manager.acquire(f"{unique_name}:sem", ttl=30, timeout=0, permits=3),
        manager.acquire(f"{unique_name}:sem", ttl=30, timeout=0, permits=3),
        manager.acquire(f"{unique_name}:write", ttl=30, timeout=0, rw="write"),
    ]
    out = run("clear", "--using", "five", "--prefix", f"{unique_name}:", "--yes")
    assert "Released 4 lock(s)." in out
    assert json.loads(run("list", "--using", "five", "--prefix", unique_name, "--json")) == []
    assert [lease.release() for lease in others] == [False] * 4
    assert_evicted("five", f"{unique_name}:read", readers)


def test_admin_force_releases_read_leases_audited(admin_client: Client, unique_name: str) -> None:
    """The admin action lists the readers on its confirmation page, releases every read
    lease, and records a ``LogEntry`` like the other kinds."""
    readers = readers_of("multi", unique_name, 2)
    info, _ = inspect.get_lock("multi", unique_name)
    assert info is not None
    value = json.dumps(["multi", unique_name, info.token, info.lease_id])
    page = admin_client.post(reverse(RELEASE), {"selected": value}).content.decode()
    assert "read: 2 readers" in page and "every read lease will be released" in page
    done = admin_client.post(reverse(RELEASE), {"selected": value, "post": "yes"}, follow=True)
    assert "Force-released the 2 read leases of" in done.content.decode()
    entry = LogEntry.objects.get()
    assert entry.action_flag == DELETION and entry.object_id == f"multi:{unique_name}"
    assert "read leases" in entry.change_message and "on 3 of 3 nodes" in entry.change_message
    assert_evicted("multi", unique_name, readers)


def test_a_read_row_names_its_readers_by_fingerprint(unique_name: str) -> None:
    """A listed read row carries the readers' fingerprint as ``lease_id`` (it changes when a
    reader comes or goes) and no owner of its own."""
    readers = readers_of("default", unique_name, 2)
    try:
        first, _ = inspect.get_lock("default", unique_name)
        assert first is not None and (first.kind, first.token, first.owner) == ("read", 0, "")
        readers[0].release()
        second, _ = inspect.get_lock("default", unique_name)
        assert second is not None and second.lease_id != first.lease_id
    finally:
        for reader in readers:
            reader.release()


@pytest.mark.parametrize("alias", ["default", "five"])
def test_force_release_of_a_semaphore_name_alone_is_refused(alias: str, unique_name: str) -> None:
    """``LockManager.force_release(name)`` on a semaphore's name raises ``ValueError`` and
    deletes nothing: it used to delete the marker only, so the permits (keys of their own)
    stayed valid and a plain lock was granted beside them. ``inspection.force_release``
    releases the permits, then the name."""
    manager = locks[alias]
    permit = manager.acquire(unique_name, ttl=30, timeout=0, permits=2)
    with pytest.raises(ValueError, match="semaphore's name"):
        manager.force_release(unique_name)
    permit.extend(30)  # still valid
    with pytest.raises(LockError):  # the name is still the semaphore's
        manager.acquire(unique_name, ttl=5, timeout=0)
    deleted, info = inspection.force_release(alias, unique_name)
    assert deleted >= 1 and info.kind == "semaphore"
    with pytest.raises(LockLost):
        permit.extend(30)
    lock = manager.acquire(unique_name, ttl=5, timeout=0)
    assert lock.token > permit.token
    assert lock.release() is True
